"""Exact draft trees: static topologies, and their verification math in JAX.

A tree round drafts several candidate continuations at once and keeps one
path. The topology is static (one compile per topology):

  `TreeTopology.from_branching((3, 2, 1, 1))`: the root (the last committed
  token) has 3 children, each of those 2, then 1, then 1 (21 nodes);
  `TreeTopology((-1, -1, 0, 0, 1))`: a parent array, node i's parent is
  parents[i] (-1: the root), parents[i] < i (nodes in breadth-first order
  are not required, only topological order).

The children of one node are drafted from the draft's law q at that node,
either i.i.d. (`mode="iid"`) or without replacement (`mode="wor"`, the
Gumbel-top-k trick: draw x_1 ~ q, then x_2 ~ q without x_1, ...). A third
draft mode, `"greedy"` (`DRAFT_MODES`, Hu et al.'s greedy drafts,
`greedy_children`), takes a node's k - 1 most likely tokens under q and one
draw from q without them; it has its own verifier
(`specjax.decode.greedy_draft`), not the recursive rejection sampling below.
Verification walks down from the root; at a node with target law p it runs
recursive rejection sampling over the children in order:

  r = p;  for child j: q_j = q (iid) or q without x_1..x_{j-1}, renormalised
  (wor); keep x_j with probability min(1, r(x_j) / q_j(x_j)) and descend into
  child j; else r <- (r - q_j)+ normalised.  If every child is rejected emit
  one token from r (at a leaf, r = p: the bonus token).

This is SpecInfer's multi-step speculative sampling for i.i.d. children and
RSD's recursive rejection sampling (Jeon et al. 2024, arXiv 2402.14160) for
children drawn without replacement; both are exact, checked by exhaustive
enumeration in `specjax.lab.trees` and by sampling in tests/test_trees.py.
A child drawn where q has no mass left (wor with fewer than k tokens of
positive q) is skipped: it is rejected without changing r.

Model side: `TransformerLM.tree_decode(tokens, cache, depth, ancestor)`
scores every node in ONE pass (tree attention mask from `ancestor_table`,
positions = depth) and `KVCache.move` copies the kept path's entries into the
row's contiguous cache. `speculative_generate(..., verifier="tree:3,2,1,1")`
runs trees inside the compiled loop (`specjax.decode.tree_round`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks

MODES = ("iid", "wor")
# Every way a tree round can draft children: MODES, which recursive
# rejection sampling (`tree_verify`) and traversal judge, and "greedy",
# which only its own verifier judges (`specjax.decode.greedy_draft`).
DRAFT_MODES = MODES + ("greedy",)
# A tree pass scores every node in one forward pass under a static
# (N + 1) x (N + 1) ancestor mask built on the host (256 MiB at this size),
# and the nodes must fit the cache beside the context.
MAX_NODES = 16_384
# Nodes of at most this many children have their children judged in
# unrolled steps; wider ones in a loop (`tree_verify`).
_UNROLL_CHILDREN = 8


@dataclasses.dataclass(frozen=True)
class TreeTopology:
  """A static draft tree: `parents[i]` is node i's parent (-1 = the root).

  Hashable (a static jit argument). Derived, all static numpy / tuples:
    depth[i]: 1 for the root's children; max_depth; children[u] (u = -1 is
    the root) in node order; max_children.
  """
  parents: tuple[int, ...]

  def __post_init__(self):
    parents = tuple(self.parents)
    if not parents:
      raise ValueError("a tree needs at least one node, e.g. parents=(-1,).")
    _check_size(len(parents))
    for i, parent in enumerate(parents):
      if isinstance(parent, bool) or not isinstance(parent, (int, np.integer)):
        raise TypeError(f"parents[{i}] must be an int, got {parent!r}.")
      if not -1 <= parent < i:
        raise ValueError(f"parents[{i}] = {parent}: each parent must be -1 "
                         f"(the root) or an earlier node in [0, {i}).")
    object.__setattr__(self, "parents", tuple(int(p) for p in parents))

  @classmethod
  def from_branching(cls, branching) -> "TreeTopology":
    """Every node at depth d has branching[d] children (depth 0: the root)."""
    branching = tuple(_checks.check_int(f"branching[{d}]", b, low=1)
                      for d, b in enumerate(branching))
    if not branching:
      raise ValueError("branching must name at least one level, e.g. (2, 1).")
    # Nodes per level are the running products: counted before building.
    _check_size(sum(itertools.accumulate(branching, operator.mul)))
    parents, frontier = [], [-1]
    for b in branching:
      level = []
      for u in frontier:
        for _ in range(b):
          parents.append(u)
          level.append(len(parents) - 1)
      frontier = level
    return cls(tuple(parents))

  @property
  def num_nodes(self) -> int:
    return len(self.parents)

  @property
  def depth(self) -> tuple[int, ...]:
    out = []
    for parent in self.parents:
      out.append(1 if parent < 0 else out[parent] + 1)
    return tuple(out)

  @property
  def max_depth(self) -> int:
    return max(self.depth)

  @functools.cached_property
  def _children_of(self) -> dict[int, tuple[int, ...]]:
    # One pass: scanning every node for every node is quadratic in the
    # nodes, and a huge tree must reach the context check that refuses it.
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(self.parents):
      kids.setdefault(parent, []).append(i)
    return {u: tuple(k) for u, k in kids.items()}

  def children(self, node: int) -> tuple[int, ...]:
    """Children of `node` (-1: the root), in node order."""
    return self._children_of.get(node, ())

  @property
  def max_children(self) -> int:
    return max(map(len, self._children_of.values()))

  def ancestor_table(self) -> np.ndarray:
    """bool `[N + 1, N + 1]` over (root, nodes): [t, u] iff u is t or an
    ancestor of t (index 0 is the root, node i is index i + 1): the tree
    attention mask of `TransformerLM.tree_decode`."""
    n = self.num_nodes
    table = np.eye(n + 1, dtype=bool)
    table[:, 0] = True
    for i, parent in enumerate(self.parents):
      if parent >= 0:
        table[i + 1] |= table[parent + 1]
    return table

  def depth_with_root(self) -> np.ndarray:
    """int32 `[N + 1]`: 0 for the root, then each node's depth."""
    return np.array((0,) + self.depth, np.int32)

  def children_table(self) -> np.ndarray:
    """int32 `[N + 1, K]`: row u + 1 lists u's children, -1 padded."""
    table = -np.ones((self.num_nodes + 1, self.max_children), np.int32)
    for u in range(-1, self.num_nodes):
      kids = self.children(u)
      table[u + 1, :len(kids)] = kids
    return table


