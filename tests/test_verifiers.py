"""Verifiers (`specjax.decode.verifiers`): exactness on the lab, the JAX
implementation against the lab's laws, and the REAL compiled loop on the
lab's Markov chains, with negative controls that must fail the same tests."""

import collections
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
from specjax import testing
from specjax.decode import draft_length
from specjax.decode import steps
from specjax.decode import verifiers as vf
from specjax.decode.verifiers import block as block_lib
from specjax.lab import models as lab_models
from specjax.lab import verifiers as lv

TOL = 1e-12
EXACT = ("token", "block")
LOSSY = ("lenient:0.5", "typical:0.09,0.3")
CONTROLS = ("wrong_fallback", "always_accept")


# ---------------------------------------------------------------- registry

def test_registry_builds_every_verifier_and_labels_lossy_ones():
  assert set(vf.available_verifiers()) >= {"token", "block", "lenient",
                                            "typical"}
  for spec in EXACT:
    v = vf.get_verifier(spec)
    assert v.exact and v.spec == spec and vf.get_verifier(v) is v
  for spec in LOSSY + CONTROLS:
    v = vf.get_verifier(spec)
    assert not v.exact, spec
    assert vf.get_verifier(v.spec) == v  # spec round-trips
  assert hash(vf.get_verifier("lenient:0.5")) == hash(vf.LenientVerifier(0.5))
  # numpy scalars were refused ("must be a number ..., got np.float32(0.5)").
  assert vf.LenientVerifier(np.float32(0.5)) == vf.LenientVerifier(0.5)
  assert vf.TypicalVerifier(np.float64(0.09), 0.3).spec == "typical:0.09,0.3"
  assert vf.TreeVerifier((np.int64(2), 1)).spec == "tree:2,1"
  with pytest.raises(ValueError, match=r"\(0, 1\]"):
    vf.LenientVerifier(np.bool_(True))


@pytest.mark.parametrize("spec, match", [
    ("tre", "unknown verifier"), ("tree", "branching per depth"),
    ("tree:2,x", "integers"), ("tree:0", r"branching\[0\]"),
    ("tree:parents=-1,2", "earlier node"), ("lenient", "needs 1"),
    ("lenient:2", r"\(0, 1\]"), ("lenient:x", "numbers"),
    ("typical:0.1", "needs 2"), ("block:3", "takes no arguments"),
    (3, "registry string"),
    # int() and float() read these as 10, 3, 5.0 and 0.5.
    ("tree:1_0", "integers"), ("tree:\u0663", "integers"),
    ("lenient:0_5", "numbers"), ("lenient:\u0660.\u0665", "numbers"),
    # Built 17M nodes in 10 s before the call refused them.
    ("tree:64,64,64,64", "17,043,520 nodes is larger than 16,384")])
def test_bad_verifier_names_the_fix(spec, match):
  with pytest.raises((ValueError, TypeError), match=match):
    vf.get_verifier(spec)


def test_register_verifier_refuses_what_get_verifier_could_not_use():
  make = lambda args: vf.TokenVerifier()
  # Re-registering "token", the default, changed every later call.
  with pytest.raises(ValueError, match="already registered"):
    vf.register_verifier("token", lambda args: vf.BlockVerifier())
  assert vf.get_verifier("token").spec == "token"
  with pytest.raises(ValueError, match="surrounding spaces"):
    vf.register_verifier(" spaced ", make)  # get_verifier strips specs
  with pytest.raises(TypeError, match="factory must be callable"):
    vf.register_verifier("not-callable", 3)
  vf.register_verifier("returns-a-string", lambda args: "token")
  with pytest.raises(TypeError, match="returned str, not a Verifier"):
    vf.get_verifier("returns-a-string")
  vf.register_verifier("returns-a-string", make, replace=True)
  assert vf.get_verifier("returns-a-string") == vf.TokenVerifier()
  # A class as the factory built TokenVerifier(coupling_rule=[]).
  with pytest.raises(TypeError, match="got the class TokenVerifier"):
    vf.register_verifier("a-class", vf.TokenVerifier)
  # The base class, and an unhashable verifier, failed inside the loop.
  @dataclasses.dataclass(frozen=True)
  class Unhashable(vf.TokenVerifier):
    table: list = dataclasses.field(default_factory=list)
  for verifier, match in ((vf.Verifier(), r"does not implement \['num_uniforms"
                           r"', 'verify'\]"),
                          (Unhashable(), "must be hashable")):
    with pytest.raises(TypeError, match=match):
      vf.get_verifier(verifier)


