"""SpecTr's K-SEQ in JAX (`specjax.decode.kseq`) and as a verifier of the
compiled loop ("spectr:2,1", "spectr:3,2,1").

The one-node law of the JAX rule is computed without sampling and compared
with the lab's enumeration (`specjax.lab.multidraft.kseq_law`), its
acceptance too; the REAL loop on the lab's Markov chains (a depth-2 tree)
follows the target's law and rejects the negative control; one-hot p gives
the greedy tree walk, and greedy decoding through K-SEQ itself equals
`generate`."""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax import sampling as sampling_lib
from specjax.decode import kseq as kseq_lib
from specjax.decode import tree as tree_lib
from specjax.decode import verifiers as vf
from specjax.lab import models as lab_models
from specjax.lab import multidraft as md

# tests/ is on sys.path: the real-loop harness and its fixture, and the
# greedy settings.
from test_greedy import SETTINGS, _reference, _tree_transformer
from test_traversal import _paired_gain
from test_verifiers import EOS, TOP_K_P, _run_loop
from test_verifiers import lab_loop  # pylint: disable=unused-import


# ---------------------------------------------------------------- registry

def test_registry_specs_round_trip_and_the_control_is_labelled():
  for spec in ("spectr:3,2,1", "spectr:parents=-1,-1,0,0,1",
               "spectr-wrong-residual:2,1"):
    v = vf.get_verifier(spec)
    assert isinstance(v, vf.KSeqVerifier) and v.spec == spec
    assert vf.get_verifier(v.spec) == v and hash(v) == hash(
        vf.get_verifier(spec))
  v = vf.get_verifier("spectr:3,2,1")
  assert v.exact and not v.control and v.greedy_walk and v.depth == 3
  assert v != vf.get_verifier("tree:3,2,1")  # another rule, compile
  control = vf.get_verifier("spectr-wrong-residual:2,1")
  assert control.control and not control.exact and not control.greedy_walk
  with pytest.raises(ValueError, match="i.i.d."):
    vf.KSeqVerifier((2, 1), "wor")
  for spec, match in (("spectr", "branching per depth"),
                      ("spectr:2,x", "integers")):
    with pytest.raises(ValueError, match=match):
      vf.get_verifier(spec)
  with pytest.raises(ValueError, match="control"):
    kseq_lib.kseq_tree_verify(
        jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2)) / 2, jnp.ones((1, 2, 2)) / 2,
        jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool),
        tree_lib.TreeTopology((-1,)), sampling_lib.sample_from_probs,
        control="wrong_residual")


# ------------------------------------------------------------------ rho

def test_rho_matches_the_lab_on_its_grid():
  """The float32 bisection's rho is the lab's float64 root to 1e-5
  (relative; measured at most 1.9e-6, where f is flat at its root), on
  every lab setting and k = 0..4 (k = 0, a leaf: 1), and on the exact side
  up to float32 rounding: f(rho) <= 1e-6 in float64."""
  settings = md.lab_settings()
  p_SxV = np.stack([s.p_V for s in settings])
  q_SxV = np.stack([s.q_V for s in settings])
  for k in range(5):
    got = np.asarray(kseq_lib.kseq_rho(
        jnp.asarray(p_SxV, jnp.float32), jnp.asarray(q_SxV, jnp.float32),
        jnp.full((len(settings),), k)))
    want = np.array([md.kseq_rho(s.p_V, s.q_V, k) if k else 1.0
                     for s in settings])
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"k={k}")
    beta_S = np.minimum(q_SxV, p_SxV / got[:, None].astype(np.float64)).sum(
        -1)
    assert np.all(1.0 - (1.0 - beta_S) ** k - got * beta_S <= 1e-6), k


# -------------------------------- the JAX node law against the lab's law

@functools.partial(jax.jit, static_argnums=(5, 6))
def _verify(u, p, q, tokens, valid, topology, control):
  return kseq_lib.kseq_tree_verify(u, p, q, tokens, valid, topology,
                                   sampling_lib.sample_from_probs,
                                   control=control)