def _check_size(num_nodes: int) -> None:
  if num_nodes > MAX_NODES:
    raise ValueError(f"a draft tree of {num_nodes:,} nodes is larger than "
                     f"{MAX_NODES:,}: a tree pass scores every node at once "
                     "under an (N + 1) x (N + 1) mask. Use fewer children "
                     "per level or fewer levels.")


def check_mode(mode: str) -> str:
  if mode not in MODES:
    hint = (" Greedy drafts (the top k - 1 of q and one draw from the rest) "
            "have their own verifier: 'greedy-draft:3,1,1'."
            if mode == "greedy" else "")
    raise ValueError(f"mode must be one of {MODES} ('iid': children i.i.d. "
                     f"from q, SpecInfer; 'wor': without replacement, RSD), "
                     f"got {mode!r}.{hint}")
  return mode


def draft_children(u_xK, gumbel_xKxV, q_xV, k: int, mode: str, sample,
                   counts_x=None):
  """k children of one node per row: int32 `[..., k]`, and valid `[..., k]`.

  Leading dims `...` are rows (and, in a tree round, the nodes of a level).
  iid: inverse-CDF draws with `u_xK` (`[..., K]`, K >= k); wor: the k
  largest of log q + Gumbel (`gumbel_xKxV[..., 0, :]`: a draw without
  replacement); a wor child beyond q's support is invalid. The first k of
  k' > k children are the k children, in either mode, for the same draws.
  greedy: `greedy_children` with `u_xK[..., 0]` and each node's own number
  of children `counts_x` (int, broadcast to `...`; default k): unlike the
  other modes its last child depends on that number, so a level whose
  nodes have fewer children than k cannot keep the first ones of k.
  """
  if mode not in DRAFT_MODES:
    raise ValueError(f"mode must be one of {DRAFT_MODES}, got {mode!r}.")
  if mode == "greedy":
    return greedy_children(u_xK[..., 0], q_xV,
                           k if counts_x is None else counts_x, k, sample)
  if mode == "iid":
    tokens_xK = sample(u_xK[..., :k], jnp.broadcast_to(
        q_xV[..., None, :], q_xV.shape[:-1] + (k, q_xV.shape[-1])))
    return tokens_xK.astype(jnp.int32), jnp.ones(tokens_xK.shape, bool)
  logq_xV = jnp.where(q_xV > 0, jnp.log(jnp.where(q_xV > 0, q_xV, 1.0)),
                      -jnp.inf)
  scores_xV = logq_xV + gumbel_xKxV[..., 0, :]
  _, tokens_xK = jax.lax.top_k(scores_xV, k)
  valid_xK = jnp.take_along_axis(q_xV, tokens_xK, axis=-1) > 0
  return tokens_xK.astype(jnp.int32), valid_xK