def test_speculative_generate_validates_verifier_before_tracing():
  model = lab_models.markov_lms(lab.make_markov_pair())[0]
  with pytest.raises(ValueError, match="unknown verifier"):
    sj.speculative_generate(model, model, np.ones((1, 2), np.int32), [2],
                            jax.random.key(0), gamma=2, max_new_tokens=3,
                            verifier="blokc")


# ------------------------------------------------------------- lab (exact)

def test_paper_example_is_10_9_and_11_9():
  pair, gamma = lv.paper_example()
  token = lv.expected_accepted(pair, gamma, "token")
  block = lv.expected_accepted(pair, gamma, "block")
  np.testing.assert_allclose(token, 10 / 9, rtol=0, atol=TOL)
  np.testing.assert_allclose(block, 11 / 9, rtol=0, atol=TOL)
  for spec in EXACT:
    assert lv.verifier_tv(pair, gamma, 6, spec) <= TOL


def test_token_law_matches_the_independent_lab_enumeration():
  pair = lab.make_markov_pair(1.5, 0.5, 3)
  for gamma, seq_len in ((1, 3), (3, 4)):
    np.testing.assert_allclose(
        lv.process_law(pair, gamma, seq_len, "token"),
        lab.speculative_distribution(pair, gamma, seq_len), atol=1e-15)


def _grid_check(records):
  by_setting = collections.defaultdict(dict)
  for r in records:
    key = (r["certainty"], r["draft_match"], r["seed"], r["gamma"],
           r["seq_len"])
    by_setting[key][r["verifier"]] = r
  assert len(by_setting) >= 1000
  worst = {spec: max(s[spec]["tv"] for s in by_setting.values())
           for spec in EXACT}
  assert max(worst.values()) <= TOL, worst
  # Block >= token in expected tokens per round, in every setting and every
  # context (Sun et al.'s Theorem 2), up to float64 rounding.
  gaps = [s["block"]["tokens_per_round"] - s["token"]["tokens_per_round"]
          for s in by_setting.values()]
  assert min(g.min() for g in gaps) >= -1e-12
  assert max(g.max() for g in gaps) > 0.05  # and strictly better somewhere
  return worst


def test_block_and_token_are_exact_and_block_never_loses_on_the_grid():
  # gamma <= 3 and 4 seeds: 1,296 settings in well under a minute; the slow
  # test below adds gamma = 4.
  _grid_check(lv.audit_grid(EXACT, num_seeds=4, gammas=(1, 2, 3)))


@pytest.mark.slow
def test_full_grid_with_gamma_4():
  _grid_check(lv.audit_grid(EXACT, num_seeds=3, gammas=(1, 2, 3, 4)))


def test_lossy_verifiers_and_controls_have_positive_tv():
  pair = lab.make_markov_pair(1.5, 0.5, 0)
  for spec in LOSSY + CONTROLS:
    assert lv.verifier_tv(pair, 3, 4, spec) > 0.01, spec
  # lenient:1 is token verification.
  assert lv.verifier_tv(pair, 3, 4, "lenient:1") <= TOL


# ------------------------------------------- JAX verifiers vs the lab's law

N_ROUNDS = 100_000


@pytest.mark.parametrize("spec", list(EXACT) + [
    pytest.param(spec, marks=pytest.mark.slow) for spec in LOSSY])
def test_jax_verifier_round_matches_lab_law(spec):
  """One round with fixed drafts, 10^5 draws of the verifier's uniforms: the
  JAX verdict (tau, emitted token) must follow the lab's closed form."""
  result = _round_against_law(spec, spec)
  assert result.passed, f"{spec}: {result}"


@pytest.mark.parametrize("sampled, law", [
    ("wrong_fallback", "token"), ("always_accept", "token"),
    ("block", "token"), ("token", "block")])
