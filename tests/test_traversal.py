"""Traversal Verification in JAX (`specjax.decode.traversal`) and as a
verifier of the compiled loop ("traversal:2,1", "traversal-wor:2,1").

The round's law is computed from the JAX code without sampling and compared
with the lab's enumeration (`specjax.lab.multidraft.traversal_round_law`);
the REAL loop on the lab's Markov chains follows the target's law and
rejects the negative control; greedy decoding equals `generate`; and the
rule keeps more drafts than token-level tree verification of the same
tree."""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax import sampling as sampling_lib
from specjax.decode import traversal as traversal_lib
from specjax.decode import tree as tree_lib
from specjax.decode import verifiers as vf
from specjax.lab import models as lab_models
from specjax.lab import multidraft as md

# tests/ is on sys.path: the real-loop harness and its fixture, and the
# greedy settings.
from test_constraint import _check as _check_constrained
from test_constraint import _run as _run_constrained
from test_constraint import lab_setup  # pylint: disable=unused-import
from test_greedy import SETTINGS, _reference, _self_skip, _tree_transformer
from test_verifiers import EOS, TOP_K_P, _run_loop, _transformed
from test_verifiers import lab_loop  # pylint: disable=unused-import


# ---------------------------------------------------------------- registry

def test_registry_specs_round_trip_and_the_control_is_labelled():
  for spec in ("traversal:3,2,1,1", "traversal-wor:3,2,1,1",
               "traversal:parents=-1,-1,0,0,1",
               "traversal-no-final-residual:2,1"):
    v = vf.get_verifier(spec)
    assert isinstance(v, vf.TraversalVerifier) and v.spec == spec
    assert vf.get_verifier(v.spec) == v and hash(v) == hash(
        vf.get_verifier(spec))
  v = vf.get_verifier("traversal-wor:3,2,1,1")
  assert v.exact and not v.control and v.mode == "wor" and v.depth == 4
  assert v != vf.get_verifier("tree-wor:3,2,1,1")  # another rule, compile
  control = vf.get_verifier("traversal-no-final-residual:2,1")
  assert control.control and not control.exact and not control.greedy_walk
  for spec, match in (("traversal", "branching per depth"),
                      ("traversal-wor:2,x", "integers"),
                      ("traversal:0", r"branching\[0\]")):
    with pytest.raises(ValueError, match=match):
      vf.get_verifier(spec)


def test_the_schedule_visits_each_node_depth_first_once():
  topology = tree_lib.TreeTopology((-1, -1, 0, 0, 1, 3))
  enter, node, depth, parent = traversal_lib._schedule(topology)
  assert list(zip(enter.tolist(), node.tolist())) == [
      (1, 0), (1, 2), (0, 2), (1, 3), (1, 5), (0, 5), (0, 3), (0, 0),
      (1, 1), (1, 4), (0, 4), (0, 1)]
  assert depth.tolist() == [topology.depth[v] for v in node]
  assert parent.tolist() == [topology.parents[v] + 1 for v in node]
  # A chain deeper than Python's recursion limit.
  chain = tree_lib.TreeTopology.from_branching((1,) * 3000)
  assert len(traversal_lib._schedule(chain)[0]) == 6000


# ------------------------------------ the JAX round against the lab's law

@functools.partial(jax.jit, static_argnums=(5, 6, 7))
def _verify(u, p, q, tokens, valid, topology, mode, final_residual):
  return traversal_lib.traversal_verify(
      u, p, q, tokens, valid, topology, mode,
      sampling_lib.sample_from_probs, final_residual=final_residual)