def greedy_children(u_x, q_xV, counts_x, width: int, sample):
  """Hu et al.'s greedy children of one node per row (`mode="greedy"`).

  A node with k children drafts, in slots 0..k-2, the k - 1 most likely
  tokens under q (the set T; ties: the lower id, as `jax.lax.top_k` and
  `specjax.lab.multidraft.draft_law` order them; the verifier reads T off
  the drafted tokens, so exactness does not hang on the order of ties),
  and in slot k - 1 one inverse-CDF draw (uniform `u_x`) from q' = q
  without T. Slot k - 1 is invalid where q has no mass outside T (the
  lab's empty slot; its token, 0, is never kept), and slots k.. of a
  `width`-wide level are unused (0, invalid). The tokens of T stay valid
  even where q(x) = 0: they are drafted outright, so the target's mass on
  them still counts.

  Args:
    u_x: float32 uniforms `[...]`, one per node.
    q_xV: float32 `[..., V]`, the law the verifier judges (after the
      sampling transform).
    counts_x: int `[...]` (or broadcastable): each node's k, 1 <= k <=
      width (k = 1: no T, one draw from q).
    width: static, the widest node's k (at most V).
    sample: the loop's sampler (reads the total off the CDF, so q' need not
      be normalised; a token of zero mass is never drawn).

  Returns:
    (tokens int32 `[..., width]`, valid bool `[..., width]`).
  """
  width = _checks.check_int("width", width, low=1)
  lead, vocab = q_xV.shape[:-1], q_xV.shape[-1]
  if width > vocab:
    raise ValueError(f"width={width} greedy children need as many distinct "
                     f"tokens, more than the vocabulary ({vocab}).")
  if tuple(u_x.shape) != tuple(lead):
    raise ValueError(f"u_x {tuple(u_x.shape)} must have q's leading shape "
                     f"{tuple(lead)}: one uniform per node.")
  if _checks.is_concrete(counts_x) and not np.all(
      (np.asarray(counts_x) >= 1) & (np.asarray(counts_x) <= width)):
    raise ValueError(f"counts_x must lie in [1, width={width}] (each node's "
                     f"number of children), got {np.asarray(counts_x)}.")
  counts_x = jnp.broadcast_to(jnp.asarray(counts_x, jnp.int32), lead)
  slot_W = jnp.arange(width)
  in_t_xW1 = slot_W[:width - 1] < counts_x[..., None] - 1
  if width > 1:
    _, top_xW1 = jax.lax.top_k(q_xV, width - 1)
    # q without T: a scatter per row (a `[..., W, V]` one-hot would be W
    # times the level's laws).
    flat_q_RxV = q_xV.reshape(-1, vocab)
    rows_R1 = jnp.arange(flat_q_RxV.shape[0])[:, None]
    rest_xV = flat_q_RxV.at[rows_R1, top_xW1.reshape(-1, width - 1)].multiply(
        jnp.where(in_t_xW1, 0.0, 1.0).reshape(-1, width - 1)).reshape(
            q_xV.shape)
  else:  # one child: no T, the draw is from q itself
    top_xW1, rest_xV = jnp.zeros(lead + (0,), jnp.int32), q_xV
  draw_x = sample(u_x, rest_xV).astype(jnp.int32)
  # The mass left is summed over what is left, not 1 - q(T): no
  # cancellation when q is nearly one-hot.
  last_ok_x = (jnp.sum(rest_xV, axis=-1) > 0) & (jnp.take_along_axis(
      rest_xV, draw_x[..., None], axis=-1)[..., 0] > 0)
  is_last_xW = slot_W == counts_x[..., None] - 1
  top_xW = jnp.concatenate([top_xW1.astype(jnp.int32),
                            jnp.zeros(lead + (1,), jnp.int32)], axis=-1)
  in_t_xW = jnp.concatenate([in_t_xW1, jnp.zeros(lead + (1,), bool)],
                            axis=-1)
  tokens_xW = jnp.where(in_t_xW, top_xW,
                        jnp.where(is_last_xW & last_ok_x[..., None],
                                  draw_x[..., None], 0))
  valid_xW = in_t_xW | (is_last_xW & last_ok_x[..., None])
  return tokens_xW.astype(jnp.int32), valid_xW