def test_round_check_rejects_another_rules_round(sampled, law):
  """The control of the test above: the same check, on rounds of one rule
  against the law of another, rejects."""
  result = _round_against_law(sampled, law)
  assert not result.passed, f"{sampled} against {law}'s law: {result}"


def _round_against_law(sampled, law):
  """`check_distribution` of N_ROUNDS JAX rounds of verifier `sampled`
  against the lab's law of verifier `law` (see the test above)."""
  verifier = vf.get_verifier(sampled)
  pair = lab.make_markov_pair(2.0, 0.4, 1)
  gamma, ctx = 3, 2
  rng = np.random.default_rng(0)
  drafts = [ctx]
  for _ in range(gamma):  # a draft block drawn from q
    drafts.append(int(rng.choice(8, p=pair.draft_trans_VxV[drafts[-1]])))
  contexts = np.array(drafts)
  p_G1xV = pair.target_trans_VxV[contexts]
  q_GxV = pair.draft_trans_VxV[contexts[:-1]]
  x_G = contexts[1:]
  tau_law, corr_law = lv.verifier_law(vf.get_verifier(law), p_G1xV, q_GxV,
                                      x_G)
  expected = (tau_law[:, None] * corr_law).reshape(-1)  # id = tau * V + y

  keys = jax.random.split(jax.random.key(7), N_ROUNDS)
  u = jax.vmap(lambda k: jax.random.uniform(
      k, (verifier.num_uniforms(gamma),)))(keys)
  tile = lambda a: jnp.broadcast_to(jnp.asarray(a, jnp.float32),
                                    (N_ROUNDS,) + a.shape)
  sampling = sj.SamplingConfig()
  emitted, tau = jax.jit(lambda u, p, q, x: verifier.verify(
      u, p, q, x, lambda uu, pp: steps._sample(uu, pp, sampling)))(
          u, tile(p_G1xV), tile(q_GxV),
          jnp.broadcast_to(jnp.asarray(x_G, jnp.int32), (N_ROUNDS, gamma)))
  emitted, tau = np.asarray(emitted), np.asarray(tau)
  y = emitted[np.arange(N_ROUNDS), tau]
  kept = np.arange(gamma)[None] < tau[:, None]
  assert np.all(emitted[:, :gamma][kept]
                == np.broadcast_to(x_G, (N_ROUNDS, gamma))[kept])
  return testing.check_distribution(tau * 8 + y, expected)


@functools.partial(jax.jit, static_argnums=0)
def _verify(verifier, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG):
  """`verifier.verify` with the loop's sampler at T = 1: one compile per
  verifier (and shape) for every round law below."""
  sampling = sj.SamplingConfig()
  return verifier.verify(u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG,
                         lambda u, probs: steps._sample(u, probs, sampling))


def _round_law_on_a_grid(verifier, h_G, p_G1xV, q_GxV, x_G, grid=2**14):
  """The law of one round of `verifier`, float64 `[G + 1, V]` over (drafts
  kept, emitted token), computed without sampling.

  The verdict depends on each position's judging uniform only through
  u_i < h_i (token: keep, h = min(1, p / q); block: stop, h its
  `stop_probabilities`): each of the 2^G patterns is run at uniforms inside
  its cells, weighted by its probability under h, and the emitted token at
  every other uniform (residual, bonus) set to each point of a midpoint
  grid (an inverse-CDF draw: each token's share of the grid is its
  probability to 1 / grid).
  """
  gamma, v = len(x_G), p_G1xV.shape[-1]
  others = verifier.num_uniforms(gamma) - gamma
  u_R = (np.arange(grid) + 0.5) / grid
  tile = lambda a: jnp.broadcast_to(jnp.asarray(a, jnp.float32),
                                    (grid,) + a.shape)
  law = np.zeros((gamma + 1, v))
  for below in itertools.product((True, False), repeat=gamma):
    below = np.array(below)
    weight = np.prod(np.where(below, h_G, 1.0 - h_G))
    if weight == 0:
      continue
    judging = np.where(below, h_G / 2, (1.0 + h_G) / 2)
    u_RxN = np.concatenate([np.tile(judging, (grid, 1)),
                            np.tile(u_R[:, None], (1, others))], axis=1)
    emitted, tau = _verify(verifier, jnp.asarray(u_RxN, jnp.float32),
                           tile(p_G1xV), tile(q_GxV), jnp.broadcast_to(
                               jnp.asarray(x_G, jnp.int32), (grid, gamma)))
    emitted, tau = np.asarray(emitted), np.asarray(tau)
    np.add.at(law, (tau, emitted[np.arange(grid), tau]), weight / grid)
  return law