def _draws(pair, topology, mode, ctx):
  """Every tree the draft can propose from context `ctx` (an index into
  the pair's `[V + 1]` context rows, BOS last): int32 tokens `[R, N]`, bool
  valid `[R, N]` and float64 probabilities `[R]` (children i.i.d., or an
  ordered draw without replacement; a "wor" child past q's support is
  invalid, as `tree.draft_children` marks it, and so is all under it)."""
  q_rows = pair.draft_rows_CxV
  draws = [({}, {}, 1.0)]  # (node -> token, node -> valid, probability)
  for node in range(-1, topology.num_nodes):
    kids = topology.children(node)
    if not kids:
      continue
    grown = []
    for tokens, valid, prob in draws:
      if node >= 0 and not valid[node]:
        grown.append(({**tokens, **dict.fromkeys(kids, 0)},
                      {**valid, **dict.fromkeys(kids, False)}, prob))
        continue
      q = q_rows[ctx if node < 0 else tokens[node]]
      support = np.flatnonzero(q > 0)
      if mode == "iid":
        tuples = itertools.product(support, repeat=len(kids))
      else:
        tuples = itertools.permutations(support, min(len(kids), len(support)))
      for xs in tuples:
        if mode == "iid":
          pr = np.prod(q[list(xs)])
        else:
          pr = np.prod([q[x] / (1.0 - q[list(xs[:j])].sum())
                        for j, x in enumerate(xs)])
        xs = list(xs) + [0] * (len(kids) - len(xs))
        grown.append(({**tokens, **dict(zip(kids, map(int, xs)))},
                      {**valid, **{k: j < len(support) or mode == "iid"
                                   for j, k in enumerate(kids)}},
                      prob * pr))
    draws = grown
  n = topology.num_nodes
  return (np.array([[t[i] for i in range(n)] for t, _, _ in draws], np.int32),
          np.array([[v[i] for i in range(n)] for _, v, _ in draws], bool),
          np.array([w for _, _, w in draws]))


def _post_order(topology, node=-1):
  """The nodes in the order the traversal reaches them as leaves."""
  for kid in topology.children(node):
    yield from _post_order(topology, kid)
  if node >= 0:
    yield node