def tree_verify(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                topology: TreeTopology, mode: str, sample,
                update_residual: bool = True):
  """Recursive rejection sampling down a static tree, vectorised over rows.

  Args:
    u_BxNx2: float32 uniforms, `[B, N + 1, 2]`: [:, i, 0] judges node i,
      [:, u + 1, 1] draws the token emitted when node u (or the root, u =
      -1 -> index 0) keeps none of its children.
    p_BxN1xV, q_BxN1xV: float32 `[B, N + 1, V]`: target / draft laws after
      the root (index 0) and after each node i (index i + 1).
    tokens_BxN: int32 `[B, N]` node tokens; valid_BxN: bool `[B, N]`.
    topology, mode: static.
    sample: the loop's sampler.
    update_residual: static; False is a NEGATIVE CONTROL only (a rejected
      child leaves r unchanged, so later children and the final token are
      judged against p itself): never exact, every exactness test of trees
      must reject it.

  Returns:
    (path_BxD int32 `[B, D]`: kept node ids per depth, -1 past the end;
     emitted_BxD1 int32 `[B, D + 1]`: the kept tokens then the final token;
     num_accepted_B int32 `[B]`).
  """
  mode = check_mode(mode)
  vocab_V = jnp.arange(q_BxN1xV.shape[-1])

  def judge(view):
    width = view.kids_BxK.shape[1]

    def judge_child(j, carry):
      """Judges child slot j of each row's node (the chain of rejections
      that recursive rejection sampling runs)."""
      r_BxV, taken_BxV, chosen_B = carry
      x_B = view.tokens_BxK[:, j]
      if mode == "wor":
        q_j_BxV = residual(jnp.where(taken_BxV, 0.0, view.q_BxV),
                           jnp.zeros_like(view.q_BxV))
      else:
        q_j_BxV = view.q_BxV
      has_B = view.valid_BxK[:, j] & (chosen_B < 0)
      q_x_B = jnp.take_along_axis(q_j_BxV, x_B[:, None], axis=1)[:, 0]
      r_x_B = jnp.take_along_axis(r_BxV, x_B[:, None], axis=1)[:, 0]
      keep_B = has_B & (view.u_BxK[:, j] * q_x_B < r_x_B)
      chosen_B = jnp.where(keep_B, view.kids_BxK[:, j], chosen_B)
      reject_B = has_B & ~keep_B
      if update_residual:
        new_r_BxV = residual(jnp.maximum(r_BxV - q_j_BxV, 0.0), r_BxV)
        r_BxV = jnp.where(reject_B[:, None], new_r_BxV, r_BxV)
      if mode == "wor":
        taken_BxV = taken_BxV | (reject_B[:, None]
                                 & (vocab_V == x_B[:, None]))
      return r_BxV, taken_BxV, chosen_B

    carry = (view.p_BxV, jnp.zeros(view.q_BxV.shape, bool),
             -jnp.ones(view.node_B.shape, jnp.int32))
    if width <= _UNROLL_CHILDREN:
      for j in range(width):
        carry = judge_child(j, carry)
    else:
      # Traced once and looped: unrolled, XLA's compile time grows as the
      # square of a node's children.
      carry = jax.lax.fori_loop(0, width, judge_child, carry)
    r_BxV, _, chosen_B = carry
    return chosen_B, r_BxV, None

  return walk(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN, topology,
              sample, judge)