def _thresholds(spec, p_G1xV, q_GxV, x_G):
  """h of `_round_law_on_a_grid`, from the verifier's own functions where
  it has them (block), else from p and q (token)."""
  gamma = len(x_G)
  p_at, q_at = p_G1xV[np.arange(gamma), x_G], q_GxV[np.arange(gamma), x_G]
  if spec == "token":
    return np.minimum(1.0, p_at / q_at)
  w = block_lib.block_weights(p_at[None], q_at[None])
  return np.asarray(block_lib.stop_probabilities(
      w, p_G1xV[None], q_GxV[None]), np.float64)[0]


def _scaled_residual(scale):
  """Negative control: the maximal coupling with its residual drawn from
  (p - scale q)+ (the audit's mutants: at 0.97, TV .0096 over 8 tokens,
  passed every sampling check; at 0.9, TV .027, the whole-sequence law)."""
  def rule(u_accept_x, u_residual_x, p_xV, q_xV, draft_token_x):
    p_x = jnp.take_along_axis(p_xV, draft_token_x[..., None], -1)[..., 0]
    q_x = jnp.take_along_axis(q_xV, draft_token_x[..., None], -1)[..., 0]
    accepted_x = u_accept_x * q_x < p_x
    fallback_x = sampling_lib.sample_from_probs(
        u_residual_x, jnp.maximum(p_xV - scale * q_xV, 0.0))
    return jnp.where(accepted_x, draft_token_x, fallback_x), accepted_x
  rule.__name__ = f"residual_{scale:g}q"
  return rule


@pytest.mark.parametrize("spec", ["token", "block"])
def test_round_law_matches_the_lab_without_sampling(spec):
  """The chi-square round check above (10^5 rounds) passed subtle bugs: a
  block residual without its weight, (p - q)+ for (w_tau p - q)+ (p =
  .09), and a token residual from (p - 0.97 q)+ (p = .15). Here the
  round's law is computed to 1 / 2^14 and compared entry by entry; the
  controls are those two bugs."""
  control = {"token": vf.TokenVerifier(coupling_rule=_scaled_residual(0.97)),
             "block": _BlockNoWeight()}[spec]
  # Rounds whose kept drafts q overstates (w_tau < 1, where the block
  # residual's weight matters; each block has q-probability .01-.05) and
  # one other.
  worst = 0.0
  cases = []
  for setting, contexts in (((2.0, 0.4, 1), (3, 3, 6, 3)),
                            ((3.0, 0.2, 2), (7, 7, 2, 7)),
                            ((3.0, 0.2, 2), (1, 1, 2, 7)),
                            ((1.5, 0.5, 0), (0, 1, 2, 3))):
    pair = lab.make_markov_pair(*setting)
    contexts = np.array(contexts)
    cases.append((pair.target_trans_VxV[contexts],
                  pair.draft_trans_VxV[contexts[:-1]], contexts[1:]))
  # Truncated laws (top-3 of each, as top-k leaves them): drafts the target
  # gives probability 0 (always rejected), and residuals on a cut support.
  def top3(a):
    kept = np.where(a >= np.sort(a, -1)[..., -3:-2], a, 0.0)
    return kept / kept.sum(-1, keepdims=True)
  p, q, _ = cases[1]
  p, q = top3(p), top3(q)
  x = np.argmax(np.where(q > 0, q / np.maximum(p[:-1], 1e-9), -1.0), -1)
  assert (p[np.arange(3), x] == 0).any() and (q[np.arange(3), x] > 0).all()
  cases.append((p, q, x))
  for p, q, x in cases:
    tau_law, corr_law = lv.verifier_law(spec, p, q, x)
    want = tau_law[:, None] * corr_law
    h = _thresholds(spec, p, q, x)
    got = _round_law_on_a_grid(vf.get_verifier(spec), h, p, q, x)
    np.testing.assert_allclose(got, want, atol=5e-4)
    worst = max(worst, np.abs(
        _round_law_on_a_grid(control, h, p, q, x) - want).max())
  assert worst > 5e-3, worst