def _jax_round_law(pair, topology, mode, ctx, final_residual=True,
                   steps=30):
  """The law of one JAX traversal round from context `ctx`, computed
  without sampling: float64, laid out as the lab's `blocks[k][ctx]` for
  k = 0..depth, flattened and concatenated (k kept nodes, then the final
  token).

  Every draft tree is enumerated with its probability (`_draws`). The
  round ends at the i-th node in post-order (the root last) iff the nodes
  before it are removed and its uniform u[v + 1, 0] is below a threshold
  h_v set by those removals; it then emits the path to v and the inverse
  CDF of u[v + 1, 1] under v's final law. Both (h_v, and that law's CDF at
  each token) are found by bisection on `traversal_verify` itself, to
  2^-`steps`, every node and token at once: copy (i, t) of the draws
  rejects the nodes before the i-th (uniform 1 - 2^-24), and bisects first
  its keep threshold, then P(final token < t + 1).
  """
  vocab, depth, n = pair.vocab_size, topology.max_depth, topology.num_nodes
  tokens_RxN, valid_RxN, prob_R = _draws(pair, topology, mode, ctx)
  rows = len(prob_R)
  ends = list(_post_order(topology)) + [-1]  # where a round can end
  copies = (len(ends), vocab - 1)  # (W, T)
  tile = lambda a: np.broadcast_to(a, copies + a.shape).reshape(
      (-1,) + a.shape[1:])
  ctx_RxN1 = np.concatenate([np.full((rows, 1), ctx), tokens_RxN], 1)
  laws = tuple(jnp.asarray(tile(a)) for a in (
      pair.target_rows_CxV[ctx_RxN1].astype(np.float32),
      pair.draft_rows_CxV[ctx_RxN1].astype(np.float32), tokens_RxN,
      valid_RxN))
  node_depth = topology.depth_with_root()
  end_W = np.array(ends)
  w_W11, t_T1 = (np.arange(len(ends))[:, None, None],
                 np.arange(vocab - 1)[:, None])

  def run(u_WxTxRxN1x2):
    out = _verify(jnp.asarray(u_WxTxRxN1x2.reshape((-1, n + 1, 2)),
                              jnp.float32), *laws, topology, mode,
                  final_residual)
    return [np.asarray(a).reshape(copies + (rows,) + a.shape[1:])
            for a in out]

  def bisect(u_WxTxRxN1x2, slot, predicate):
    """Per copy and row, sup{u at (its end node, slot): predicate}."""
    lo, hi = np.zeros(copies + (rows,)), np.ones(copies + (rows,))
    for _ in range(steps):
      mid = (lo + hi) / 2
      u = u_WxTxRxN1x2.copy()
      u[w_W11, t_T1, np.arange(rows), (end_W + 1)[:, None, None], slot] = mid
      ok = predicate(*run(u))
      lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo

  def ends_at_its_node(path, _, accepted):
    at_W11 = end_W[:, None, None]
    depth_W11 = node_depth[end_W + 1][:, None, None]
    on_path = np.take_along_axis(path, np.maximum(depth_W11 - 1, 0)[
        ..., None], axis=-1)[..., 0] == at_W11
    return (accepted == depth_W11) & ((at_W11 < 0) | on_path)

  u = np.full(copies + (rows, n + 1, 2), 0.5)
  for i, v in enumerate(ends[:-1]):  # copies after v's reject it
    u[i + 1:, :, :, v + 1, 0] = 1.0 - 2.0 ** -24
  h_WxTxR = bisect(u, 0, ends_at_its_node)
  h_WxTxR[-1] = 1.0  # the root is always kept
  u[w_W11, t_T1, np.arange(rows), (end_W + 1)[:, None, None], 0] = (
      h_WxTxR / 2)  # inside the keep cell
  path, emitted, accepted = run(u)
  reached_WxR = np.cumprod(np.concatenate([
      np.ones((1, rows)), 1.0 - h_WxTxR[:-1, 0]]), axis=0)
  weight_WxR = prob_R * reached_WxR * h_WxTxR[:, 0]
  assert np.all(ends_at_its_node(path, emitted, accepted)[:, 0]
                | (weight_WxR < 1e-7))
  cdf_WxTxR = bisect(u, 1, lambda _, emitted, accepted: np.take_along_axis(
      emitted, accepted[..., None], axis=-1)[..., 0] < t_T1 + 1)
  cdf_WxRxV1 = np.concatenate([np.zeros((len(ends), rows, 1)),
                               cdf_WxTxR.transpose(0, 2, 1),
                               np.ones((len(ends), rows, 1))], axis=-1)

  offsets = np.cumsum([0] + [vocab ** (k + 1) for k in range(depth + 1)])
  law = np.zeros(offsets[-1])
  for i, v in enumerate(ends):
    kept = node_depth[v + 1]
    ids = np.full(rows, offsets[kept])
    for j in range(kept):
      ids += emitted[i, 0, :, j] * vocab ** (kept - j)
    for y in range(vocab):
      np.add.at(law, ids + y, weight_WxR[i] * np.diff(
          cdf_WxRxV1[i], axis=-1)[:, y])
  return law


def _lab_round_law(pair, topology, mode, ctx, control=None):
  blocks, _ = md.traversal_round_law(pair, topology, mode, control)
  return np.concatenate([b[ctx].reshape(-1) for b in blocks])


def _topology(spec):
  if spec[0] < 0:
    return tree_lib.TreeTopology(spec)
  return tree_lib.TreeTopology.from_branching(spec)


# Per entry: float32 weights and residuals against float64, and the
# bisection's 2^-30 (measured: at most 3e-8 on the fast tier's cases).
ATOL = 2e-7