def check_walk_args(topology, u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN,
                    valid_BxN) -> None:
  """Raises, naming the shapes, unless a tree rule's arguments fit the
  topology's N nodes: tokens and valid `[B, N]`, p and q `[B, N + 1, V]`,
  uniforms `[B, N + 1, 2]` (`traversal`, `kseq`)."""
  if not isinstance(topology, TreeTopology):
    raise TypeError("topology must be a TreeTopology (e.g. "
                    "TreeTopology.from_branching((2, 1))), got "
                    f"{type(topology).__name__}.")
  n = topology.num_nodes
  if (tokens_BxN.ndim != 2 or tokens_BxN.shape[1] != n
      or p_BxN1xV.shape[:2] != (tokens_BxN.shape[0], n + 1)
      or q_BxN1xV.shape != p_BxN1xV.shape
      or u_BxNx2.shape != (tokens_BxN.shape[0], n + 1, 2)
      or valid_BxN.shape != tokens_BxN.shape):
    raise ValueError(
        f"tokens {tuple(tokens_BxN.shape)}, valid {tuple(valid_BxN.shape)}, "
        f"p {tuple(p_BxN1xV.shape)}, q {tuple(q_BxN1xV.shape)} and u "
        f"{tuple(u_BxNx2.shape)} must be [B, N], [B, N], [B, N + 1, V] "
        f"(twice) and [B, N + 1, 2] for the topology's N = {n} nodes.")


@dataclasses.dataclass(frozen=True)
class NodeView:
  """One level of a walk down the tree, seen from each row's current node:
  what a node rule (`walk`'s `judge`) decides from.

  Attributes:
    level: static int, the level (0: the root's children are judged).
    node_B: int32 `[B]`, the current node (-1: the root).
    p_BxV, q_BxV: float32 `[B, V]`, the target's and the draft's laws after
      it.
    kids_BxK: int32 `[B, K]`, its children in node order, -1 past them.
    tokens_BxK: int32 `[B, K]`, their tokens (node 0's past them).
    valid_BxK: bool `[B, K]`, the children that exist and are valid.
    u_BxK: float32 `[B, K]`, each child's judging uniform
      (`u_BxNx2[:, child, 0]`).
    u_final_B: float32 `[B]`, the uniform of the token drawn where the node
      keeps no child (`u_BxNx2[:, node + 1, 1]`).
  """
  level: int
  node_B: jax.Array
  p_BxV: jax.Array
  q_BxV: jax.Array
  kids_BxK: jax.Array
  tokens_BxK: jax.Array
  valid_BxK: jax.Array
  u_BxK: jax.Array
  u_final_B: jax.Array


