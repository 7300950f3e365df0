"""Hu et al.'s greedy drafts on trees: "greedy-draft:3,1,1" (ICLR 2025).

The same static tree round as `TreeVerifier` (the target scores every node
in one pass), with the children drafted as Hu et al. ("Towards Optimal
Multi-draft Speculative Decoding") construct their greedy drafts: at a node
with k children, the k - 1 most likely tokens under q (after the sampling
transform, ties: the lower id) and one draw from q without them
(`tree.greedy_children`). Each node is judged by single-draft speculative
sampling of that last draw against p with its own law; a residual token
among the top k - 1 descends into that child (`specjax.decode.greedy_draft`).
Exact, and at every node it reaches the greedy scheme's optimal acceptance
p(T) + sum_{y not in T} min(p(y), q'(y)).

Registry strings:
  greedy-draft:3,1,1              branching per depth (3 children at the
                                  root: its top 2 and one draw; then chains)
  greedy-draft:parents=-1,-1,0    a parent array
  greedy-draft-residual-outside-drafts:3,1   the negative control (not
                                  exact): the lab's "residual_outside_drafts",
                                  the residual drawn only outside the top k - 1

The name. A bare "greedy" would read as greedy decoding (temperature 0,
`specjax.GREEDY`), which this is not: it samples at any temperature, and
only the drafted SET is chosen greedily. "greedy-draft" names what the
paper makes greedy, the draft construction, not the decoding.

At temperature 0 (p one-hot on the argmax a) the rule keeps the last child
iff its token is a, else the residual is one-hot on a and descends into the
child of T equal to a, if any: the first valid child equal to a (the
drafted tokens are distinct), which is the greedy tree walk the loop then
runs (`tree.greedy_tree_verify`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.decode import greedy_draft as greedy_draft_lib
from specjax.decode.verifiers import trees


@dataclasses.dataclass(frozen=True)
class GreedyDraftVerifier(trees.TreeVerifier):
  """Hu et al.'s greedy drafts and their exact verifier over a static
  `TreeTopology`.

  Attributes:
    topology: the tree (hashable: one compile per topology).
    mode: "greedy" only (the draft mode this rule judges).
  """
  name = "greedy-draft"
  mode: str = "greedy"
  # None except in the negative control below.
  greedy_draft_control: ClassVar[bool | None] = None

  def _check_mode(self) -> None:
    if self.mode != "greedy":
      raise ValueError(f"{self.name!r} judges greedy drafts (the top k - 1 "
                       f"of q and one draw from the rest), so mode must be "
                       f"'greedy', got {self.mode!r}.")

  def verify_tree(self, u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                  sample):
    return greedy_draft_lib.greedy_draft_verify(
        u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN, self.topology,
        sample, control=self.greedy_draft_control)


@dataclasses.dataclass(frozen=True)
class GreedyDraftResidualOutsideControl(GreedyDraftVerifier):
  """Negative control: the residual is drawn only outside the top k - 1,
  so a rejected last draft never hands p's mass on T to those children
  (the lab's "residual_outside_drafts")."""
  name = "greedy-draft-residual-outside-drafts"
  exact = False
  control = True
  greedy_walk = False
  greedy_draft_control = True