def _jax_node_law(p_V, q_V, k, control=None, steps=30):
  """(law `[V]`, P(a child is kept), P(the token emitted is a child's)) of
  the JAX rule at the root of a depth-1 tree of k i.i.d. children,
  computed without sampling, float64 (the lab's acceptance is the last).

  Every draft tuple is enumerated with its probability. Child j's keep
  probability is found by bisection on its uniform u[j, 0] (the children
  before it rejected: u = 1 - 2^-24), the final token's CDF by bisection
  on u[0, 1] with every child rejected, each to 2^-`steps`; the law is
  then sum_j P(j first kept) delta(x_j) + P(none kept) residual.
  """
  vocab = len(p_V)
  tokens_RxK = np.array(list(itertools.product(range(vocab), repeat=k)),
                        np.int32)
  prob_R = np.prod(q_V[tokens_RxK], axis=1)
  tokens_RxK, prob_R = tokens_RxK[prob_R > 0], prob_R[prob_R > 0]
  rows = len(prob_R)
  topology = tree_lib.TreeTopology.from_branching((k,))
  laws = (jnp.asarray(np.broadcast_to(p_V, (rows, k + 1, vocab)), jnp.float32),
          jnp.asarray(np.broadcast_to(q_V, (rows, k + 1, vocab)), jnp.float32),
          jnp.asarray(tokens_RxK), jnp.ones((rows, k), bool))
  reject = 1.0 - 2.0 ** -24

  def bisect(u_Rx2, index, slot, predicate):
    lo, hi = np.zeros(rows), np.ones(rows)
    base = np.broadcast_to(u_Rx2, (rows, k + 1, 2)).copy()
    for _ in range(steps):
      mid = (lo + hi) / 2
      base[:, index, slot] = mid
      out = [np.asarray(a) for a in _verify(
          jnp.asarray(base, jnp.float32), *laws, topology, control)]
      ok = predicate(*out)
      lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo

  keep_RxK = np.zeros((rows, k))
  for j in range(k):
    u = np.full((k + 1, 2), 0.5)
    u[:j, 0] = reject
    keep_RxK[:, j] = bisect(u, j, 0, lambda path, *_, j=j: path[:, 0] == j)
  reach_RxK1 = np.cumprod(np.concatenate(
      [np.ones((rows, 1)), 1.0 - keep_RxK], axis=1), axis=1)
  u = np.full((k + 1, 2), 0.5)
  u[:k, 0] = reject
  cdf_RxV = np.ones((rows, vocab))
  for t in range(vocab - 1):
    cdf_RxV[:, t] = bisect(u, 0, 1, lambda _, emitted, accepted, t=t: (
        accepted == 0) & (emitted[:, 0] <= t))
  residual_RxV = np.diff(cdf_RxV, axis=1, prepend=0.0)
  law_V = prob_R @ (reach_RxK1[:, k:] * residual_RxV)
  kept = 0.0
  for j in range(k):
    mass_R = prob_R * reach_RxK1[:, j] * keep_RxK[:, j]
    np.add.at(law_V, tokens_RxK[:, j], mass_R)
    kept += mass_R.sum()
  drafted_RxV = (tokens_RxK[:, :, None] == np.arange(vocab)).any(1)
  hit = kept + prob_R @ (reach_RxK1[:, k] * np.where(
      drafted_RxV, residual_RxV, 0.0).sum(1))
  return law_V, kept, hit


# Per entry: float32 rho, ratios and residual against float64, and the
# bisection's 2^-30 (measured: at most 7.6e-8 on these cases).
ATOL = 2e-7


