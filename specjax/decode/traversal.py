"""Traversal Verification of a static draft tree, in JAX (Weng et al. 2025).

Token-level tree verification (`specjax.decode.tree.tree_verify`) walks down
from the root and judges each child on its own token. Traversal Verification
("Traversal Verification for Speculative Tree Decoding", Weng et al.,
NeurIPS 2025) judges whole subtrees, from the leaves up, with the weights
and residuals of block verification (Sun et al. 2025):

  every node carries a state (w, r): w = min(1, w_parent r_parent(x) /
  q_j(x)) when the traversal enters it (x its token, q_j the law it was
  drawn from: q at its parent, without its earlier siblings for "wor"), and
  r = p at the node. Depth first, in node order, the first remaining leaf
  (a node all of whose children are gone) is kept with probability w; a
  kept node ends the round: the path to it is emitted, then one token drawn
  from its r. A leaf that is not kept is removed, and its parent's state
  becomes the block-verification residual of the removed child,

    r_parent <- (w_parent r_parent - q_j)+ / sum(...),
    w_parent <- sum (w_parent r_parent - q_j)+
                / (sum (w_parent r_parent - q_j)+ + 1 - w_parent)

  (w_parent <- 0 where that sum is 0); the root is always kept.

This is the rule of `specjax.lab.multidraft.traversal_round_law`, whose
exact enumeration proves it emits the target's law in both drafting modes;
tests/test_traversal.py checks this implementation against that law. On a
chain it is block verification; on one level (k children of the root) it
is recursive rejection sampling, SpecInfer / RSD.

Implementation: the depth-first order is static, so a round is one
`lax.scan` over 2N events (enter node v: its state from its parent's;
leave node v: the keep test and, on a removal, the parent's residual; one
`lax.cond` branch per event), with one state (w, r, and for "wor" the
tokens of removed children) per depth on a stack `[B, D + 1, V]`, no
larger than p: the traversal only ever holds the states of one
root-to-node path. A row that kept a node ignores the events after it. The
compiled program does not grow with the tree; the work is O(N V) per row,
in sequence, where token-level verification does O(D K V) (K children per
node) along one path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode import tree as tree_lib


@functools.lru_cache(maxsize=64)
def _schedule(topology: tree_lib.TreeTopology):
  """The static depth-first events of `topology`.

  Returns numpy int32 arrays, each `[2N]`: enter (1: the traversal enters
  the node, 0: it leaves it, after all its children), node, depth (1 for
  the root's children) and the parent's index into `[N + 1]` tables (0:
  the root). Iterative: a chain of 16,384 nodes is deeper than Python's
  recursion limit.
  """
  depth = topology.depth
  events = []
  stack = [(kid, True) for kid in reversed(topology.children(-1))]
  while stack:
    node, enter = stack.pop()
    events.append((int(enter), node))
    if enter:
      stack.append((node, False))
      stack.extend((kid, True) for kid in reversed(topology.children(node)))
  enter_E, node_E = (np.array(c, np.int32) for c in zip(*events))
  depth_E = np.array([depth[v] for v in node_E], np.int32)
  parent_E = np.array([topology.parents[v] + 1 for v in node_E], np.int32)
  return enter_E, node_E, depth_E, parent_E


def _path_to(node_B, topology: tree_lib.TreeTopology):
  """int32 `[B, D]`: the nodes on the root-to-`node_B` path by depth (-1:
  the root, the empty path), -1 past its end. Walked up the parents in D
  steps: a static `[N + 1, D]` table of every path would take a gigabyte
  for a chain of 16,384 nodes."""
  parent_N1 = jnp.asarray((-1,) + topology.parents, jnp.int32)
  depth_N1 = jnp.asarray(topology.depth_with_root())
  depth = topology.max_depth
  at_D = jnp.arange(depth)

  def up(_, carry):
    path_BxD, node_B = carry
    path_BxD = jnp.where(at_D == depth_N1[node_B + 1][:, None] - 1,
                         node_B[:, None], path_BxD)
    return path_BxD, parent_N1[node_B + 1]

  path_BxD, _ = jax.lax.fori_loop(
      0, depth, up, (-jnp.ones(node_B.shape + (depth,), jnp.int32), node_B))
  return path_BxD


def _ratio(num_B, den_B):
  """min(1, num / den), 0 for num = den = 0 (the lab's `_ratio`): a drafted
  token of q = 0 never occurs, one the target gives 0 gets weight 0."""
  over_B = num_B >= den_B
  return jnp.where(over_B, (num_B > 0).astype(num_B.dtype),
                   num_B / jnp.where(over_B, 1.0, den_B))


def traversal_verify(u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                     topology: tree_lib.TreeTopology, mode: str, sample,
                     final_residual: bool = True):
  """Traversal Verification of one drafted tree per row.

  Args:
    u_BxN1x2: float32 uniforms `[B, N + 1, 2]`: [:, v + 1, 0] decides
      whether node v is kept when the traversal reaches it as a leaf,
      [:, v + 1, 1] draws the final token when node v (or the root, index
      0) is kept. The layout of `tree.tree_verify`'s uniforms.
    p_BxN1xV, q_BxN1xV: float32 `[B, N + 1, V]`: target / draft laws after
      the root (index 0) and after each node i (index i + 1).
    tokens_BxN: int32 `[B, N]` node tokens; valid_BxN: bool `[B, N]` (a
      "wor" child past q's support is invalid, and so is every node under
      an invalid one: its subtree is skipped, the parent's state untouched).
    topology, mode: static; mode "iid" (children i.i.d. from q) or "wor"
      (without replacement: child j judged with q without its earlier
      siblings, renormalised).
    sample: the loop's sampler, `sample(u_x, probs_xV) -> int32`.
    final_residual: static; False is a NEGATIVE CONTROL only (a kept node
      emits its final token from p, not from its residual r: wrong wherever
      a kept node lost a child), never exact.

  Returns:
    As `tree.tree_verify`: (path_BxD int32 `[B, D]`: the kept node per
    depth, -1 past the kept depth; emitted_BxD1 int32 `[B, D + 1]`: the
    kept path's tokens, then the final token at index num_accepted (and at
    D); num_accepted_B int32 `[B]`, the kept depth in [0, D]).
  """
  mode = tree_lib.check_mode(mode)
  tree_lib.check_walk_args(topology, u_BxN1x2, p_BxN1xV, q_BxN1xV,
                           tokens_BxN, valid_BxN)
  batch, vocab = tokens_BxN.shape[0], p_BxN1xV.shape[-1]
  levels = topology.max_depth + 1
  rows_B = jnp.arange(batch)
  vocab_V = jnp.arange(vocab)
  take = lambda x, i, axis=1: jax.lax.dynamic_index_in_dim(
      x, i, axis=axis, keepdims=False)
  put = lambda x, value, i: jax.lax.dynamic_update_index_in_dim(
      x, value.astype(x.dtype), i, axis=1)

  def parent_law(carry, v, d, parent):
    """The parent's state (level d - 1), v's token, and the law v was drawn
    from: q at the parent, without its removed children for "wor"."""
    r_BxLxV, w_BxL, _, taken_BxLxV, *_ = carry
    q_j_BxV = take(q_BxN1xV, parent)
    if mode == "wor":
      q_j_BxV = jnp.where(take(taken_BxLxV, d - 1), 0.0, q_j_BxV)
      mass_B1 = jnp.sum(q_j_BxV, axis=-1, keepdims=True)
      q_j_BxV = q_j_BxV / jnp.where(mass_B1 > 0, mass_B1, 1.0)
    return (take(r_BxLxV, d - 1), take(w_BxL, d - 1), q_j_BxV,
            take(tokens_BxN, v))

  def enter(carry, v, d, parent):
    """Enters v: its state starts at (min(1, w r(x) / q_j(x)), p at v)."""
    r_BxLxV, w_BxL, alive_BxL, taken_BxLxV, *rest = carry
    r_par_BxV, w_par_B, q_j_BxV, x_B = parent_law(carry, v, d, parent)
    w_v_B = _ratio(w_par_B * r_par_BxV[rows_B, x_B], q_j_BxV[rows_B, x_B])
    alive_v_B = take(alive_BxL, d - 1) & take(valid_BxN, v)
    r_BxLxV = put(r_BxLxV, take(p_BxN1xV, v + 1), d)
    w_BxL = put(w_BxL, w_v_B, d)
    alive_BxL = put(alive_BxL, alive_v_B, d)
    if mode == "wor":  # none of v's children removed yet
      taken_BxLxV = put(taken_BxLxV, jnp.zeros_like(r_par_BxV, bool), d)
    return (r_BxLxV, w_BxL, alive_BxL, taken_BxLxV, *rest)

  def leave(carry, v, d, parent):
    """Leaves v, a leaf now: kept with probability w (the round ends
    there), or removed, and then its parent takes the block-verification
    residual of it."""
    r_BxLxV, w_BxL, alive_BxL, taken_BxLxV, done_B, kept_B, final_BxV = (
        carry)
    r_par_BxV, w_par_B, q_j_BxV, x_B = parent_law(carry, v, d, parent)
    live_B = ~done_B & take(alive_BxL, d)
    keep_B = live_B & (take(u_BxN1x2[:, :, 0], v + 1) < take(w_BxL, d))
    remove_B = live_B & ~keep_B
    final_BxV = jnp.where(keep_B[:, None], take(r_BxLxV, d) if final_residual
                          else take(p_BxN1xV, v + 1), final_BxV)
    excess_BxV = jnp.maximum(w_par_B[:, None] * r_par_BxV - q_j_BxV, 0.0)
    mass_B = jnp.sum(excess_BxV, axis=-1)
    has_B = remove_B & (mass_B > 0)
    safe_B = jnp.where(has_B, mass_B, 1.0)
    r_BxLxV = put(r_BxLxV, jnp.where(has_B[:, None],
                                     excess_BxV / safe_B[:, None],
                                     r_par_BxV), d - 1)
    # A removal that leaves no excess leaves r and weight 0 (the lab's).
    w_BxL = put(w_BxL, jnp.where(
        remove_B, jnp.where(has_B, mass_B / (safe_B + (1.0 - w_par_B)),
                            0.0), w_par_B), d - 1)
    if mode == "wor":  # later siblings are judged without v's token
      taken_BxLxV = put(taken_BxLxV, take(taken_BxLxV, d - 1) | (
          remove_B[:, None] & (vocab_V == x_B[:, None])), d - 1)
    return (r_BxLxV, w_BxL, alive_BxL, taken_BxLxV, done_B | keep_B,
            jnp.where(keep_B, v, kept_B), final_BxV)

  def step(carry, event):
    entering, v, d, parent = event
    # One branch runs per event: entering needs no [B, V] residual.
    return jax.lax.cond(entering == 1, enter, leave, carry, v, d,
                        parent), None

  p_root_BxV = p_BxN1xV[:, 0]
  carry = (jnp.zeros((batch, levels, vocab), jnp.float32).at[:, 0].set(
               p_root_BxV),
           jnp.zeros((batch, levels), jnp.float32).at[:, 0].set(1.0),
           jnp.zeros((batch, levels), bool).at[:, 0].set(True),
           jnp.zeros((batch, levels, vocab), bool) if mode == "wor" else None,
           jnp.zeros((batch,), bool), -jnp.ones((batch,), jnp.int32),
           jnp.zeros((batch, vocab), jnp.float32))
  events = tuple(jnp.asarray(e) for e in _schedule(topology))
  (r_BxLxV, _, _, _, done_B, kept_B, final_BxV), _ = jax.lax.scan(
      step, carry, events)
  # A row that kept no node keeps the root, with the root's residual.
  final_BxV = jnp.where(done_B[:, None], final_BxV,
                        r_BxLxV[:, 0] if final_residual else p_root_BxV)
  final_B = sample(u_BxN1x2[rows_B, kept_B + 1, 1], final_BxV)
  depth_N1 = jnp.asarray(topology.depth_with_root())
  num_accepted_B = depth_N1[kept_B + 1]
  path_BxD = _path_to(kept_B, topology)
  # `tree_verify`'s layout: the path's tokens, 0 past it, the final token
  # at num_accepted and at D.
  emitted_BxD = jnp.where(path_BxD >= 0, jnp.take_along_axis(
      tokens_BxN, jnp.maximum(path_BxD, 0), axis=1), 0)
  emitted_BxD1 = jnp.concatenate([emitted_BxD, final_B[:, None]], axis=1)
  emitted_BxD1 = jnp.where(
      jnp.arange(levels) == num_accepted_B[:, None], final_B[:, None],
      emitted_BxD1)
  return (path_BxD.astype(jnp.int32), emitted_BxD1.astype(jnp.int32),
          num_accepted_B.astype(jnp.int32))