def walk(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
         topology: TreeTopology, sample, judge):
  """A walk down a static tree from the root, vectorised over rows: at
  each level, `judge(view)` (a `NodeView` of each row's node) returns
  `(chosen_B, r_BxV, drawn_B)`: the kept child (-1: none), the law of the
  final token, and that token where the rule drew it itself (else None:
  `walk_step` draws it). Arguments as `tree_verify`'s; returns its
  outputs."""
  check_walk_args(topology, u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN,
                  valid_BxN)
  batch = tokens_BxN.shape[0]
  table = jnp.asarray(topology.children_table())  # [N + 1, K]
  rows_B = jnp.arange(batch)
  node_B = -jnp.ones((batch,), jnp.int32)  # current node (-1: the root)
  alive_B = jnp.ones((batch,), bool)       # still descending
  depth = topology.max_depth
  path, emitted = [], []
  final_B = jnp.zeros((batch,), jnp.int32)
  for level in range(depth + 1):
    kids_BxK = table[node_B + 1]
    safe_BxK = jnp.maximum(kids_BxK, 0)
    view = NodeView(
        level=level, node_B=node_B,
        p_BxV=p_BxN1xV[rows_B, node_B + 1],
        q_BxV=q_BxN1xV[rows_B, node_B + 1], kids_BxK=kids_BxK,
        tokens_BxK=jnp.take_along_axis(tokens_BxN, safe_BxK, axis=1),
        valid_BxK=(kids_BxK >= 0) & jnp.take_along_axis(valid_BxN, safe_BxK,
                                                        axis=1),
        u_BxK=jnp.take_along_axis(u_BxNx2[:, :, 0], safe_BxK, axis=1),
        u_final_B=u_BxNx2[rows_B, node_B + 1, 1])
    chosen_B, r_BxV, drawn_B = judge(view)
    node_B, alive_B, final_B = walk_step(
        chosen_B, r_BxV, node_B, alive_B, final_B, u_BxNx2, tokens_BxN,
        sample, path, emitted, drawn_B)
  return _finish_walk(path, emitted, final_B, depth)


def check_control(control) -> None:
  """A walk rule's `control`: None (the exact rule) or True (its negative
  control)."""
  if control not in (None, True):
    raise ValueError(f"control must be None (exact) or True (the negative "
                     f"control), got {control!r}.")


def first_child(kids_BxK, match_BxK):
  """int32 `[B]`: the first child whose `match_BxK` holds, -1 where none."""
  return jnp.where(
      jnp.any(match_BxK, axis=1),
      jnp.take_along_axis(kids_BxK, jnp.argmax(match_BxK, axis=1)[:, None],
                          axis=1)[:, 0], -1)


def residual(excess_BxV, fallback_BxV):
  """`excess_BxV` normalised, or `fallback_BxV` where it has no mass."""
  mass_B1 = jnp.sum(excess_BxV, axis=-1, keepdims=True)
  return jnp.where(mass_B1 > 0,
                   excess_BxV / jnp.where(mass_B1 > 0, mass_B1, 1.0),
                   fallback_BxV)