@pytest.mark.parametrize("spec, mode", [
    ((2, 1), "iid"), ((2, 1), "wor"),
    ((1, 1, 1), "iid"),  # a chain: block verification
    ((-1, -1, 0, 0, 1), "wor"),  # irregular
    pytest.param((2, 2), "iid", marks=pytest.mark.full),
    pytest.param((2, 2), "wor", marks=pytest.mark.full),
    pytest.param((3, 1), "wor", marks=pytest.mark.full),
    pytest.param((-1, 0, 1, -1, 3, -1), "iid", marks=pytest.mark.full)])
def test_jax_round_law_equals_the_lab_law(spec, mode):
  """The JAX round's law, to float32 rounding, is the lab's enumeration,
  in two contexts (BOS and a token); the negative control's JAX law is the
  lab's control law, and misses the exact law."""
  pair = lab.make_markov_pair(2.0, 0.4, 1, vocab_size=3)
  topology = _topology(spec)
  miss = 0.0
  for ctx in (pair.vocab_size, 1):
    want = _lab_round_law(pair, topology, mode, ctx)
    got = _jax_round_law(pair, topology, mode, ctx)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    assert abs(got.sum() - 1.0) < 1e-5
    control = _jax_round_law(pair, topology, mode, ctx, final_residual=False)
    np.testing.assert_allclose(
        control, _lab_round_law(pair, topology, mode, ctx,
                                "no_final_residual"), atol=ATOL, rtol=0)
    miss = max(miss, np.abs(control - want).max())
  assert miss > 1e-2, miss


@pytest.mark.full
def test_jax_round_law_with_children_past_q_support():
  """Under top-k and top-p q keeps 1-3 of 4 tokens: a wor node of three
  children has invalid ones, skipped without touching its state."""
  pair = _transformed(lab.make_markov_pair(1.5, 0.5, 0, vocab_size=4),
                      TOP_K_P)
  topology = _topology((3, 1))
  # After token 0 q keeps {0, 3}: the root's third child is invalid.
  assert not _draws(pair, topology, "wor", 0)[1].all()
  for ctx in (0, 4):
    np.testing.assert_allclose(
        _jax_round_law(pair, topology, "wor", ctx),
        _lab_round_law(pair, topology, "wor", ctx), atol=ATOL, rtol=0)


# --------------------------------------------------------- greedy (T = 0)

_IRREGULAR = (-1, -1, -1, 0, 0, 1, 3, 3)