@dataclasses.dataclass(frozen=True)
class _BlockNoWeight(block_lib.BlockVerifier):
  """Negative control: the residual after tau drafts is (p - q)+, not
  (w_tau p - q)+ (a subtle bug: TV .004 over 6 tokens)."""
  name = "block-no-weight"

  def verify(self, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG, sample):
    gamma = drafts_BxG.shape[1]
    w_BxG = block_lib.block_weights(
        vf.base.gather(p_BxG1xV[:, :gamma], drafts_BxG),
        vf.base.gather(q_BxGxV, drafts_BxG))
    h_BxG = block_lib.stop_probabilities(w_BxG, p_BxG1xV, q_BxGxV)
    stop_BxG = u_BxN[:, :gamma] < h_BxG
    tau_B = jnp.max(jnp.where(stop_BxG, jnp.arange(1, gamma + 1), 0),
                    axis=1).astype(jnp.int32)
    p_tau_BxV = vf.base.take_position(p_BxG1xV, tau_B)
    q_tau_BxV = vf.base.take_position(q_BxGxV, jnp.minimum(tau_B, gamma - 1))
    excess_BxV = jnp.maximum(p_tau_BxV - q_tau_BxV, 0.0)
    residual_BxV = jnp.where(
        jnp.sum(excess_BxV, axis=-1, keepdims=True) > 0, excess_BxV,
        p_tau_BxV)
    last_B = jnp.where(tau_B < gamma, sample(u_BxN[:, gamma], residual_BxV),
                       sample(u_BxN[:, gamma + 1], p_BxG1xV[:, gamma]))
    return vf.base.emit(drafts_BxG, tau_B, last_B), tau_B


def test_block_keeps_more_than_token_in_the_loop():
  pair = lab.make_markov_pair(1.5, 0.5, 0)
  target, draft = lab_models.markov_lms(pair)
  prompts = np.full((2000, 1), 3, np.int32)
  kept = {}
  for spec in EXACT:
    out = sj.speculative_generate(target, draft, prompts,
                                  np.ones(2000, np.int32), jax.random.key(1),
                                  gamma=3, max_new_tokens=12, verifier=spec)
    s = out.summary()
    kept[spec] = s["tokens_per_target_call"]
  assert kept["block"] > kept["token"], kept


# --------------------------------------------- the REAL loop on the lab

REAL_N = 100_000
EOS = 0


def _loop_law(pair, gamma, k, contexts, weights, eos_id):
  """Exact law of (context group, first k tokens) with EOS absorbing; ids
  are group * (V+1)**k + sum_t token_t (V+1)**(k-1-t), pad = V."""
  vocab = pair.vocab_size
  seqs = np.array(np.unravel_index(np.arange(vocab ** k), (vocab,) * k)).T
  if eos_id is not None:
    after = np.cumsum(seqs == eos_id, axis=1) - (seqs == eos_id) > 0
    seqs = np.where(after, vocab, seqs)
  base = (vocab + 1) ** np.arange(k - 1, -1, -1)
  ids = seqs @ base
  law = np.zeros(len(contexts) * (vocab + 1) ** k)
  for g, (ctx, w) in enumerate(zip(contexts, weights)):
    # The target's own law: every exact verifier must match it.
    probs = lv.target_law(pair, k, ctx).reshape(-1)
    np.add.at(law, g * (vocab + 1) ** k + ids, w * probs)
  return law, base


def ragged_lab_loop(pair, target, draft, groups):
  """`lab_loop`'s tuple for any pair and draft: REAL_N rows, each one of
  the prompt `groups` (drawn with a fixed seed)."""
  rng = np.random.default_rng(0)
  which = rng.integers(0, len(groups), REAL_N)
  prompts = np.zeros((REAL_N, max(len(p) for p in groups)), np.int32)
  lengths = np.zeros(REAL_N, np.int32)
  for g, prompt in enumerate(groups):
    prompts[which == g, :len(prompt)] = prompt
    lengths[which == g] = len(prompt)
  weights = np.bincount(which, minlength=len(groups)) / REAL_N
  return pair, target, draft, prompts, lengths, which, [
      int(p[-1]) for p in groups], weights