def walk_step(chosen_B, r_BxV, node_B, alive_B, final_B, u_BxNx2,
              tokens_BxN, sample, path, emitted, drawn_B=None):
  """One level of a walk down the tree, after a node rule judged the
  children of each row's node: a row that kept child `chosen_B` (>= 0)
  descends into it; one that kept none draws its final token from
  `r_BxV` with uniform `u_BxNx2[:, node + 1, 1]` and stops. Appends the
  level's kept node (-1: none) and token to `path` and `emitted`; returns
  (node_B, alive_B, final_B). A rule that drew that token already (its
  choice depends on it: `greedy_draft`) passes it as `drawn_B`."""
  rows = jnp.arange(chosen_B.shape[0])
  stop_B = alive_B & (chosen_B < 0)
  y_B = (sample(u_BxNx2[rows, node_B + 1, 1], r_BxV) if drawn_B is None
         else drawn_B)
  final_B = jnp.where(stop_B, y_B, final_B)
  descend_B = alive_B & (chosen_B >= 0)
  path.append(jnp.where(descend_B, chosen_B, -1))
  emitted.append(jnp.where(descend_B, tokens_BxN[rows, jnp.maximum(
      chosen_B, 0)], 0))
  return jnp.where(descend_B, chosen_B, node_B), descend_B, final_B


def greedy_tree_verify(target_token_BxN1, tokens_BxN, valid_BxN,
                       topology: TreeTopology):
  """`tree_verify` when p is one-hot on the target's argmax (greedy).

  At a node whose target argmax is a, every child x != a is rejected
  (p(x) = 0), the residual stays one-hot on a, and the first valid child
  x = a is kept with probability min(1, 1 / q'(x)) = 1, in either mode; a
  node that keeps none emits a. So the walk follows, level by level, the
  first valid child equal to the argmax: no `[B, N + 1, V]` law, residual or
  draw, and the same outputs as `tree_verify` (tested).

  Args:
    target_token_BxN1: int32 `[B, N + 1]`, the target's argmax after the
      root (index 0) and after each node i (index i + 1).
    tokens_BxN, valid_BxN, topology: as in `tree_verify`.

  Returns:
    As `tree_verify`.
  """
  batch = tokens_BxN.shape[0]
  table = jnp.asarray(topology.children_table())  # [N + 1, K]
  rows = jnp.arange(batch)
  node_B = -jnp.ones((batch,), jnp.int32)
  alive_B = jnp.ones((batch,), bool)
  depth = topology.max_depth
  path, emitted = [], []
  final_B = jnp.zeros((batch,), jnp.int32)
  for _ in range(depth + 1):
    a_B = target_token_BxN1[rows, node_B + 1]
    kids_BxK = table[node_B + 1]
    # The first matching child wins; all slots at once, so a wide node is
    # one traced step, not one per child (as in `tree_verify`'s loop).
    safe_BxK = jnp.maximum(kids_BxK, 0)
    match_BxK = ((kids_BxK >= 0)
                 & jnp.take_along_axis(valid_BxN, safe_BxK, axis=1)
                 & (jnp.take_along_axis(tokens_BxN, safe_BxK, axis=1)
                    == a_B[:, None]))
    first_B = jnp.argmax(match_BxK, axis=1)
    chosen_B = jnp.where(jnp.any(match_BxK, axis=1),
                         jnp.take_along_axis(kids_BxK, first_B[:, None],
                                             axis=1)[:, 0], -1)
    final_B = jnp.where(alive_B & (chosen_B < 0), a_B, final_B)
    descend_B = alive_B & (chosen_B >= 0)
    path.append(jnp.where(descend_B, chosen_B, -1))
    emitted.append(jnp.where(descend_B, a_B, 0))
    node_B = jnp.where(descend_B, chosen_B, node_B)
    alive_B = descend_B
  return _finish_walk(path, emitted, final_B, depth)


def _finish_walk(path, emitted, final_B, depth):
  """Stacks a walk's per-depth picks into `tree_verify`'s outputs."""
  path_BxD = jnp.stack(path[:depth], axis=1)
  num_accepted_B = jnp.sum(path_BxD >= 0, axis=1).astype(jnp.int32)
  emitted_BxD1 = jnp.stack(emitted[:depth] + [final_B], axis=1)
  emitted_BxD1 = jnp.where(jnp.arange(depth + 1) == num_accepted_B[:, None],
                           final_B[:, None], emitted_BxD1)
  return path_BxD, emitted_BxD1.astype(jnp.int32), num_accepted_B
