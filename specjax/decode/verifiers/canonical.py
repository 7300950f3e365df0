"""Khisti et al.'s canonical verifier on trees: "canonical:2,1,1" (ICLR 2025).

The same static tree round as `TreeVerifier` with children i.i.d. from q
(the target scores every node in one pass), judged node by node by the
canonical architecture of Khisti et al. ("Multi-draft speculative sampling:
canonical architectures and theoretical limits"): of a node's two children
one, Z, is selected by importance weights p / q, then judged by
single-draft speculative sampling against p with Z's own law q_Z, exactly
computed in O(V^2) (`specjax.decode.canonical`); a residual token equal to
the other child descends into it. A node of one child is token-level
verification. Exact.

Registry strings:
  canonical:2,1,1               branching per depth, at most 2 (children
                                i.i.d.)
  canonical:parents=-1,-1,0     a parent array
  canonical-draft-law-q:2,1     the negative control (not exact): the lab's
                                "draft_law_q", Z judged with q, not q_Z

Refused before tracing: a node of more than 2 children (q_Z of k > 2
importance-weighted drafts sums over V^(k - 1) tuples) and, in the loop, a
vocabulary above `canonical.MAX_VOCAB` (the V^2 work of q_Z).

At T = 0 (p one-hot on the argmax a) every weight is 0 but w(a): a kept Z
is a, and the residual (p - q_Z)+ is 0 or one-hot on a, whose fallback is
p: the node emits a and descends into the first valid child equal to a,
the greedy tree walk, which the loop then runs (`tree.greedy_tree_verify`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.decode import canonical as canonical_lib
from specjax.decode.verifiers import trees


@dataclasses.dataclass(frozen=True)
class CanonicalVerifier(trees.TreeVerifier):
  """Khisti et al.'s canonical importance-sampling verifier over a static
  `TreeTopology` of i.i.d. children, at most 2 per node.

  Attributes:
    topology: the tree (hashable: one compile per topology).
    mode: "iid" only (q_Z is the law of a draft selected from i.i.d. ones).
  """
  name = "canonical"
  # None except in the negative control below.
  canonical_control: ClassVar[bool | None] = None

  def __post_init__(self):
    super().__post_init__()
    canonical_lib.check_topology(self.topology)

  def _check_mode(self) -> None:
    if self.mode != "iid":
      raise ValueError(f"{self.name!r} selects one of a node's children "
                       f"drawn i.i.d. from q (q_Z is that draft's law), so "
                       f"mode must be 'iid', got {self.mode!r}.")

  def check_vocab(self, vocab: int) -> None:
    canonical_lib.check_vocab(vocab)

  def verify_tree(self, u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                  sample):
    return canonical_lib.canonical_verify(
        u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN, self.topology,
        sample, control=self.canonical_control)


@dataclasses.dataclass(frozen=True)
class CanonicalDraftLawQControl(CanonicalVerifier):
  """Negative control: the selected draft is judged with q, as if it were
  drawn from q, not from its own law q_Z (the lab's "draft_law_q")."""
  name = "canonical-draft-law-q"
  exact = False
  control = True
  greedy_walk = False
  canonical_control = True