@pytest.fixture(scope="module")
def lab_loop():
  pair = lab.make_markov_pair(1.5, 0.5, 0, vocab_size=4)
  target, draft = lab_models.markov_lms(pair)
  # Ragged prompts: 4 groups of lengths 1..4, ending in 4 different tokens.
  return ragged_lab_loop(pair, target, draft, [
      np.array([2]), np.array([1, 3]), np.array([3, 0, 1]),
      np.array([0, 2, 1, 0])])


def _transformed(pair, sampling):
  """The pair's chains under `sampling` (temperature, top-k, top-p), as the
  loop transforms both models' logits: the law it must then sample."""
  def rows(table):
    p = np.asarray(sampling_lib.probabilities(
        jnp.asarray(np.log(table), jnp.float32), sampling), np.float64)
    return p / p.sum(-1, keepdims=True)
  return lab.MarkovPair(rows(pair.target_init_V), rows(pair.target_trans_VxV),
                        rows(pair.draft_init_V), rows(pair.draft_trans_VxV))


def _run_loop(lab_loop, spec, gamma, eos_id, sampling=None, law_pair=None,
              rule=None):
  """The loop on 10^5 ragged rows (`rule`, if given, in gamma's place) under
  `sampling` (None: T = 1), judged against `law_pair`'s target (default:
  the lab pair, transformed by `sampling`)."""
  pair, target, draft, prompts, lengths, which, contexts, weights = lab_loop
  k = 2 * (gamma + 1)  # covers rounds after full accepts
  vocab = pair.vocab_size
  out = sj.speculative_generate(
      target, draft, prompts, lengths, jax.random.key(gamma),
      gamma=gamma if rule is None else rule, max_new_tokens=k, eos_id=eos_id,
      pad_id=vocab, verifier=spec,
      sampling=sampling or sampling_lib.SamplingConfig())
  if law_pair is None:
    law_pair = pair if sampling is None else _transformed(pair, sampling)
  law, base = _loop_law(law_pair, gamma, k, contexts, weights, eos_id)
  tokens = np.asarray(out.tokens)
  ids = which * (vocab + 1) ** k + tokens @ base
  checks = [testing.check_distribution(ids, law)]
  # The whole-sequence law spreads 10^5 samples over 4 (V + 1)^k outcomes,
  # so its TV bound passed a residual from (p - 0.9 q)+ (audit: p = 9e-4);
  # each prompt group's law of every position and adjacent pair rejects it.
  law_GxS = law.reshape(len(contexts), -1)
  digits = (np.arange(law_GxS.shape[1])[:, None] // base) % (vocab + 1)
  for g, law_S in enumerate(law_GxS / law_GxS.sum(1, keepdims=True)):
    rows = tokens[which == g]
    for i in range(k):
      for j in ([i] if i == k - 1 else [i, i + 1]):
        exact = digits[:, i] * (vocab + 1) ** (j - i) + digits[:, j] * (j > i)
        sampled = rows[:, i] * (vocab + 1) ** (j - i) + rows[:, j] * (j > i)
        checks.append(testing.check_distribution(sampled, np.bincount(
            exact, weights=law_S, minlength=(vocab + 1) ** (1 + (j > i)))))
  return _AllOf(tuple(checks)), out


@dataclasses.dataclass(frozen=True)
class _AllOf:
  """Several checks of one generation: passed only if every one passed."""
  results: tuple

  @property
  def passed(self) -> bool:
    return all(r.passed for r in self.results)

  def __str__(self) -> str:
    failed = [str(r) for r in self.results if not r.passed]
    return (f"{len(failed)} of {len(self.results)} checks failed:\n"
            + "\n".join(failed[:3]) if failed else str(self.results[0]))


@pytest.mark.big_batch
@pytest.mark.parametrize("spec", EXACT)
@pytest.mark.parametrize("gamma, eos_id", [
    (2, EOS), pytest.param(2, None, marks=pytest.mark.slow),
    pytest.param(3, EOS, marks=pytest.mark.slow)])
def test_real_loop_on_the_lab_is_exact(lab_loop, spec, gamma, eos_id):
  result, out = _run_loop(lab_loop, spec, gamma, eos_id)
  assert result.passed, f"{spec} gamma={gamma} eos={eos_id}: {result}"
  if eos_id is not None:  # EOS really stopped some rows early
    assert np.asarray(out.lengths).min() < 2 * (gamma + 1)


@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    spec if spec == "wrong_fallback" else pytest.param(
        spec, marks=pytest.mark.full) for spec in CONTROLS] + [
    pytest.param(spec, marks=pytest.mark.slow) for spec in LOSSY])
