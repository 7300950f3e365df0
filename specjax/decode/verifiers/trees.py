"""Draft trees as verifiers: `TreeVerifier(topology, mode)`, "tree:3,2,1,1".

A tree verifier is a static choice of the decode loop like a chain verifier,
but it changes the whole round, not only the decision: the draft proposes a
static tree (children i.i.d. from q, `mode="iid"`, or without replacement,
`mode="wor"`), the target scores every node in one pass and recursive
rejection sampling keeps one root-to-node path (`specjax.decode.tree`). The
loop runs that round (`specjax.decode.tree_round`) whenever its verifier is a
`TreeVerifier`; gamma is the tree's depth.

Registry strings:
  tree:3,2,1,1          branching per depth, children i.i.d. (SpecInfer)
  tree-wor:3,2,1,1      the same tree, children without replacement (RSD)
  tree:parents=-1,-1,0  a parent array (node i's parent; -1 = the root)

The same tree judged by Traversal Verification: `traversal:3,2,1,1`,
`traversal-wor:3,2,1,1` (`specjax.decode.verifiers.traversal`); node by
node by SpecTr's K-SEQ: `spectr:3,2,1,1` (`specjax.decode.verifiers.kseq`).
Hu et al.'s greedy drafts (the top k - 1 of q and one draw from the rest)
with their own verifier: `greedy-draft:3,1,1`
(`specjax.decode.verifiers.greedy_draft`). Khisti et al.'s canonical
importance-sampling verifier on i.i.d. trees of at most 2 children per node:
`canonical:2,1,1` (`specjax.decode.verifiers.canonical`).
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from typing import ClassVar

import numpy as np

from specjax.decode import tree as tree_lib
from specjax.decode.verifiers import base


@dataclasses.dataclass(frozen=True)
class TreeVerifier(base.Verifier):
  """Exact tree speculation over a static `TreeTopology`.

  Attributes:
    topology: the tree (hashable: one compile per topology).
    mode: "iid" (SpecInfer) or "wor" (RSD, Gumbel-top-k drafting).
  """
  name = "tree"
  topology: tree_lib.TreeTopology = None
  mode: str = "iid"
  # False only in the negative control below.
  update_residual: ClassVar[bool] = True
  # True when, at T = 0 (p one-hot on the target's argmax), the rule keeps
  # the first child equal to the argmax at every level, so that the loop may
  # run `tree.greedy_tree_verify` instead of `verify_tree`. Controls say
  # False: their mistake stays in the compiled program.
  greedy_walk: ClassVar[bool] = True

  def __post_init__(self):
    topology = self.topology
    if isinstance(topology, (tuple, list)) and topology and all(
        isinstance(b, numbers.Integral) and not isinstance(b, (bool, np.bool_))
        and b >= 1 for b in topology):  # numpy ints too, as from_branching
      topology = tree_lib.TreeTopology.from_branching(
          tuple(int(b) for b in topology))
    if not isinstance(topology, tree_lib.TreeTopology):
      raise TypeError("TreeVerifier needs topology=a TreeTopology or a "
                      "branching tuple like (3, 2, 1, 1), got "
                      f"{self.topology!r}.")
    object.__setattr__(self, "topology", topology)
    self._check_mode()

  def _check_mode(self) -> None:
    """Refuses a draft mode this rule cannot judge (`GreedyDraftVerifier`
    takes "greedy" alone)."""
    tree_lib.check_mode(self.mode)

  def check_vocab(self, vocab: int) -> None:
    """Refuses, before tracing, a vocabulary this rule cannot judge at a
    reasonable cost (the loop calls it with the target's; `canonical` caps
    its O(V^2) work). Every vocabulary by default."""
    del vocab

  @property
  def depth(self) -> int:
    """Drafts kept at most per round: the loop's gamma."""
    return self.topology.max_depth

  @property
  def spec(self) -> str:
    prefix = self.name + ("-wor" if self.mode == "wor" else "")
    branching = _branching(self.topology)
    if branching is not None:
      return f"{prefix}:{','.join(map(str, branching))}"
    return f"{prefix}:parents={','.join(map(str, self.topology.parents))}"

  def verify_tree(self, u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                  sample):
    """Keeps one root-to-node path of each row's drafted tree.

    The tree round (`specjax.decode.tree_round`) calls it with the laws of
    the root and every node; a tree verifier with another rule overrides
    it (`TraversalVerifier`).

    Args:
      u_BxN1x2: float32 uniforms `[B, N + 1, 2]`, the row's own.
      p_BxN1xV, q_BxN1xV: float32 `[B, N + 1, V]`: target / draft laws after
        the root (index 0) and after each node i (index i + 1).
      tokens_BxN: int32 `[B, N]`; valid_BxN: bool `[B, N]`.
      sample: the loop's sampler.

    Returns:
      (path_BxD, emitted_BxD1, num_accepted_B), as `tree.tree_verify`.
    """
    return tree_lib.tree_verify(u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN,
                                valid_BxN, self.topology, self.mode, sample,
                                update_residual=self.update_residual)

  def num_uniforms(self, gamma: int) -> int:
    raise TypeError(f"{self.spec!r} judges a draft tree, not a chain: run it "
                    "through speculative_generate(..., verifier=...).")

  def verify(self, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG, sample):
    raise TypeError(f"{self.spec!r} judges a draft tree, not a chain: run it "
                    "through speculative_generate(..., verifier=...).")


@dataclasses.dataclass(frozen=True)
class TreeSkipResidualControl(TreeVerifier):
  """Negative control: a rejected child does not update the residual."""
  name = "tree-skip-residual"
  exact = False
  control = True
  update_residual = False
  greedy_walk = False


def _branching(topology):
  """The branching tuple that builds `topology`, or None (irregular)."""
  branching, frontier = [], [-1]
  while True:
    counts = {len(topology.children(u)) for u in frontier}
    if counts == {0}:
      break
    if len(counts) != 1:
      return None
    branching.append(counts.pop())
    frontier = [k for u in frontier for k in topology.children(u)]
  rebuilt = tree_lib.TreeTopology.from_branching(tuple(branching))
  return tuple(branching) if rebuilt == topology else None


def factory(cls, mode):
  """A registry factory: "1,2" (branching) or "parents=-1,-1,0"."""
  example = f"{cls.name}{'-wor' if mode == 'wor' else ''}:3,2,1,1"

  def build(args):
    if not args:
      raise ValueError(f"a tree verifier needs its branching per depth, e.g. "
                       f"{example!r}, or a parent array, e.g. "
                       f"'{example.split(':')[0]}:parents=-1,-1,0,0'.")
    parents = args[0].startswith("parents=")
    if parents:
      args = [args[0][len("parents="):]] + args[1:]
    # ASCII decimals only: int() also reads "1_0" as 10 and "٣" as 3.
    if not all(re.fullmatch(r"-?[0-9]+", a) for a in args):
      raise ValueError(f"tree verifier arguments must be integers, e.g. "
                       f"{example!r}; got {args!r}.")
    values = tuple(int(a) for a in args)
    topology = (tree_lib.TreeTopology(values) if parents
                else tree_lib.TreeTopology.from_branching(values))
    return cls(topology, mode)
  return build