@pytest.mark.parametrize("k", [1, 2, pytest.param(3, marks=pytest.mark.full)])
def test_jax_node_law_equals_the_lab_law(k):
  """On a depth-1 tree of k children, the JAX rule's law and acceptance are
  the lab's `kseq_law` (p itself) to float32 rounding, over random and
  adversarial lab settings, and a child is kept exactly when the token is
  a child's (the residual never emits a rejected child's token); the
  negative control's are the lab's control law, which misses p for
  k >= 2."""
  settings = [s for i, s in enumerate(md.lab_settings(vocab=4))
              if i in (0, 3, 7, 12, 13, 15, 17)]
  miss = 0.0
  for s in settings:
    want_V, want_acc = md.kseq_law(s.p_V, s.q_V, k)
    got_V, got_kept, got_acc = _jax_node_law(s.p_V, s.q_V, k)
    np.testing.assert_allclose(got_V, want_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    np.testing.assert_allclose(got_V, s.p_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    assert abs(got_acc - want_acc) < ATOL, (s.name, got_acc, want_acc)
    # The residual is 0 on every token a child could be rejected on.
    assert abs(got_kept - got_acc) < ATOL, (s.name, got_kept, got_acc)
    control_V, _, control_acc = _jax_node_law(s.p_V, s.q_V, k, control=True)
    lab_V, lab_acc = md.kseq_law(s.p_V, s.q_V, k, "wrong_residual")
    np.testing.assert_allclose(control_V, lab_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    assert abs(control_acc - lab_acc) < ATOL
    miss = max(miss, np.abs(control_V - s.p_V).max())
  if k >= 2:
    assert miss > 1e-2, miss


# --------------------------------------------------------- greedy (T = 0)

_IRREGULAR = (-1, -1, -1, 0, 0, 1, 3, 3)


def test_one_hot_p_gives_the_greedy_tree_walk():
  """With p one-hot on the argmax, K-SEQ keeps what the greedy walk keeps
  (so the loop's greedy fast path is K-SEQ's too), with soft q, invalid
  children, repeated sibling tokens, and uniforms that matter for a soft
  p."""
  topology = tree_lib.TreeTopology(_IRREGULAR)
  n, vocab, batch = topology.num_nodes, 3, 1024
  k_tok, k_valid, k_arg, k_q, k_u = jax.random.split(jax.random.key(0), 5)
  tokens_BxN = jax.random.randint(k_tok, (batch, n), 0, vocab)
  valid_BxN = jax.random.uniform(k_valid, (batch, n)) < 0.85
  argmax_BxN1 = jax.random.randint(k_arg, (batch, n + 1), 0, vocab)
  p_BxN1xV = jax.nn.one_hot(argmax_BxN1, vocab, dtype=jnp.float32)
  q_BxN1xV = jax.nn.softmax(jax.random.normal(k_q, (batch, n + 1, vocab)))
  u_BxN1x2 = jax.random.uniform(k_u, (batch, n + 1, 2))
  got = _verify(u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                topology, None)
  want = tree_lib.greedy_tree_verify(argmax_BxN1, tokens_BxN, valid_BxN,
                                     topology)
  for name, a, b in zip(("path", "emitted", "accepted"), got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  assert set(np.asarray(got[2]).tolist()) == set(range(topology.max_depth + 1))


@dataclasses.dataclass(frozen=True)
class _NoGreedyWalk(vf.KSeqVerifier):
  """K-SEQ without the loop's greedy fast path: at T = 0 the loop runs
  `kseq_tree_verify` on one-hot laws."""
  name = "spectr-no-greedy-walk"
  greedy_walk = False


@pytest.mark.parametrize("verifier", [
    _NoGreedyWalk((2, 2, 1), "iid"),
    pytest.param(vf.get_verifier("spectr:2,2,1"), marks=pytest.mark.full)])
def test_greedy_kseq_equals_generate(verifier):
  """Greedy speculative decoding through `kseq_tree_verify` itself (and
  through the loop's greedy walk, the registered spec) returns
  `generate`'s tokens and lengths: a Transformer target, another
  Transformer drafting level by level, ragged prompts and EOS."""
  name = "tree:llama"
  setting = SETTINGS[name]
  target = setting.target()
  batch, seed, key = 4, 9, 0
  prompts, lengths = setting.prompts(batch, seed)
  ref = _reference(name, batch, seed,
                   key if setting.ref_key is None else setting.ref_key)
  out = sj.speculative_generate(
      target, _tree_transformer(target, ref), prompts, lengths,
      jax.random.key(key), verifier=verifier,
      max_new_tokens=setting.max_new_tokens, sampling=sj.GREEDY,
      eos_id=setting.eos_id)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  s = out.summary()
  assert s["accepted"] <= s["verified"] <= verifier.depth * s["rounds"]
  assert np.asarray(out.stats.accept_hist)[:, 1:].sum() > 0  # paths kept


# ------------------------------------------ the REAL loop on the lab (T = 1)

@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    # The fast tier checks the JAX node rule against the lab's exact law.
    pytest.param("spectr:2,1", marks=pytest.mark.full),
    pytest.param("spectr:parents=-1,-1,-1,0,0,1,3", marks=pytest.mark.full)])
def test_real_loop_kseq_on_the_lab_is_exact(lab_loop, spec):
  """The compiled tree round judged by K-SEQ (10^5 ragged rows, EOS): the
  first 2 (depth + 1) tokens follow the target's law."""
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
def test_real_loop_rejects_the_kseq_control(lab_loop):
  result, _ = _run_loop(lab_loop, "spectr-wrong-residual:2,1", 2, EOS)
  assert not result.passed, str(result)


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_kseq_under_top_k_top_p_is_exact(lab_loop):
  """Temperature, top-k and top-p at once: zeros in p and q."""
  result, _ = _run_loop(lab_loop, "spectr:2,1", 2, EOS, TOP_K_P)
  assert result.passed, str(result)


def test_the_control_warns_when_it_decodes(lab_loop):
  _, target, draft, prompts, lengths, *_ = lab_loop
  with pytest.warns(UserWarning, match="negative control"), pytest.raises(
      ValueError, match="max_new_tokens"):
    sj.speculative_generate(target, draft, prompts, lengths,
                            jax.random.key(0), max_new_tokens=0,
                            verifier="spectr-wrong-residual:2,1")


# ------------------------------------------- K-SEQ against the token tree

@pytest.mark.big_batch
@pytest.mark.optimized
@pytest.mark.full
def test_kseq_and_tree_tokens_per_target_call():
  """Same tree (3,2,1, i.i.d.), models and keys at T = 1 on 10^4 rows:
  K-SEQ's tokens per target call against token-level verification's, with
  a paired interval (measured: 2.8671 against 2.7673, +0.0998 +- 0.0065,
  95%)."""
  pair = lab.make_markov_pair(2.0, 0.4, 1)
  target, draft = lab_models.markov_lms(pair)
  rows = 10_000
  prompts = np.tile(np.array([[3, 5]], np.int32), (rows, 1))
  outs = {}
  for rule in ("tree", "spectr"):
    outs[rule] = sj.speculative_generate(
        target, draft, prompts, np.full(rows, 2, np.int32), jax.random.key(4),
        max_new_tokens=32, verifier=f"{rule}:3,2,1")
  gain, se = _paired_gain(outs["spectr"], outs["tree"])
  summaries = {k: o.summary() for k, o in outs.items()}
  assert gain == pytest.approx(
      summaries["spectr"]["tokens_per_target_call"]
      - summaries["tree"]["tokens_per_target_call"])
  print(f"tree:3,2,1 tokens per target call: spectr "
        f"{summaries['spectr']['tokens_per_target_call']:.4f}, tree "
        f"{summaries['tree']['tokens_per_target_call']:.4f}, difference "
        f"{gain:+.4f} +- {1.96 * se:.4f} (95%)")
  assert gain - 3 * se > 0, (gain, se)
