"""Traversal Verification of draft trees: "traversal:3,2,1,1" (Weng et al.).

The same static tree round as `TreeVerifier` (the draft proposes a tree,
children i.i.d. or without replacement, the target scores every node in one
pass), judged by Traversal Verification (`specjax.decode.traversal`):
subtrees are judged from the leaves up with block verification's weights
and residuals, so a node whose own token token-level verification would
reject can still be kept when its ancestors had ratios above 1. Exact in
both modes (`specjax.lab.multidraft.traversal_round_law`), and never keeps
fewer drafts than token-level verification of the same tree.

Registry strings:
  traversal:3,2,1,1          branching per depth, children i.i.d.
  traversal-wor:3,2,1,1      children without replacement
  traversal:parents=-1,-1,0  a parent array
  traversal-no-final-residual:2,1   the negative control (not exact)

At T = 0 the rule is the greedy tree walk (a child whose token is not the
argmax gets weight 0, the argmax's child weight 1, and a removal leaves a
weight-1 parent at weight 1), so the loop runs `tree.greedy_tree_verify`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.decode import traversal as traversal_lib
from specjax.decode.verifiers import trees


@dataclasses.dataclass(frozen=True)
class TraversalVerifier(trees.TreeVerifier):
  """Exact Traversal Verification over a static `TreeTopology`.

  Attributes:
    topology: the tree (hashable: one compile per topology).
    mode: "iid" (children i.i.d. from q) or "wor" (without replacement).
  """
  name = "traversal"
  # False only in the negative control below.
  final_residual: ClassVar[bool] = True

  def verify_tree(self, u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                  sample):
    return traversal_lib.traversal_verify(
        u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN, self.topology,
        self.mode, sample, final_residual=self.final_residual)


@dataclasses.dataclass(frozen=True)
class TraversalNoFinalResidualControl(TraversalVerifier):
  """Negative control: a kept node emits its final token from p, not from
  the residual its removed children left (the lab's "no_final_residual")."""
  name = "traversal-no-final-residual"
  exact = False
  control = True
  greedy_walk = False
  final_residual = False