def test_real_loop_rejects_controls_and_lossy(lab_loop, spec):
  result, _ = _run_loop(lab_loop, spec, 2, EOS)
  assert not result.passed, f"{spec}: {result}"


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_rejects_a_subtle_residual(lab_loop):
  """A residual from (p - 0.9 q)+: the whole-sequence law alone passed it
  (audit: p = 9e-4), the per-position and pair laws reject it."""
  result, _ = _run_loop(
      lab_loop, vf.TokenVerifier(coupling_rule=_scaled_residual(0.9)), 2, EOS)
  assert any(not r.passed for r in result.results[1:]), str(result)


# ------------------------------------ trees in the REAL loop on the lab

# tree:9,1's root has more children than the walk unrolls: it loops.
TREES = ("tree:2,1", "tree-wor:2,1",
         pytest.param("tree:9,1", marks=pytest.mark.full))


@pytest.mark.big_batch
@pytest.mark.parametrize("spec", TREES)
def test_real_loop_trees_on_the_lab_are_exact(lab_loop, spec):
  """The compiled tree round (level-by-level drafting, one tree pass, RRS,
  the kept path moved in both caches, ragged commit) on 10^5 rows: the
  first K = 2 (depth + 1) tokens, with EOS and ragged prompts, follow the
  target's law."""
  depth = vf.get_verifier(spec).depth
  result, out = _run_loop(lab_loop, spec, depth, EOS)
  assert result.passed, f"{spec}: {result}"
  hist = np.asarray(out.stats.accept_hist)
  # Rounds after a full-depth accept happened, and EOS stopped rows early.
  assert ((hist[:, depth] >= 1)
          & (np.asarray(out.stats.rounds) > hist[:, depth])).sum() > 1000
  assert np.asarray(out.lengths).min() < 2 * (depth + 1)


@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    "tree-skip-residual:2,1",
    pytest.param("tree-skip-residual:9,1", marks=pytest.mark.full)])
def test_real_loop_rejects_the_tree_control(lab_loop, spec):
  result, _ = _run_loop(lab_loop, spec, 2, EOS)
  assert not result.passed, f"{spec}: {result}"


# ------------------------ top-k and top-p in the REAL loop on the lab

# Temperature, top-k and top-p at once: every row of either chain keeps one
# to three of its four tokens (no cumulative mass within .02 of top_p, so
# float32 rounding cannot move a cut), and q keeps tokens p drops (row 0:
# q keeps {0, 3}, p keeps {0, 2}).
TOP_K_P = sj.SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)


# In the full tier the tree whose draw meets q's zeros (a compiled loop of
# its own; tests/test_exactness.py runs the chain under top-k and top-p on
# Transformers); the rest with -m slow.
@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    pytest.param("tree-wor:3,1", marks=pytest.mark.full)] + [
    pytest.param(spec, marks=pytest.mark.slow)
    for spec in ("token", "block", "tree:2,1", "tree-wor:2,1")])
def test_real_loop_under_top_k_top_p_is_exact(lab_loop, spec):
  """The transform runs at one site for a chain's drafts and verify pass
  (`decode/steps.py`) and at another for a tree's levels and tree pass
  (`decode/tree_round.py`), and the zeros it leaves in p and q reach every
  verifier: tree-wor:3,1 draws three distinct children where q keeps two
  tokens. The rows follow the transformed target's law."""
  depth = getattr(vf.get_verifier(spec), "depth", None) or 2
  result, _ = _run_loop(lab_loop, spec, depth, EOS, TOP_K_P)
  assert result.passed, f"{spec}: {result}"


