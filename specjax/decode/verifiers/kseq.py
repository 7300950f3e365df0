"""SpecTr's K-SEQ on draft trees: "spectr:3,2,1" (Sun et al. 2023).

The same static tree round as `TreeVerifier` with children i.i.d. from q
(the target scores every node in one pass), judged node by node by K-SEQ
(`specjax.decode.kseq`): at the node reached, child j is kept with
probability min(1, p(x_j) / (rho q(x_j))), rho solving SpecTr's equation
for that node's k children, the first kept child is descended into, and a
node that keeps none emits a token from K-SEQ's residual. Exact (the rule is
exact for each node's children given the path; the walk chains them).

Registry strings:
  spectr:3,2,1                  branching per depth (children i.i.d.)
  spectr:parents=-1,-1,0        a parent array
  spectr-wrong-residual:2,1     the negative control (not exact): the lab's
                                "wrong_residual", the residual subtracts one
                                draft's accepted mass, not k drafts'

At T = 0 (p one-hot on the argmax a) beta = min(q(a), 1 / rho), the root
is rho = (1 - (1 - q(a))^k) / q(a) <= 1 / q(a), so the first child equal to
a is kept with probability min(1, 1 / (rho q(a))) = 1, the others with 0,
and the residual is one-hot on a: the greedy tree walk, which the loop then
runs (`tree.greedy_tree_verify`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.decode import kseq as kseq_lib
from specjax.decode.verifiers import trees


@dataclasses.dataclass(frozen=True)
class KSeqVerifier(trees.TreeVerifier):
  """Exact K-SEQ over a static `TreeTopology` of i.i.d. children.

  Attributes:
    topology: the tree (hashable: one compile per topology).
    mode: "iid" only (K-SEQ's guarantee assumes i.i.d. drafts).
  """
  name = "spectr"
  # None except in the negative control below.
  kseq_control: ClassVar[bool | None] = None

  def __post_init__(self):
    super().__post_init__()
    if self.mode != "iid":
      raise ValueError(f"{self.name!r} judges children drawn i.i.d. from q "
                       f"(K-SEQ's guarantee), so mode must be 'iid', got "
                       f"{self.mode!r}.")

  def verify_tree(self, u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                  sample):
    return kseq_lib.kseq_tree_verify(
        u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN, self.topology,
        sample, control=self.kseq_control)


@dataclasses.dataclass(frozen=True)
class KSeqWrongResidualControl(KSeqVerifier):
  """Negative control: the residual subtracts min(q, p / rho), one draft's
  accepted mass, not (1 - (1 - beta)^k) / beta times it (the lab's
  "wrong_residual")."""
  name = "spectr-wrong-residual"
  exact = False
  control = True
  greedy_walk = False
  kseq_control = True
