"""One tree round of the compiled decode loop: draft a static tree, verify it.

Called by `loop._round` when the verifier is a `TreeVerifier`. For every row
with n committed tokens (the target cache holds positions < n - 1, the root
is the last committed token, at slot and position n - 1):

Draft, level by level (max_depth draft calls, like the chain's gamma):
  level 0: the draft re-reads the two-token window ending at the root, as
    the chain does (it never saw a kept leaf of the last round), giving q at
    the root; its cache is then set to start the tree region at the root.
  level d >= 1: the children of every node of depth d - 1 are drawn from
    that node's q (`tree.draft_children`, i.i.d., without replacement, or
    greedy: the top k - 1 and one draw from the rest; every node of the
    level in one step), and the nodes of depth d that have children are
    fed to the draft in ONE `tree_decode(..., nodes=level)` call: each
    node goes to slot n - 1 + 1 + node, position n - 1 + depth, attending
    to the committed slots and its ancestors' slots.
  The leaves' children never exist, so leaves are never fed.

Target: root + every node in ONE `tree_decode` pass (the same slot layout),
p at every node; the verifier's `verify_tree` keeps one path
(`tree.tree_verify`: recursive rejection sampling;
`traversal.traversal_verify`: Traversal Verification;
`greedy_draft.greedy_draft_verify`: Hu et al.'s greedy drafts;
`canonical.canonical_verify`: Khisti et al.'s canonical verifier). Both
caches then `move` the kept path's entries to the contiguous slots n,
n + 1, ... (the draft's moved leaf entry is stale and is re-read by the
next round's window).

A feature-reading draft (`EagleDraft`) starts as a chain round does, from
the target's features of the committed tokens (level 0), then feeds each
level's nodes paired with the feature the head predicted at their parents
(`tree_from_features`); the target's tree pass also returns its features,
and those at the root and along the kept path are the next round's.

A draft that shares the target's cache (`reads_target_cache`, a prefix
`SelfDraft`) reads a view of it instead: level 0 feeds the root alone (the
target's cache holds every committed slot before it), the levels write
their nodes into the target's tree slots of the shared layers, and the
target's tree pass, which writes every tree slot before it reads one,
replaces them; the target's move is the draft's.

Randomness: key (row, round) folded with purpose 0 drafts the tree (iid:
uniforms `[I, K]`, greedy: the same, column 0 drawing a node's last child,
wor: Gumbel noise `[I, V]`, one row per node with children), purpose
`_VERIFY` the `[N + 1, 2]` verification uniforms; a row's draws never depend
on the rest of the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.constraint import automaton as constraint_lib
from specjax.decode import steps
from specjax.decode import tree as tree_lib

_DRAFT, _VERIFY = 0, 1 << 20


def _levels(topology):
  """Static per-depth lists of the nodes that have children (depth 0: the
  root, -1), each with its children."""
  depth = (0,) + topology.depth
  levels = [[] for _ in range(topology.max_depth)]
  for u in range(-1, topology.num_nodes):
    kids = topology.children(u)
    if kids:
      levels[depth[u + 1]].append((u, kids))
  return levels


def _keys(row_keys_B, round_):
  fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))
  keys_B = fold(row_keys_B, round_)
  return fold(keys_B, _DRAFT), fold(keys_B, _VERIFY)


def _q(logits_BxLxV, sampling):
  """q after the sampling transform; NaN rows where the logits were
  non-finite (counted by the loop, as `_draft_sample` does)."""
  q_BxLxV = sampling_lib.probabilities(logits_BxLxV, sampling)
  bad_BxL = steps.nonfinite_rows(logits_BxLxV)
  return jnp.where(bad_BxL[..., None], jnp.nan, q_BxLxV), bad_BxL


def propose(draft, state, verifier, key_B, sampling, masker=None,
            constraint=None):
  """Drafts the tree: tokens `[B, N]`, valid `[B, N]`, q `[B, N + 1, V]`
  (index 0: the root, i + 1: node i; zeros at leaves), the draft cache (tree
  region at the root's slot), int32 `[B]` non-finite draws, and under a
  `constraint` the automaton state at the root and every node `[B, N + 1]`
  (else None). `masker(states)` gives the constraint's `steps.Masker`."""
  topology, mode = verifier.topology, verifier.mode
  n_B = state.lengths
  batch, vocab = n_B.shape[0], draft.vocab_size
  levels = _levels(topology)
  internal = [u for level in levels for u, _ in level]
  row = {u: i for i, u in enumerate(internal)}
  if mode in ("iid", "greedy"):
    u_BxIxK = jax.vmap(lambda k: jax.random.uniform(
        k, (len(internal), topology.max_children)))(key_B)
    gumbel_BxIxV = None
  else:
    u_BxIxK = None
    gumbel_BxIxV = jax.vmap(lambda k: jax.random.gumbel(
        k, (len(internal), vocab)))(key_B)
  sample = lambda u_x, probs_xV: steps._sample(u_x, probs_xV, sampling)

  features = getattr(draft, "reads_target_features", False)
  if features:
    # Level 0: the target's features paired with the committed tokens, as
    # a chain round starts (`steps._feature_window`): q and the head's own
    # feature at the root.
    logits_BxV, cache = steps._feature_window(draft, state)
    logits_Bx1xV = logits_BxV[:, None]
    # Each node's pair takes the feature the head predicted at its parent.
    predicted_BxN1xD = jnp.zeros(
        (batch, topology.num_nodes + 1, cache.feature.shape[-1]),
        cache.feature.dtype).at[:, 0].set(cache.feature)
  elif getattr(draft, "reads_target_cache", False):
    # Level 0: a view of the target's cache, which holds every committed
    # position but the root's: feed the root (its slot is the tree's first,
    # which the target's pass rewrites).
    cache = draft.cache_from_target(state.target_cache)
    root_Bx1 = jnp.take_along_axis(state.tokens, (n_B - 1)[:, None], axis=1)
    logits_Bx1xV, cache = draft(root_Bx1, cache)
  else:
    # Level 0: the chain's two-token catch-up window ending at the root.
    window_Bx2, cache, start_B = steps._draft_window(state, 2)
    logits_Bx2xV, cache = draft(window_Bx2, cache)
    logits_Bx1xV = jnp.take_along_axis(
        logits_Bx2xV, (n_B - 1 - start_B)[:, None, None], axis=1)
  cache = cache.replace(lengths=n_B - 1)

  depth_T = topology.depth_with_root()
  ancestor_TxT = topology.ancestor_table()
  tokens_BxN = jnp.zeros((batch, topology.num_nodes), jnp.int32)
  valid_BxN = jnp.ones((batch, topology.num_nodes), bool)
  q_BxN1xV = jnp.zeros((batch, topology.num_nodes + 1, vocab), jnp.float32)
  nonfinite_B = jnp.zeros((batch,), jnp.int32)
  states_BxN1 = None
  if constraint is not None:
    states_BxN1 = jnp.broadcast_to(state.constraint_state[:, None],
                                   (batch, topology.num_nodes + 1))
  for d, level in enumerate(levels):
    if d > 0 and features:  # this level's nodes with children, one call
      nodes = np.array([u for u, _ in level])
      parents = np.array([topology.parents[u] for u in nodes])
      logits_BxLxV, f_BxLxD, cache = draft.tree_from_features(
          predicted_BxN1xD[:, parents + 1], tokens_BxN[:, nodes], cache,
          depth_T, ancestor_TxT, nodes=tuple(int(u) + 1 for u in nodes))
      predicted_BxN1xD = predicted_BxN1xD.at[:, nodes + 1].set(
          f_BxLxD.astype(predicted_BxN1xD.dtype))
    elif d > 0:
      nodes = [u for u, _ in level]
      logits_BxLxV, cache = draft.tree_decode(
          tokens_BxN[:, np.array(nodes)], cache, depth_T, ancestor_TxT,
          nodes=tuple(u + 1 for u in nodes))
    else:
      logits_BxLxV = logits_Bx1xV
    nodes = np.array([u for u, _ in level])
    draw_q_BxLxV = None
    if constraint is not None:
      mask = masker(states_BxN1[:, nodes + 1])
      if mask.draft_unmasked:  # the negative control draws unmasked
        draw_q_BxLxV = _q(logits_BxLxV, sampling)[0]
      logits_BxLxV = mask(logits_BxLxV)
    q_BxLxV, bad_BxL = _q(logits_BxLxV, sampling)
    nonfinite_B = nonfinite_B + jnp.sum(bad_BxL, axis=1, dtype=jnp.int32)
    # Every node of the level draws its children in one step (as many as
    # the level's widest node; each keeps its first ones): one traced step
    # per node made the program grow with the tree.
    width = max(len(kids) for _, kids in level)
    ids = np.array([row[u] for u, _ in level])
    q_BxN1xV = q_BxN1xV.at[:, nodes + 1].set(q_BxLxV)
    # Greedy children depend on each node's own number of children (its
    # last child is drawn from q without its top k - 1).
    x_BxLxW, ok_BxLxW = tree_lib.draft_children(
        None if u_BxIxK is None else u_BxIxK[:, ids],
        None if gumbel_BxIxV is None else gumbel_BxIxV[:, ids, None],
        q_BxLxV if draw_q_BxLxV is None else draw_q_BxLxV, width, mode,
        sample, counts_x=np.array([len(kids) for _, kids in level]))
    # Each child's (node of the level, child slot), and its id.
    at_j = np.array([j for j, (_, kids) in enumerate(level) for _ in kids])
    at_s = np.array([s for _, kids in level for s in range(len(kids))])
    children = np.array([c for _, kids in level for c in kids])
    ok_BxC = ok_BxLxW[:, at_j, at_s]
    if d > 0:  # a child of an invalid node is invalid (the root is valid)
      ok_BxC = ok_BxC & valid_BxN[:, nodes[at_j]]
    tokens_BxN = tokens_BxN.at[:, children].set(x_BxLxW[:, at_j, at_s])
    valid_BxN = valid_BxN.at[:, children].set(ok_BxC)
    if constraint is not None:  # each child's state: its parent's, advanced
      states_BxN1 = states_BxN1.at[:, children + 1].set(constraint_lib.advance(
          constraint, states_BxN1[:, nodes[at_j] + 1],
          x_BxLxW[:, at_j, at_s]))
  return tokens_BxN, valid_BxN, q_BxN1xV, cache, nonfinite_B, states_BxN1


def _move_path(cache, root_B, path_BxD):
  """Moves the kept nodes (slot root + 1 + node) to slots root + 1 + d."""
  depth = path_BxD.shape[1]
  src_BxD = root_B[:, None] + 1 + jnp.maximum(path_BxD, 0)
  dst_BxD = jnp.where(path_BxD >= 0,
                      root_B[:, None] + 1 + jnp.arange(depth)[None, :],
                      jnp.iinfo(jnp.int32).max)  # dropped
  return cache.move(src_BxD, dst_BxD)


def tree_round(target, draft, state, verifier, sampling, masker=None,
               constraint=None):
  """Drafts and verifies one tree per row; under a `constraint` (with
  `masker`, see `propose`) both models' logits are masked at every node.

  Returns:
    (out: `steps.VerifyOutput` with tokens `[B, D + 1]`, num_accepted in
     [0, D] (the kept depth), num_verified (depths at which a child was
     judged), overlap (sum_x min(p, q) at the nodes judged), the target cache
     with the kept path moved into place; the draft cache likewise; draft
     passes (D); int32 `[B]` non-finite draft draws; the target's features
     `[B, D + 1, D_model]` at the root and the kept path for a
     feature-reading draft, else `state.target_features`).
  """
  topology = verifier.topology
  draft_key_B, verify_key_B = _keys(state.row_keys, state.round)
  tokens_BxN, valid_BxN, q_BxN1xV, draft_cache, draft_bad_B, states_BxN1 = (
      propose(draft, state, verifier, draft_key_B, sampling, masker,
              constraint))
  root_B = state.lengths - 1
  last_B = jnp.take_along_axis(state.tokens, root_B[:, None], axis=1)
  target_cache = state.target_cache
  shared = getattr(draft, "reads_target_cache", False)
  if shared:
    # The draft wrote its nodes into the target's tree slots (first k
    # layers); the tree pass below writes every slot before it reads any.
    target_cache = draft.cache_to_target(target_cache, draft_cache)
    draft_cache = state.draft_cache
  features = getattr(draft, "reads_target_features", False)
  scored = target.tree_decode(
      jnp.concatenate([last_B, tokens_BxN], axis=1), target_cache,
      topology.depth_with_root(), topology.ancestor_table(),
      **({"return_hidden": True} if features else {}))
  logits_BxN1xV, target_cache = scored[0], scored[-1]
  if constraint is not None:
    logits_BxN1xV = masker(states_BxN1)(logits_BxN1xV)
  target_bad_B = jnp.sum(steps.nonfinite_rows(logits_BxN1xV), axis=1,
                         dtype=jnp.int32)
  if sampling.greedy and verifier.greedy_walk:
    # p is one-hot on the argmax: the walk follows the children equal to it
    # (token-level and traversal verification alike), and sum_x min(p, q)
    # at a node is q(argmax); no [B, N + 1, V] p.
    target_token_BxN1 = sampling_lib._greedy_token(logits_BxN1xV)
    path_BxD, emitted_BxD1, num_accepted_B = tree_lib.greedy_tree_verify(
        target_token_BxN1, tokens_BxN, valid_BxN, topology)
    overlap_BxN1 = jnp.take_along_axis(
        q_BxN1xV, target_token_BxN1[..., None], axis=-1)[..., 0]
  else:
    p_BxN1xV = sampling_lib.probabilities(logits_BxN1xV, sampling)
    u_BxN1x2 = jax.vmap(lambda k: jax.random.uniform(
        k, (topology.num_nodes + 1, 2)))(verify_key_B)
    # The verifier's rule (`TreeVerifier.verify_tree`): token-level
    # recursive rejection sampling, or Traversal Verification.
    path_BxD, emitted_BxD1, num_accepted_B = verifier.verify_tree(
        u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
        lambda u_x, probs_xV: steps._sample(u_x, probs_xV, sampling))
    overlap_BxN1 = jnp.sum(jnp.minimum(p_BxN1xV, q_BxN1xV), axis=-1)
  # The nodes visited at depths 0..D-1 (index into root + nodes) and whether
  # a child was judged there (the walk stops at a leaf or a rejection).
  visited_BxD = jnp.concatenate(
      [jnp.zeros_like(path_BxD[:, :1]), path_BxD[:, :-1] + 1], axis=1)
  has_kids_N1 = jnp.asarray(topology.children_table()[:, 0] >= 0)
  judged_BxD = ((jnp.arange(path_BxD.shape[1]) <= num_accepted_B[:, None])
                & has_kids_N1[jnp.maximum(visited_BxD, 0)])
  overlap_BxD = jnp.take_along_axis(overlap_BxN1, jnp.maximum(visited_BxD, 0),
                                    axis=1)
  out = steps.VerifyOutput(
      tokens=emitted_BxD1, num_accepted=num_accepted_B,
      num_verified=jnp.sum(judged_BxD, axis=1, dtype=jnp.int32),
      overlap=jnp.sum(jnp.where(judged_BxD, overlap_BxD, 0.0), axis=1),
      cache=_move_path(target_cache, root_B, path_BxD),
      nonfinite=target_bad_B)
  target_features = state.target_features
  if features:
    # The target's features at the root and along the kept path (positions
    # n - 1 ...) pair with the committed tokens n ... next round, which the
    # head re-reads from n: its cache rolls back there, nothing to move
    # (as `loop._finish` does for a chain).
    target_features = jnp.take_along_axis(
        scored[1], jnp.concatenate([jnp.zeros_like(path_BxD[:, :1]),
                                    jnp.maximum(path_BxD, 0) + 1],
                                   axis=1)[..., None], axis=1)
    draft_cache = draft_cache.replace(lengths=state.lengths)
  elif not shared:  # a shared cache moved with the target's
    draft_cache = _move_path(draft_cache, root_B, path_BxD)
  return (out, draft_cache, topology.max_depth, draft_bad_B,
          target_features)