@pytest.mark.big_batch
@pytest.mark.slow
def test_real_loop_under_top_k_top_p_with_a_stopping_rule_is_exact(lab_loop):
  """A row stops drafting after a q whose max (after the transform) is
  under .6: rows 2 and 3 of the draft's chain."""
  rule = draft_length.Confidence(threshold=0.6, gamma_max=2)
  result, out = _run_loop(lab_loop, "token", 2, EOS, TOP_K_P, rule=rule)
  assert result.passed, str(result)
  hist_L = np.asarray(out.stats.length_hist).sum(0)  # rounds by drafts made
  assert hist_L[1] > 0.1 * hist_L.sum() and hist_L[2] > 0.1 * hist_L.sum()


@pytest.mark.big_batch
@pytest.mark.parametrize("spec, sampling", [
    # T = 1's token loop: the program test_real_loop_on_the_lab_is_exact ran.
    ("token", None),
    pytest.param("wrong_fallback", TOP_K_P, marks=pytest.mark.slow),
    pytest.param("tree-skip-residual:2,1", TOP_K_P, marks=pytest.mark.slow)])
def test_real_loop_under_top_k_top_p_rejects_controls(lab_loop, spec,
                                                      sampling):
  """The check above tells the transformed law from T = 1's (the exact loop
  without the transform), and rejects a chain and a tree control run under
  it."""
  result, _ = _run_loop(lab_loop, spec, 2, EOS, sampling,
                        law_pair=_transformed(lab_loop[0], TOP_K_P))
  assert not result.passed, f"{spec}: {result}"


@pytest.mark.parametrize("spec", ["token", "block"])
def test_expected_accepted_refuses_a_round_whose_arrays_disagree(spec):
  """Broadcasting priced a p without its bonus row (block: 1.0 for 2.0), a
  p with an extra row (block: 3 of 2 drafts kept), and one row's p for the
  whole batch; an id past V gathered NaN and -1 wrapped to V - 1."""
  v = vf.get_verifier(spec)
  p, q = jnp.array([.5, .3, .2]), jnp.array([.2, .3, .5])
  p_2x3x3, q_2x2x3 = jnp.tile(p, (2, 3, 1)), jnp.tile(q, (2, 2, 1))
  drafts = jnp.array([[0, 1], [2, 0]], jnp.int32)
  good = v.expected_accepted(p_2x3x3, q_2x2x3, drafts)
  assert ((0 <= good) & (good <= 2)).all()
  for p_bad in (p_2x3x3[:, :2], jnp.tile(p, (2, 4, 1)), p_2x3x3[:1]):
    with pytest.raises(ValueError, match="disagree"):
      v.expected_accepted(p_bad, q_2x2x3, drafts)
  with pytest.raises(ValueError, match="disagree"):
    v.expected_accepted(p_2x3x3, q_2x2x3, drafts[:, :1])
  for bad_id in (7, -1):
    with pytest.raises(ValueError, match="outside the vocabulary"):
      v.expected_accepted(p_2x3x3, q_2x2x3, drafts.at[0, 0].set(bad_id))
  with pytest.raises(TypeError, match="integer token ids"):
    v.expected_accepted(p_2x3x3, q_2x2x3, drafts.astype(jnp.float32))
  empty = v.expected_accepted(p_2x3x3[:, :1], q_2x2x3[:, :0], drafts[:, :0])
  np.testing.assert_array_equal(empty, [0.0, 0.0])


def test_negative_controls_warn_when_they_decode(lab_loop):
  """The controls are registered so that harnesses and sweeps can name
  them; decoding with one warns (here before a refusal: nothing compiles)."""
  _, target, draft, prompts, lengths, *_ = lab_loop
  for spec, gamma in (("always_accept", 2), ("wrong_fallback", 2),
                      ("tree-skip-residual:2,1", None)):
    assert vf.get_verifier(spec).control
    with pytest.warns(UserWarning, match="negative control"), pytest.raises(
        ValueError, match="max_new_tokens"):
      sj.speculative_generate(target, draft, prompts, lengths,
                              jax.random.key(0), gamma=gamma,
                              max_new_tokens=0, verifier=spec)
  assert not any(vf.get_verifier(spec).control for spec in (
      "token", "block", "lenient:0.5", "typical:0.09,0.3", "tree:2,1",
      "tree-wor:2,1"))
