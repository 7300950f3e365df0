"""Exact draft trees: the lab's enumeration (worst TV over >= 1,000 settings)
and the JAX recursive rejection sampling (`specjax.decode.tree`) against it."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import lab
from specjax import sampling as sampling_lib
from specjax import testing
from specjax.decode import tree as tree_lib
from specjax.lab import trees as lt
from specjax.lab import verifiers as lv

TOL = 1e-12
PAIRS = [(1.5, 0.5, 0), (0.0, 0.3, 1), (1000.0, 0.5, 2), (3.0, 0.0, 3),
         (2.0, 1.0, 4), (8.0, 0.8, 5)]


def test_topology_from_branching_and_validation():
  topo = tree_lib.TreeTopology.from_branching((3, 2, 1, 1))
  assert topo.num_nodes == 21 and topo.max_depth == 4
  assert topo.children(-1) == (0, 1, 2) and topo.max_children == 3
  assert tree_lib.TreeTopology.from_branching((1, 1, 1)).parents == (-1, 0, 1)
  with pytest.raises(ValueError, match="earlier node"):
    tree_lib.TreeTopology((-1, 3, 0))
  with pytest.raises(ValueError, match="mode must be"):
    tree_lib.check_mode("topk")
  assert len(lt.small_topologies(7)) >= 40


def test_a_chain_tree_is_token_verification():
  pair = lab.make_markov_pair(1.5, 0.5, 0)
  chain = tree_lib.TreeTopology.from_branching((1, 1, 1))
  for mode in tree_lib.MODES:
    blocks, expected = lt.tree_round_law(pair, chain, mode)
    token_blocks, token_expected = lv.round_law(pair, 3, "token")
    np.testing.assert_allclose(expected, token_expected, atol=1e-14)
    for a, b in zip(blocks, token_blocks):
      np.testing.assert_allclose(a, b, atol=1e-15)


def _tree_grid(topologies, pairs, seq_lens=(2, 3, 4)):
  worst, settings = 0.0, 0
  for certainty, match, seed in pairs:
    pair = lab.make_markov_pair(certainty, match, seed)
    for topo in topologies:
      for mode in tree_lib.MODES:
        blocks, _ = lt.tree_round_law(pair, topo, mode)
        for seq_len in seq_lens:
          law = lt.tree_process_law(pair, topo, seq_len, mode, blocks=blocks)
          worst = max(worst, lab.tv(law, lv.target_law(pair, seq_len)))
          settings += 1
  return worst, settings


def test_trees_are_exact_on_the_lab():
  # Depth <= 3 keeps the laws small (V**4 sequences) for the default run;
  # the slow test covers every tree of <= 7 nodes.
  topologies = [t for t in lt.small_topologies(7) if t.max_depth <= 3]
  worst, settings = _tree_grid(topologies, PAIRS[:3])
  assert settings >= 200 and worst <= TOL, (worst, settings)


@pytest.mark.slow
def test_trees_up_to_7_nodes_are_exact_on_1000_settings():
  worst, settings = _tree_grid(lt.small_topologies(7), PAIRS)
  assert settings >= 1000 and worst <= TOL, (worst, settings)


def test_wider_trees_emit_more_tokens_than_the_chain():
  pair = lab.make_markov_pair(1.5, 0.5, 0)
  _, chain = lv.round_law(pair, 2, "token")
  for mode in tree_lib.MODES:
    _, tree = lt.tree_round_law(pair, (3, 1), mode)
    assert np.all(tree >= chain - 1e-12) and tree.mean() > chain.mean()


# An irregular tree, and one whose root has more children than
# `tree_verify` unrolls (its walk then loops over the child slots).
_IRREGULAR = (-1, -1, -1, 0, 0, 1, 3, 3)
_WIDE = (-1,) * 9 + (0, 0, 1)


@pytest.mark.parametrize("mode", tree_lib.MODES)
@pytest.mark.parametrize("parents", [
    _IRREGULAR, pytest.param(_WIDE, marks=pytest.mark.full)])
def test_greedy_walk_equals_recursive_rejection_with_one_hot_p(mode, parents):
  """The greedy fast path gives `tree_verify`'s outputs when p is one-hot,
  with soft draft laws, repeated and invalid children, and uniforms that
  matter for a soft p (here they must not)."""
  topology = tree_lib.TreeTopology(parents)
  n, vocab, batch = topology.num_nodes, 3, 512
  k_tok, k_valid, k_arg, k_q, k_u = jax.random.split(jax.random.key(0), 5)
  tokens_BxN = jax.random.randint(k_tok, (batch, n), 0, vocab)
  valid_BxN = jax.random.uniform(k_valid, (batch, n)) < 0.9
  argmax_BxN1 = jax.random.randint(k_arg, (batch, n + 1), 0, vocab)
  p_BxN1xV = jax.nn.one_hot(argmax_BxN1, vocab, dtype=jnp.float32)
  q_BxN1xV = jax.nn.softmax(jax.random.normal(k_q, (batch, n + 1, vocab)))
  u_BxN1x2 = jax.random.uniform(k_u, (batch, n + 1, 2))
  sample = lambda u, probs: sampling_lib.sample_from_probs(u, probs)
  want = tree_lib.tree_verify(u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN,
                              valid_BxN, topology, mode, sample)
  got = tree_lib.greedy_tree_verify(argmax_BxN1, tokens_BxN, valid_BxN,
                                    topology)
  for name, a, b in zip(("path", "emitted", "accepted"), want, got):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  # Every depth was reached by some row, so the walk was exercised.
  assert set(np.asarray(got[2]).tolist()) == set(range(topology.max_depth + 1))


@pytest.mark.parametrize("mode", tree_lib.MODES)
@pytest.mark.parametrize("update_residual", [
    True, pytest.param(False, marks=pytest.mark.full)])
def test_a_looped_walk_judges_as_the_unrolled_one(monkeypatch, mode,
                                                  update_residual):
  """Nodes wider than `_UNROLL_CHILDREN` have their children judged in a
  loop: bit for bit the unrolled walk, on soft laws with repeated and
  invalid children (the negative control's walk too)."""
  topology = tree_lib.TreeTopology(_WIDE)
  unroll = tree_lib._UNROLL_CHILDREN
  assert topology.max_children > unroll
  n, vocab, batch = topology.num_nodes, 5, 2048
  k_tok, k_valid, k_p, k_q, k_u = jax.random.split(jax.random.key(1), 5)
  args = (jax.random.uniform(k_u, (batch, n + 1, 2)),
          jax.nn.softmax(2 * jax.random.normal(k_p, (batch, n + 1, vocab))),
          jax.nn.softmax(2 * jax.random.normal(k_q, (batch, n + 1, vocab))),
          jax.random.randint(k_tok, (batch, n), 0, vocab),
          # Half the rows have only the root's last child valid, so the
          # loop's later slots judge, not only skip.
          (jax.random.uniform(k_valid, (batch, n)) < 0.9).at[
              :batch // 2, :unroll].set(False))
  sample = sampling_lib.sample_from_probs
  verify = lambda: jax.jit(lambda *a: tree_lib.tree_verify(
      *a, topology, mode, sample, update_residual))(*args)
  looped = verify()
  monkeypatch.setattr(tree_lib, "_UNROLL_CHILDREN", topology.max_children)
  unrolled = verify()
  for name, a, b in zip(("path", "emitted", "accepted"), looped, unrolled):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  # Rows kept the root's last child, past the unrolled width, and the walk
  # reached every depth.
  assert (np.asarray(looped[0])[:, 0] == unroll).sum() > 100
  assert set(np.asarray(looped[2]).tolist()) == {0, 1, 2}


# --------------------------------------------------- JAX vs the lab law

N = 100_000


def _draft_and_verify(pair, topo, mode, ctx, key):
  """One tree round from context `ctx` for N rows, on the pair's tables."""
  p_rows = jnp.asarray(pair.target_trans_VxV, jnp.float32)
  q_rows = jnp.asarray(pair.draft_trans_VxV, jnp.float32)
  sampling = sampling_lib.SamplingConfig()
  sample = lambda u, probs: sampling_lib.sample_from_probs(u, probs)
  vocab, n = pair.vocab_size, topo.num_nodes
  k_draft, k_gumbel, k_verify = jax.random.split(key, 3)
  u_draft = jax.random.uniform(k_draft, (N, n + 1, topo.max_children))
  gumbel = jax.random.gumbel(k_gumbel, (N, n + 1, 1, vocab))
  u_verify = jax.random.uniform(k_verify, (N, n + 1, 2))
  del sampling

  @jax.jit
  def run(u_draft, gumbel, u_verify):
    tokens = jnp.zeros((N, n), jnp.int32)
    valid = jnp.ones((N, n), bool)
    node_token = lambda u: (jnp.full((N,), ctx, jnp.int32) if u < 0
                            else tokens[:, u])
    # Level by level (node order is topological): children of each node.
    for u in range(-1, n):
      kids = topo.children(u)
      if not kids:
        continue
      q = q_rows[node_token(u)]
      x, ok = tree_lib.draft_children(u_draft[:, u + 1], gumbel[:, u + 1], q,
                                      len(kids), mode, sample)
      tokens = tokens.at[:, list(kids)].set(x)
      valid = valid.at[:, list(kids)].set(ok & (
          True if u < 0 else valid[:, u][:, None]))
    ctx_N1 = jnp.concatenate([jnp.full((N, 1), ctx, jnp.int32), tokens], 1)
    return tree_lib.tree_verify(u_verify, p_rows[ctx_N1], q_rows[ctx_N1],
                                tokens, valid, topo, mode, sample)

  return run(u_draft, gumbel, u_verify)


@pytest.mark.parametrize("branching_or_parents, mode", [
    ((2, 2), "iid"), pytest.param((2, 2), "wor", marks=pytest.mark.full),
    pytest.param((-1, 0, 1, 2, -1, 4, -1), "iid", marks=pytest.mark.slow),
    pytest.param((-1, 0, 1, 2, -1, 4, -1), "wor", marks=pytest.mark.full),
    pytest.param((4,), "wor", marks=pytest.mark.slow)])
def test_jax_tree_round_matches_lab_law(branching_or_parents, mode):
  result = _tree_round_against_law(branching_or_parents, mode, mode)
  assert result.passed, f"{branching_or_parents} {mode}: {result}"


@pytest.mark.parametrize("sampled, law", [
    ("iid", "wor"), pytest.param("wor", "iid", marks=pytest.mark.full)])
def test_tree_round_check_rejects_the_other_modes_rounds(sampled, law):
  """The control of the test above on its own topology: one mode's JAX
  rounds against the other mode's law."""
  result = _tree_round_against_law((2, 2), sampled, law)
  assert not result.passed, f"{sampled} against {law}'s law: {result}"


def _tree_round_against_law(branching_or_parents, mode, law_mode):
  """`check_distribution` of JAX tree rounds drafted and judged in `mode`
  against the lab's law of `law_mode`."""
  pair = lab.make_markov_pair(2.0, 0.4, 1, vocab_size=4)
  if isinstance(branching_or_parents[0], int) and branching_or_parents[0] < 0:
    topo = tree_lib.TreeTopology(branching_or_parents)
  else:
    topo = tree_lib.TreeTopology.from_branching(branching_or_parents)
  ctx = 2
  blocks, _ = lt.tree_round_law(pair, topo, law_mode)
  vocab, depth = pair.vocab_size, topo.max_depth
  _, emitted, accepted = _draft_and_verify(pair, topo, mode, ctx,
                                           jax.random.key(3))
  emitted, accepted = np.asarray(emitted), np.asarray(accepted)
  # id: offset for the emitted length, then the tokens in base V.
  offsets = np.cumsum([0] + [vocab ** (k + 1) for k in range(depth + 1)])
  ids = offsets[accepted].copy()
  for t in range(depth + 1):
    live = t <= accepted
    ids[live] += emitted[live, t] * vocab ** (accepted[live] - t)
  expected = np.concatenate([b[ctx].reshape(-1) for b in blocks])
  return testing.check_distribution(ids, expected)


def test_jax_tree_negative_control_is_rejected():
  """Treating 'wor' drafts as i.i.d. (no renormalisation) is not exact."""
  pair = lab.make_markov_pair(2.0, 0.4, 1, vocab_size=4)
  topo = tree_lib.TreeTopology.from_branching((3,))
  blocks, _ = lt.tree_round_law(pair, topo, "wor")
  # Verify wor-drafted children with the iid rule by drafting wor but
  # judging as iid: compare against the wor law.
  _, emitted, accepted = _wrong_mode(pair, topo)
  vocab = pair.vocab_size
  ids = np.where(np.asarray(accepted) == 0, np.asarray(emitted)[:, 0],
                 vocab + np.asarray(emitted)[:, 0] * vocab
                 + np.asarray(emitted)[:, 1])
  expected = np.concatenate([blocks[0][2].reshape(-1),
                             blocks[1][2].reshape(-1)])
  assert not testing.check_distribution(ids, expected).passed


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _verify_tree(u, p, q, x, topo, mode, update_residual):
  """`tree_verify` compiled once per topology, mode and shape."""
  return tree_lib.tree_verify(u, p, q, x, jnp.ones(x.shape, bool), topo, mode,
                              sampling_lib.sample_from_probs,
                              update_residual=update_residual)


def _wor_tree_law(pair, topo, ctx, judge_mode="wor", update_residual=True,
                  grid=2**12):
  """The law of one round of a tree whose children are drawn without
  replacement from q, as `tree_verify` judges it, computed without
  sampling: float64, the lab's `blocks[k][ctx]` for k = 0..depth, flattened
  and concatenated (k + 1 emitted tokens: k kept nodes, then the last).

  Every draw (an ordered draw of distinct children at each node) is
  enumerated with its Gumbel-top-k probability, and every walk: at each
  node, the first kept child (after rejecting the ones before it) or none.
  A child is kept iff u q'(x) < r(x), a threshold in its own uniform once
  the walk's earlier decisions are fixed, so each threshold h is found by
  bisection on `tree_verify` itself (a rejection's uniform at 1 - 2^-24, a
  keep's at h / 2). Each walk is weighted by its h's, and the token it
  ends with is read off a midpoint grid of that draw's uniform."""
  vocab, depth = pair.vocab_size, topo.max_depth
  p_rows = np.asarray(pair.target_trans_VxV, np.float64)
  q_rows = np.asarray(pair.draft_trans_VxV, np.float64)
  draws = [({}, 1.0)]  # (node -> token, probability)
  for node in range(-1, topo.num_nodes):
    kids = topo.children(node)
    if not kids:
      continue
    grown = []
    for tokens, prob in draws:
      q = q_rows[ctx if node < 0 else tokens[node]]
      for xs in itertools.permutations(range(vocab), len(kids)):
        if all(q[x] > 0 for x in xs):
          grown.append(({**tokens, **dict(zip(kids, xs))}, prob * np.prod(
              [q[x] / (1.0 - q[list(xs[:j])].sum()) for j, x in
               enumerate(xs)])))
    draws = grown
  n, num = topo.num_nodes, len(draws)
  tokens_DxN = np.array([[t[i] for i in range(n)] for t, _ in draws],
                        np.int32)
  weight_D = np.array([w for _, w in draws])
  ctx_DxN1 = np.concatenate([np.full((num, 1), ctx), tokens_DxN], 1)
  laws = (jnp.asarray(p_rows[ctx_DxN1], jnp.float32),
          jnp.asarray(q_rows[ctx_DxN1], jnp.float32))
  verify = lambda u, p, q, x: _verify_tree(u, p, q, x, topo, judge_mode,
                                           update_residual)
  reject = 1.0 - 2.0**-24

  def walks(node, decisions):
    """(decisions [(node, kept)], the node the walk stops at)."""
    kids = topo.children(node)
    for j, kid in enumerate(kids):
      yield from walks(kid, decisions + [(k, False) for k in kids[:j]]
                       + [(kid, True)])
    yield decisions + [(k, False) for k in kids], node

  thresholds = {}  # (decisions before, node) -> h_D

  def uniforms(decisions):
    u = np.full((num, n + 1, 2), 0.5)
    for i, (node, kept) in enumerate(decisions):
      u[:, node, 0] = threshold(decisions[:i], node) / 2 if kept else reject
    return u

  def threshold(before, node):
    key = (tuple(before), node)
    if key not in thresholds:
      lo, hi = np.zeros(num), np.ones(num)
      level = sum(kept for _, kept in before)  # the node's depth - 1
      for _ in range(30):
        mid = (lo + hi) / 2
        u = uniforms(before)
        u[:, node, 0] = mid
        path, _, _ = verify(jnp.asarray(u, jnp.float32), *laws, tokens_DxN)
        kept = np.asarray(path)[:, level] == node
        lo, hi = np.where(kept, mid, lo), np.where(kept, hi, mid)
      thresholds[key] = lo
    return thresholds[key]

  offsets = np.cumsum([0] + [vocab ** (k + 1) for k in range(depth + 1)])
  law = np.zeros(offsets[-1])
  u_G = (np.arange(grid) + 0.5) / grid
  tile = lambda a: jnp.repeat(a, grid, axis=0)
  for decisions, stop in walks(-1, []):
    walk_D = np.ones(num)
    for i, (node, kept) in enumerate(decisions):
      h = threshold(decisions[:i], node)
      walk_D *= h if kept else 1.0 - h
    u = np.repeat(uniforms(decisions)[:, None], grid, axis=1)
    u[:, :, stop + 1, 1] = u_G  # the draw where the walk stops
    _, emitted, accepted = verify(
        jnp.asarray(u.reshape(-1, n + 1, 2), jnp.float32),
        *(tile(a) for a in laws), tile(tokens_DxN))
    emitted = np.asarray(emitted).reshape(num, grid, depth + 1)
    accepted = np.asarray(accepted).reshape(num, grid)
    ids = offsets[accepted].copy()
    for t in range(depth + 1):
      live = t <= accepted
      ids[live] += emitted[..., t][live] * vocab ** (accepted[live] - t)
    np.add.at(law, ids, (weight_D * walk_D)[:, None] / grid)
  return law


@pytest.mark.parametrize("branching, vocab", [
    pytest.param((3,), 4, marks=pytest.mark.full),
    # 216 draws x 7 walks x a 4,096-point grid: 47 s on the 2-core box.
    pytest.param((2, 2), 3, marks=pytest.mark.slow)])
def test_wor_tree_round_law_without_sampling(branching, vocab):
  """tree-wor's round law to grid precision (about 1e-4), against the lab's
  enumeration in two contexts, for three children and (opt-in) for a
  two-level tree: the sampled check above resolves about 1e-2 per outcome
  at N = 1e5. Its controls, judged by the same computation, are the
  audit's mutant (raw q where the renormalised q' belongs: 'iid' judging
  of 'wor' draws) and a residual never updated; each misses by more than
  1e-2 in one of the contexts (the mutant by 1.3e-2 on the two-level tree,
  by 5.6e-2 on three children)."""
  pair = lab.make_markov_pair(2.0, 0.4, 1, vocab_size=vocab)
  topo = tree_lib.TreeTopology.from_branching(branching)
  blocks, _ = lt.tree_round_law(pair, topo, "wor")
  misses = {"iid": 0.0, "no_update": 0.0}
  for ctx in (0, 2):
    want = np.concatenate([b[ctx].reshape(-1) for b in blocks])
    np.testing.assert_allclose(_wor_tree_law(pair, topo, ctx), want,
                               atol=5e-4)
    for name, control in (("iid", dict(judge_mode="iid")),
                          ("no_update", dict(update_residual=False))):
      misses[name] = max(misses[name], np.abs(
          _wor_tree_law(pair, topo, ctx, **control) - want).max())
  assert min(misses.values()) > 1e-2, misses


def _wrong_mode(pair, topo):
  p_rows = jnp.asarray(pair.target_trans_VxV, jnp.float32)
  q_rows = jnp.asarray(pair.draft_trans_VxV, jnp.float32)
  sample = sampling_lib.sample_from_probs
  vocab, n, ctx = pair.vocab_size, topo.num_nodes, 2
  kg, kv = jax.random.split(jax.random.key(9))
  gumbel = jax.random.gumbel(kg, (N, 1, vocab))
  u_verify = jax.random.uniform(kv, (N, n + 1, 2))
  q = jnp.broadcast_to(q_rows[ctx], (N, vocab))
  x, ok = tree_lib.draft_children(None, gumbel, q, n, "wor", sample)
  ctx_N1 = jnp.concatenate([jnp.full((N, 1), ctx, jnp.int32), x], 1)
  return tree_lib.tree_verify(u_verify, p_rows[ctx_N1], q_rows[ctx_N1], x, ok,
                              topo, "iid", sample)


# ------------------------------------------ model side: one-pass tree scoring

@pytest.mark.parametrize("flavour, self_draft", [
    ("gpt2", False), pytest.param("llama", False, marks=pytest.mark.full),
    pytest.param("llama", True, marks=pytest.mark.full)])
def test_tree_decode_matches_causal_paths_and_move_compacts_the_cache(
    flavour, self_draft):
  """A Transformer's tree pass, and a self-draft's (its blocks 0 and 2 of
  3, its own cache)."""
  from specjax.models import TransformerConfig, TransformerLM
  from specjax.models.self_draft import SelfDraft
  config = TransformerConfig(vocab_size=16, d_model=16,
                             num_layers=3 if self_draft else 2,
                             num_heads=2, max_positions=32, flavour=flavour,
                             num_kv_heads=1 if flavour == "llama" else None)
  model = TransformerLM.create(config, 0)
  if self_draft:
    model = SelfDraft.skipping(model, skip=[1])
  topo = tree_lib.TreeTopology((-1, -1, 0, 0, 1, 2))
  rng = np.random.default_rng(0)
  prompt_lengths = np.array([3, 5])
  prompts = rng.integers(0, 16, (2, 5)).astype(np.int32)
  tree_tokens = rng.integers(0, 16, (2, topo.num_nodes + 1)).astype(np.int32)
  # The root is the last prompt token, fed at slot lengths - 1 + 0.
  tree_tokens[:, 0] = prompts[np.arange(2), prompt_lengths - 1]
  call = jax.jit(lambda m, x, c: m(x, c))  # eager nnx forwards are slow
  cache = model.init_cache(2, 32)
  _, cache = call(model, jnp.asarray(prompts), cache)
  cache = cache.replace(lengths=jnp.asarray(prompt_lengths - 1, jnp.int32))
  logits, tree_cache = jax.jit(lambda m, x, c: m.tree_decode(
      x, c, topo.depth_with_root(), topo.ancestor_table()))(
          model, jnp.asarray(tree_tokens), cache)
  ancestors = topo.ancestor_table()

  def causal_last(seqs):
    """Last-position logits of each sequence, in ONE causal call (right
    padding cannot change earlier positions)."""
    width = max(len(x) for x in seqs)
    padded = np.zeros((len(seqs), width), np.int32)
    for i, x in enumerate(seqs):
      padded[i, :len(x)] = x
    full = jax.jit(lambda m, x: m.logits(x))(model, jnp.asarray(padded))
    return np.stack([full[i, len(x) - 1] for i, x in enumerate(seqs)])

  seqs = [np.concatenate([prompts[b, :prompt_lengths[b] - 1],
                          tree_tokens[b, np.flatnonzero(ancestors[t])]])
          for b in range(2) for t in range(topo.num_nodes + 1)]
  np.testing.assert_allclose(
      np.asarray(logits).reshape(len(seqs), -1), causal_last(seqs), atol=2e-4)
  # Keep the path root -> node 0 -> node 2 -> node 5 and move it into place.
  path = np.flatnonzero(ancestors[6])
  assert path.tolist() == [0, 1, 3, 6]
  lengths = jnp.asarray(prompt_lengths - 1, jnp.int32)
  src = lengths[:, None] + jnp.asarray(path)[None]
  dst = lengths[:, None] + jnp.arange(len(path))[None]
  moved = tree_cache.move(src, dst).replace(lengths=lengths + len(path))
  nxt = rng.integers(0, 16, (2, 1)).astype(np.int32)
  step_logits, _ = call(model, jnp.asarray(nxt), moved)
  seqs = [np.concatenate([prompts[b, :prompt_lengths[b] - 1],
                          tree_tokens[b, path], nxt[b]]) for b in range(2)]
  np.testing.assert_allclose(np.asarray(step_logits)[:, 0], causal_last(seqs),
                             atol=2e-4)


# ------------------------------------ trees inside speculative_generate
# (greedy output equals generate's, for every tree and draft kind, in
# tests/test_greedy.py)

def test_trees_refuse_bad_inputs_before_tracing():
  import specjax as sj
  from specjax.models.prompt_lookup import PromptLookupDraft
  target = testing.toy_transformer(16, 0, num_layers=2, max_positions=64)
  prompts, lengths = np.ones((1, 3), np.int32), [3]
  run = lambda draft, **kw: sj.speculative_generate(
      target, draft, prompts, lengths, jax.random.key(0),
      **{"max_new_tokens": 4, **kw})
  with pytest.raises(ValueError, match="scores a tree in one pass"):
    run(PromptLookupDraft(16), verifier="tree:2,1")
  with pytest.raises(ValueError, match="depth 2, so gamma is 2"):
    run(target, verifier="tree:2,1", gamma=3)
  with pytest.raises(ValueError, match="autotune.auto_rule"):
    run(target, verifier="tree-wor:2,1", gamma="auto")
  with pytest.raises(ValueError, match="depth 2, so gamma is 2"):
    run(target, verifier="tree-wor:2,1", gamma=sj.Confidence(0.5, 2))
  with pytest.raises(ValueError, match="more than the vocabulary"):
    run(target, verifier="tree-wor:17")
  # A million nodes: refused at once, before they are built (finding
  # children was quadratic).
  with pytest.raises(ValueError, match="1,001,000 nodes is larger"):
    run(target, verifier="tree-wor:1000,1000")
  with pytest.raises(ValueError, match="gamma is required"):
    run(target, verifier="token")
  # A tree needs a cache slot per node: 3 + 60 + 4 nodes - 1 = 66 > 64,
  # where the chain of the same depth fits (3 + 60 + 2 - 1 = 64).
  with pytest.raises(ValueError, match="needs 66 positions"):
    run(target, verifier="tree:2,1", max_new_tokens=60)
  with pytest.raises(ValueError, match="speculative_generate"):
    sj.verify_step(target, target.init_cache(1, 8), [1], [[1]],
                   np.ones((1, 1, 16), np.float32) / 16, jax.random.key(0),
                   sj.GREEDY, verifier="tree:1")