@pytest.mark.parametrize("mode", tree_lib.MODES)
def test_one_hot_p_gives_the_greedy_tree_walk(mode):
  """With p one-hot on the argmax, traversal keeps what the greedy walk
  keeps (so the loop's greedy fast path is traversal's too), with soft q,
  invalid children, and uniforms that matter for a soft p; "wor" siblings
  are distinct, as a draw without replacement makes them."""
  topology = tree_lib.TreeTopology(_IRREGULAR)
  n, vocab, batch = topology.num_nodes, 3, 1024
  k_tok, k_valid, k_arg, k_q, k_u = jax.random.split(jax.random.key(0), 5)
  if mode == "iid":
    tokens_BxN = jax.random.randint(k_tok, (batch, n), 0, vocab)
  else:
    tokens_BxN = jnp.zeros((batch, n), jnp.int32)
    for i, u in enumerate(range(-1, n)):
      kids = topology.children(u)
      if kids:
        perm_BxV = jnp.argsort(jax.random.uniform(
            jax.random.fold_in(k_tok, i), (batch, vocab)), axis=1)
        tokens_BxN = tokens_BxN.at[:, list(kids)].set(
            perm_BxV[:, :len(kids)].astype(jnp.int32))
  valid_BxN = jax.random.uniform(k_valid, (batch, n)) < 0.85
  argmax_BxN1 = jax.random.randint(k_arg, (batch, n + 1), 0, vocab)
  p_BxN1xV = jax.nn.one_hot(argmax_BxN1, vocab, dtype=jnp.float32)
  q_BxN1xV = jax.nn.softmax(jax.random.normal(k_q, (batch, n + 1, vocab)))
  u_BxN1x2 = jax.random.uniform(k_u, (batch, n + 1, 2))
  got = _verify(u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                topology, mode, True)
  want = tree_lib.greedy_tree_verify(argmax_BxN1, tokens_BxN, valid_BxN,
                                     topology)
  for name, a, b in zip(("path", "emitted", "accepted"), got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  assert set(np.asarray(got[2]).tolist()) == set(range(topology.max_depth + 1))


@dataclasses.dataclass(frozen=True)
class _NoGreedyWalk(vf.TraversalVerifier):
  """Traversal without the loop's greedy fast path: at T = 0 the loop runs
  `traversal_verify` on one-hot laws."""
  name = "traversal-no-greedy-walk"
  greedy_walk = False


@pytest.mark.parametrize("setting, draft, verifier", [
    # A Transformer target and another Transformer drafting level by level.
    ("tree:llama", _tree_transformer, _NoGreedyWalk((2, 2, 1), "iid")),
    # A self-draft (blocks 0 and 2 of 3, its own cache), an irregular tree.
    pytest.param(
        "self-tree", _self_skip,
        _NoGreedyWalk(tree_lib.TreeTopology((-1, -1, 0, 1, 2)), "wor"),
        marks=pytest.mark.full)])
def test_greedy_traversal_equals_generate(setting, draft, verifier):
  """Greedy speculative decoding through `traversal_verify` itself (not the
  loop's greedy walk) returns `generate`'s tokens and lengths, with ragged
  prompts and EOS. The registered "traversal:..." specs take the greedy
  walk at T = 0: tests/test_greedy.py's traversal cases."""
  name, setting = setting, SETTINGS[setting]
  target = setting.target()
  batch, seed, key = 4, 9, 0
  prompts, lengths = setting.prompts(batch, seed)
  ref = _reference(name, batch, seed,
                   key if setting.ref_key is None else setting.ref_key)
  out = sj.speculative_generate(
      target, draft(target, ref), prompts, lengths, jax.random.key(key),
      verifier=verifier, max_new_tokens=setting.max_new_tokens,
      sampling=sj.GREEDY, eos_id=setting.eos_id)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  s = out.summary()
  depth = vf.get_verifier(verifier).depth
  assert s["accepted"] <= s["verified"] <= depth * s["rounds"]
  assert np.asarray(out.stats.accept_hist)[:, 1:].sum() > 0  # paths kept


# ------------------------------------------ the REAL loop on the lab (T = 1)

@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    # The fast tier checks the JAX round against the lab's exact law.
    pytest.param("traversal:2,1", marks=pytest.mark.full),
    pytest.param("traversal-wor:2,1", marks=pytest.mark.full),
    pytest.param("traversal:parents=-1,-1,-1,0,0,1,3",
                 marks=pytest.mark.full)])
def test_real_loop_traversal_on_the_lab_is_exact(lab_loop, spec):
  """The compiled tree round judged by traversal (10^5 ragged rows, EOS):
  the first 2 (depth + 1) tokens follow the target's law."""
  depth = vf.get_verifier(spec).depth
  result, out = _run_loop(lab_loop, spec, depth, EOS)
  assert result.passed, f"{spec}: {result}"
  hist = np.asarray(out.stats.accept_hist)
  assert ((hist[:, depth] >= 1)
          & (np.asarray(out.stats.rounds) > hist[:, depth])).sum() > 1000
  assert np.asarray(out.lengths).min() < 2 * (depth + 1)
  s = out.summary()
  assert s["accepted"] <= s["verified"] <= depth * s["rounds"]


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_rejects_the_traversal_control(lab_loop):
  result, _ = _run_loop(lab_loop, "traversal-no-final-residual:2,1", 2, EOS)
  assert not result.passed, str(result)


@pytest.mark.big_batch
@pytest.mark.full
@pytest.mark.parametrize("spec", ["traversal-wor:3,1", "traversal:2,1"])
def test_real_loop_traversal_under_top_k_top_p_is_exact(lab_loop, spec):
  """Temperature, top-k and top-p at once: zeros in p and q, and (wor:3,1)
  children past q's support."""
  depth = vf.get_verifier(spec).depth
  result, _ = _run_loop(lab_loop, spec, depth, EOS, TOP_K_P)
  assert result.passed, f"{spec}: {result}"


@pytest.mark.big_batch
@pytest.mark.full
def test_constrained_loop_with_traversal_samples_the_constrained_target(
    lab_setup):
  """Under a constraint (the lab's regular language, EOS at final states)
  both models' laws are masked at every node before traversal judges them:
  the first 6 tokens of 10^5 ragged rows follow the constrained target's
  law (gamma = 2, the tree's depth)."""
  out = _run_constrained(lab_setup, "traversal-wor:2,1")
  for result in _check_constrained(lab_setup, out, 6, None):
    assert result.passed, str(result)


def test_the_control_warns_when_it_decodes(lab_loop):
  _, target, draft, prompts, lengths, *_ = lab_loop
  with pytest.warns(UserWarning, match="negative control"), pytest.raises(
      ValueError, match="max_new_tokens"):
    sj.speculative_generate(target, draft, prompts, lengths,
                            jax.random.key(0), max_new_tokens=0,
                            verifier="traversal-no-final-residual:2,1")


# ------------------------------------- traversal keeps more than the tree

def _paired_gain(a, b):
  """(gain, se): tokens per target call of `a` minus `b`, pooled ratios of
  sums, with a paired (row by row, delta-method) standard error."""
  terms, ratios = [], []
  for out in (a, b):
    tokens_B = np.asarray(out.lengths, np.float64)
    calls_B = np.asarray(out.stats.target_calls, np.float64)
    ratio = tokens_B.sum() / calls_B.sum()
    ratios.append(ratio)
    terms.append((tokens_B - ratio * calls_B) / calls_B.mean())
  diff_B = terms[0] - terms[1]
  return ratios[0] - ratios[1], diff_B.std(ddof=1) / math.sqrt(len(diff_B))


@pytest.mark.big_batch
@pytest.mark.optimized
@pytest.mark.full
@pytest.mark.parametrize("mode", ["", "-wor"])
def test_traversal_keeps_more_tokens_per_target_call_than_the_tree(mode):
  """Same tree, models and keys at T = 1 on 10^4 rows: traversal's
  tokens per target call exceed token-level verification's by a paired
  interval clear of 0 (the lab: +0.116 drafts kept per round for tree
  3,2,1 on this pair, i.i.d., averaged over its contexts)."""
  pair = lab.make_markov_pair(2.0, 0.4, 1)
  target, draft = lab_models.markov_lms(pair)
  rows = 10_000
  prompts = np.tile(np.array([[3, 5]], np.int32), (rows, 1))
  outs = {}
  for rule in ("tree", "traversal"):
    outs[rule] = sj.speculative_generate(
        target, draft, prompts, np.full(rows, 2, np.int32), jax.random.key(4),
        max_new_tokens=32, verifier=f"{rule}{mode}:3,2,1")
  gain, se = _paired_gain(outs["traversal"], outs["tree"])
  summaries = {k: o.summary() for k, o in outs.items()}
  assert gain == pytest.approx(
      summaries["traversal"]["tokens_per_target_call"]
      - summaries["tree"]["tokens_per_target_call"])
  print(f"tree{mode}:3,2,1 tokens per target call: traversal "
        f"{summaries['traversal']['tokens_per_target_call']:.4f}, tree "
        f"{summaries['tree']['tokens_per_target_call']:.4f}, gain "
        f"{gain:+.4f} +- {1.96 * se:.4f} (95%)")
  assert gain - 3 * se > 0, (gain, se)
