"""The math layer: coupling edge cases, math identities, accounting, sampling.

Statistical exactness of the coupling lives in test_coupling_stats.py; here
every edge case of the seed's construction gets a deterministic test, the
identities get property tests, and the throughput formulas are checked
against Leviathan, Kalman & Matias (2023), Table 1.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import specjax
from specjax import accounting
from specjax import coupling
from specjax import sampling
from specjax import testing

P_WORKED = (0.5, 0.3, 0.2)
Q_WORKED = (0.3, 0.1, 0.6)

_jit_coupling = jax.jit(specjax.coupling_sample)


def _draws(probs, n, seed):
  """n exact draft tokens from `probs` (host-side, float64), int32 `[n]`."""
  p = np.asarray(probs, np.float64)
  return jnp.asarray(testing._draw_categorical(jax.random.key(seed),
                                               p / p.sum(), n))


# --- The seed's worked example -------------------------------------------


def test_worked_example():
  p, q = jnp.array(P_WORKED), jnp.array(Q_WORKED)
  np.testing.assert_allclose(specjax.acceptance_probability(p, q), 0.6,
                             atol=1e-6)
  np.testing.assert_allclose(specjax.tv_distance(p, q), 0.4, atol=1e-6)
  np.testing.assert_allclose(specjax.residual(p, q), [0.5, 0.5, 0.0],
                             atol=1e-6)
  # A drawn c is kept with probability p(c)/q(c) = 1/3; a and b always.
  tok, acc = coupling._coupling(jnp.array([0.0, 0.999, 0.33, 0.34]),
                                jnp.array([0.2, 0.2, 0.2, 0.7]), p, q,
                                jnp.array([0, 1, 2, 2]))
  np.testing.assert_array_equal(acc, [True, True, True, False])
  np.testing.assert_array_equal(tok, [0, 1, 2, 1])  # residual CDF (.5, 1, 1)


# --- Coupling edge cases ---------------------------------------------------


@pytest.mark.parametrize("p", [
    [0.25, 0.25, 0.5],
    [0.0, 1.0, 0.0],          # one-hot (greedy)
    [0.5, 0.0, 0.5, 0.0],     # zeros shared by p and q
])
def test_p_equals_q_always_accepts_and_never_nans(p):
  p = jnp.array(p)
  res = specjax.residual(p, p)
  assert not np.any(np.isnan(res))
  np.testing.assert_allclose(res, p)  # zero residual mass: falls back to p
  assert float(specjax.tv_distance(p, p)) == 0.0
  draft = _draws(p, 10_000, seed=1)
  tok, acc = _jit_coupling(jax.random.key(0), p, p, draft)
  assert np.all(acc)
  np.testing.assert_array_equal(tok, draft)
  assert np.all((tok >= 0) & (tok < p.shape[0]))


def test_zero_residual_mass_rejection_draws_from_p():
  # p == q, but force a rejection with u = 1 (only rounding could do this).
  p = jnp.array([0.5, 0.0, 0.5])
  tok, acc = coupling._coupling(jnp.ones(3), jnp.array([0.1, 0.5, 0.9]), p, p,
                                jnp.array([0, 2, 2]))
  assert not np.any(acc)
  np.testing.assert_array_equal(tok, [0, 2, 2])
  assert np.all(np.asarray(p)[np.asarray(tok)] > 0)


def test_q_zero_at_the_drawn_token():
  # q(x) = 0 < p(x): the draft is kept (u * 0 < p(x) for every u), no 0/0.
  p = jnp.array([0.5, 0.5, 0.0])
  q = jnp.array([0.0, 0.0, 1.0])
  tok, acc = _jit_coupling(jax.random.key(0), p, q,
                                     jnp.zeros(1000, jnp.int32))
  assert np.all(acc) and np.all(tok == 0)
  # q(x) = p(x) = 0: always rejected, x never emitted, the residual decides.
  p = jnp.array([0.0, 1.0, 0.0])
  q = jnp.array([1.0, 0.0, 0.0])
  tok, acc = _jit_coupling(jax.random.key(1), p, q,
                                     jnp.full(1000, 2, jnp.int32))
  assert not np.any(acc)
  np.testing.assert_array_equal(tok, 1)


@pytest.mark.parametrize("config", [
    sampling.SamplingConfig(top_k=3),
    sampling.SamplingConfig(top_p=0.6),
    sampling.SamplingConfig(temperature=0.7, top_k=10, top_p=0.9),
])
def test_masked_tokens_are_never_emitted(config):
  rng = np.random.default_rng(0)
  target_logits = jnp.asarray(rng.normal(size=64), jnp.float32)
  draft_logits = target_logits + jnp.asarray(rng.normal(size=64), jnp.float32)
  p = sampling.probabilities(target_logits, config)
  q = sampling.probabilities(draft_logits, config)
  assert np.sum(np.asarray(p) > 0) < 64  # something is masked
  draft = _draws(q, 200_000, seed=2)
  tok, acc = _jit_coupling(jax.random.key(3), p, q, draft)
  tok = np.asarray(tok)
  assert np.all(np.asarray(p)[tok] > 0)
  assert not np.all(acc) and np.any(acc)  # both branches were exercised
  np.testing.assert_array_equal(tok[np.asarray(acc)],
                                np.asarray(draft)[np.asarray(acc)])


def test_sample_from_probs_never_returns_zero_mass_tokens_at_cdf_rounding():
  rng = np.random.default_rng(0)
  probs = rng.random(512).astype(np.float32)
  probs[rng.random(512) < 0.3] = 0.0
  probs /= probs.sum()
  probs_j = jnp.asarray(probs)
  cdf = np.asarray(jnp.cumsum(probs_j))
  total = np.float32(cdf[-1])
  # Uniforms around every CDF value at a zero-mass token.
  zero_ids = np.flatnonzero(probs == 0)
  us = []
  for i in zero_ids[zero_ids > 0]:
    u = np.float32(cdf[i - 1] / total)
    for _ in range(4):
      us += [u, np.float32(cdf[i] / total)]
      u = np.nextafter(u, np.float32(1))
  tok = np.asarray(sampling.sample_from_probs(jnp.asarray(np.array(us)),
                                              probs_j))
  assert np.all(probs[tok] > 0), np.unique(tok[probs[tok] == 0])


def test_two_level_inverse_cdf_is_the_inverse_cdf_and_skips_zero_mass():
  """Batched rows are sampled in `cdf_chunks(V)` chunks (so that a sharded
  vocabulary gathers only chunk masses): the draw is the float64 inverse
  CDF's, and never a zero-mass token, also at uniforms aimed at every chunk
  boundary."""
  assert [sampling.cdf_chunks(v) for v in (8, 256, 259, 4096, 32000)] == [
      2, 16, 1, 64, 64]
  rng = np.random.default_rng(0)
  vocab, rows = 1024, 128  # 32 chunks of 32
  probs = rng.dirichlet(np.full(vocab, 0.3), size=rows).astype(np.float32)
  probs[:, rng.random(vocab) < 0.3] = 0.0
  probs[0, :vocab // 2] = 0.0  # whole chunks without mass
  probs[1, 40:] = 0.0          # mass in the first two chunks only
  u = rng.random(rows).astype(np.float32)
  tok = np.asarray(sampling.sample_from_probs(jnp.asarray(u),
                                              jnp.asarray(probs)))
  p64 = probs.astype(np.float64)
  expected = [np.searchsorted(np.cumsum(r), x * r.sum(), side="right")
              for r, x in zip(p64, u.astype(np.float64))]
  np.testing.assert_array_equal(tok, expected)
  # Uniforms at (and one ulp around) each chunk's share of the mass.
  chunk_cdf = np.cumsum(probs.reshape(rows, 32, 32).sum(-1), -1)
  edges = (chunk_cdf / chunk_cdf[:, -1:]).astype(np.float32)
  for u_r in (edges, np.nextafter(edges, np.float32(0)),
              np.nextafter(edges, np.float32(1))):
    u_r = np.minimum(u_r, np.float32(1 - 2**-24))
    for j in range(0, 32, 5):
      t = np.asarray(sampling.sample_from_probs(jnp.asarray(u_r[:, j]),
                                                jnp.asarray(probs)))
      assert np.all(probs[np.arange(rows), t] > 0), j


def test_float32_and_float64():
  p, q = jnp.array(P_WORKED), jnp.array(Q_WORKED)
  assert specjax.residual(p, q).dtype == jnp.float32
  tok, acc = _jit_coupling(jax.random.key(0), p, q,
                                     jnp.array([0, 2], jnp.int32))
  assert tok.dtype == jnp.int32 and acc.dtype == jnp.bool_
  with jax.enable_x64(True):
    p64 = jnp.array(P_WORKED, jnp.float64)
    q64 = jnp.array(Q_WORKED, jnp.float64)
    res = specjax.residual(p64, q64)
    assert res.dtype == jnp.float64
    np.testing.assert_allclose(res, [0.5, 0.5, 0.0], rtol=0, atol=1e-15)
    assert abs(float(specjax.acceptance_probability(p64, q64)) - 0.6) < 1e-15
    # Mixed precision promotes to float64.
    assert specjax.tv_distance(p64, jnp.asarray(Q_WORKED, jnp.float32)
                               ).dtype == jnp.float64
    tok, acc = _jit_coupling(jax.random.key(0), p64, q64,
                                       _draws(Q_WORKED, 1000, seed=4))
    assert tok.dtype == jnp.int32 and np.all((tok >= 0) & (tok < 3))
    assert np.all(np.asarray(tok)[~np.asarray(acc)] != 2)


def test_probabilities_summing_to_one_only_up_to_rounding():
  rng = np.random.default_rng(5)
  p = jax.nn.softmax(jnp.asarray(rng.normal(size=1000), jnp.float32))
  for q in (p * (1 + 1e-6), p * (1 - 1e-6), jnp.roll(p, 1)):
    res = specjax.residual(p, q)
    assert np.all(np.isfinite(res)) and np.all(res >= 0)
    np.testing.assert_allclose(jnp.sum(res), 1.0, atol=1e-5)
    tok, acc = _jit_coupling(jax.random.key(6), p, q,
                                       _draws(q, 10_000, seed=7))
    assert np.all((tok >= 0) & (tok < 1000))
  np.testing.assert_allclose(specjax.acceptance_probability(p, p * (1 - 1e-6)),
                             1.0, atol=1e-5)


# --- Batching, keys, jit -----------------------------------------------------


def _batch_inputs(shape=(2, 3), vocab=6, seed=0):
  rng = np.random.default_rng(seed)
  p = jnp.asarray(rng.dirichlet(np.ones(vocab), shape), jnp.float32)
  q = jnp.asarray(rng.dirichlet(np.ones(vocab), shape), jnp.float32)
  draft = jnp.asarray(rng.integers(0, vocab, shape), jnp.int32)
  return p, q, draft


def test_batched_leading_axes_with_per_element_keys_match_unbatched_calls():
  p, q, draft = _batch_inputs()
  keys = jax.random.split(jax.random.key(0), 6).reshape(2, 3)
  tok, acc = _jit_coupling(keys, p, q, draft)
  assert tok.shape == acc.shape == (2, 3)
  for i in range(2):
    for j in range(3):
      t, a = _jit_coupling(keys[i, j], p[i, j], q[i, j],
                                     draft[i, j])
      assert (int(t), bool(a)) == (int(tok[i, j]), bool(acc[i, j]))
  np.testing.assert_allclose(specjax.acceptance_probability(p, q)[1, 2],
                             specjax.acceptance_probability(p[1, 2], q[1, 2]))
  assert specjax.residual(p, q).shape == (2, 3, 6)
  assert specjax.tv_distance(p, q).shape == (2, 3)


def test_an_elements_randomness_depends_only_on_its_key():
  p, q = jnp.array(P_WORKED), jnp.array(Q_WORKED)
  draft = jnp.full(4000, 2, jnp.int32)  # c: rejected 2/3 of the time
  keys = jax.random.split(jax.random.key(1), 4000)
  other = keys.at[1:].set(jax.random.split(jax.random.key(2), 3999))
  tok_a, acc_a = _jit_coupling(keys, p, q, draft)
  tok_b, acc_b = _jit_coupling(other, p, q, draft)
  assert (int(tok_a[0]), bool(acc_a[0])) == (int(tok_b[0]), bool(acc_b[0]))
  assert np.any(np.asarray(tok_a[1:]) != np.asarray(tok_b[1:]))


@pytest.mark.parametrize("keys", ["one", "per_element", "shared_by_pairs"])
def test_batch_elements_are_independent(keys):
  # Pairs of neighbouring elements must be jointly distributed as p x p.
  # "shared_by_pairs" is the control: each pair's two elements get one key,
  # so their uniforms coincide, and the check must reject it.
  p, q = jnp.array(P_WORKED), jnp.array(Q_WORKED)
  n = 100_000
  key = jax.random.key(3)
  if keys == "per_element":
    key = jax.random.split(key, 2 * n)
  elif keys == "shared_by_pairs":
    key = jnp.repeat(jax.random.split(key, n), 2, axis=0)
  tok, _ = _jit_coupling(key, p, q, _draws(Q_WORKED, 2 * n, seed=8))
  pairs = np.asarray(tok).reshape(n, 2)
  joint = np.outer(P_WORKED, P_WORKED).reshape(-1)
  result = testing.check_distribution(pairs[:, 0] * 3 + pairs[:, 1], joint)
  assert result.passed == (keys != "shared_by_pairs"), str(result)


def test_jit_matches_eager():
  p, q, draft = _batch_inputs(shape=(5,), vocab=7, seed=1)
  key = jax.random.key(4)
  eager = specjax.coupling_sample(key, p, q, draft)
  jitted = jax.jit(specjax.coupling_sample)(key, p, q, draft)
  for e, j in zip(eager, jitted):
    np.testing.assert_array_equal(e, j)
  for fn in (specjax.residual, specjax.acceptance_probability,
             specjax.tv_distance):
    np.testing.assert_allclose(jax.jit(fn)(p, q), fn(p, q), rtol=1e-6)


def test_coupling_accepts_raw_uint32_keys():
  p, q = jnp.array(P_WORKED), jnp.array(Q_WORKED)
  draft = jnp.array([0, 1, 2], jnp.int32)
  a = _jit_coupling(jax.random.PRNGKey(9), p, q, draft)
  b = _jit_coupling(jax.random.wrap_key_data(jax.random.PRNGKey(9)),
                              p, q, draft)
  np.testing.assert_array_equal(a[0], b[0])


# --- Property tests of the math identities -----------------------------------


@st.composite
def _pq(draw):
  vocab = draw(st.sampled_from([1, 2, 3, 7, 16]))
  weights = st.one_of(st.just(0.0), st.floats(1e-3, 1.0))
  p = np.array(draw(st.lists(weights, min_size=vocab, max_size=vocab)))
  q = np.array(draw(st.lists(weights, min_size=vocab, max_size=vocab)))
  p[draw(st.integers(0, vocab - 1))] += 0.5  # never all zero
  q[draw(st.integers(0, vocab - 1))] += 0.5
  return (jnp.asarray(p / p.sum(), jnp.float32),
          jnp.asarray(q / q.sum(), jnp.float32))


@jax.jit
def _math(p, q):
  return (specjax.residual(p, q), specjax.acceptance_probability(p, q),
          specjax.tv_distance(p, q), specjax.tv_distance(q, p))


@settings(max_examples=100, deadline=None)
@given(_pq())
def test_math_identities(pq):
  p, q = pq
  res, acc, tv, tv_qp = _math(p, q)
  assert float(acc) == pytest.approx(1 - float(tv), abs=1e-6)
  assert float(tv) == pytest.approx(float(tv_qp), abs=1e-7)
  assert -1e-7 <= float(tv) <= 1 + 1e-6
  assert np.all(np.asarray(res) >= 0)
  assert float(jnp.sum(res)) == pytest.approx(1.0, abs=1e-5)
  # The two branches add back to p: min(p, q) + TV * r = p.
  np.testing.assert_allclose(jnp.minimum(p, q) + tv * res, p, atol=1e-6)
  # When p != q the residual lives only where p exceeds q.
  if float(tv) > 0:
    assert np.all(np.asarray(res)[np.asarray(p <= q)] == 0)


# --- Throughput accounting ----------------------------------------------------


@pytest.mark.parametrize("alpha,gamma,speed,ops", [
    (0.6, 2, 1.96, 1.53),
    (0.7, 3, 2.53, 1.58),
    (0.8, 2, 2.44, 1.23),
    (0.8, 5, 3.69, 1.63),
    (0.9, 2, 2.71, 1.11),
    (0.9, 10, 6.86, 1.60),
])
def test_leviathan_table_1(alpha, gamma, speed, ops):
  assert round(float(accounting.walltime_improvement(alpha, gamma, 0.0)),
               2) == speed
  assert round(float(accounting.operations_increase(alpha, gamma, 0.0)),
               2) == ops


def test_seed_example_beta_0_8_gamma_5_is_about_3_7_tokens():
  assert float(accounting.expected_tokens_per_pass(0.8, 5)) == pytest.approx(
      3.69, abs=0.005)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 40))
@example(1.0, 0.75, 0)  # the closed form rounded to 1 - 1e-16 here
def test_expected_tokens_bounds_and_monotonicity(a1, a2, gamma):
  lo, hi = min(a1, a2), max(a1, a2)
  e_lo = float(accounting.expected_tokens_per_pass(lo, gamma))
  e_hi = float(accounting.expected_tokens_per_pass(hi, gamma))
  # (The closed form loses up to ~sqrt(eps) relative near alpha = 1.)
  assert 1.0 <= e_lo <= (gamma + 1) * (1 + 1e-8)
  assert e_lo <= e_hi * (1 + 1e-8)
  assert e_hi <= float(accounting.expected_tokens_per_pass(
      hi, gamma + 1)) * (1 + 1e-8)
  # Closed form agrees with the truncated geometric series it sums.
  assert e_hi == pytest.approx(sum(hi**k for k in range(gamma + 1)),
                               rel=1e-8)


@pytest.mark.parametrize("gamma", [0, 1, 3, 10])
def test_alpha_one_limit_is_continuous(gamma):
  at_one = float(accounting.expected_tokens_per_pass(1.0, gamma))
  assert at_one == gamma + 1
  for eps in (1e-6, 1e-9, 1e-12, 2.0**-53):
    near = float(accounting.expected_tokens_per_pass(1.0 - eps, gamma))
    assert near == pytest.approx(at_one, rel=gamma * 1e-5 + 1e-12)
  np.testing.assert_allclose(
      accounting.expected_tokens_per_pass(np.array([0.5, 1.0]), gamma),
      [2 - 0.5**gamma, gamma + 1])


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 20), st.floats(0.0, 2.0),
       st.floats(0.1, 3.0))
def test_speedup_is_tokens_over_round_cost(alpha, gamma, c, r):
  tokens = float(accounting.expected_tokens_per_pass(alpha, gamma))
  speed = float(accounting.walltime_improvement(alpha, gamma, c, r))
  assert speed == pytest.approx(tokens / (gamma * c + r), rel=1e-12)
  ops = float(accounting.operations_increase(alpha, gamma, c))
  assert ops == pytest.approx((gamma * c + gamma + 1) / tokens, rel=1e-12)


def test_optimal_gamma():
  for alpha, c, r in [(0.8, 0.05, 1.0), (0.6, 0.1, 1.0), (0.9, 0.02, 1.5),
                      (0.7, 0.3, 1.0)]:
    best = accounting.optimal_gamma(alpha, c, r)
    gammas = np.arange(1, 33)
    speeds = accounting.walltime_improvement(alpha, gammas, c, r)
    assert best == int(gammas[np.argmax(speeds)])
    assert 1 < best < 32
  assert accounting.optimal_gamma(0.8, 0.05) == 8
  # Free drafts: longer is always better, up to the cap.
  assert accounting.optimal_gamma(0.8, 0.0, max_gamma=12) == 12
  # A hopeless draft: gamma = 1, and speculation does not pay.
  assert accounting.optimal_gamma(0.0, 0.5) == 1
  assert float(accounting.walltime_improvement(0.0, 1, 0.5)) < 1
  # Better drafts never want shorter drafts.
  gammas = [accounting.optimal_gamma(a, 0.05) for a in np.linspace(0, .95, 20)]
  assert gammas == sorted(gammas)


def test_accounting_rejects_bad_inputs():
  with pytest.raises(ValueError, match="alpha"):
    accounting.expected_tokens_per_pass(1.5, 2)
  with pytest.raises(ValueError, match="gamma"):
    accounting.expected_tokens_per_pass(0.5, 2.5)
  with pytest.raises(ValueError, match="gamma"):
    accounting.expected_tokens_per_pass(0.5, -1)
  with pytest.raises(ValueError, match="c"):
    accounting.walltime_improvement(0.5, 2, -0.1)
  with pytest.raises(ValueError, match="r"):
    accounting.walltime_improvement(0.5, 2, 0.1, 0.0)
  # Strings, None and bools are not numbers, though numpy would coerce them.
  with pytest.raises(TypeError, match="alpha"):
    accounting.expected_tokens_per_pass("0.5", 2)
  with pytest.raises(TypeError, match="alpha"):
    accounting.expected_tokens_per_pass(True, 2)
  with pytest.raises(TypeError, match="c must"):
    accounting.walltime_improvement(0.5, 2, "0.1")
  # ... nor inside a list, where numpy read [True, 0.5] as [1.0, 0.5].
  for call, name in (
      (lambda: accounting.expected_tokens_per_pass([True, 0.5], 2), "alpha"),
      (lambda: accounting.expected_tokens_per_pass(0.5, [True, 2]), "gamma"),
      (lambda: accounting.walltime_improvement(0.5, 2, [True, 0.1]), "c"),
      (lambda: accounting.crossover_batch([True, 2, 4], [2.0, 1.0, 0.5]),
       "batch_sizes")):
    with pytest.raises(TypeError, match=f"{name} must hold numbers, not bools"):
      call()
  # Shapes that do not broadcast are named (numpy's error named none).
  with pytest.raises(ValueError, match=r"alpha \(3,\), gamma \(2,\) do not "
                     "broadcast"):
    accounting.expected_tokens_per_pass(np.full(3, 0.5), np.array([1, 2]))
  with pytest.raises(ValueError, match=r"c \(2,\), r \(\) do not broadcast"):
    accounting.walltime_improvement(np.full(3, 0.5), 2, np.array([0.1, 0.2]))
  # optimal_gamma takes scalars: an array or None is refused by name.
  with pytest.raises(ValueError, match="alpha must be a scalar"):
    accounting.optimal_gamma(np.array([0.5, 0.6]), 0.1)
  with pytest.raises(TypeError, match="alpha"):
    accounting.optimal_gamma(None, 0.1)
  with pytest.raises(ValueError, match="c must be a scalar"):
    accounting.optimal_gamma(0.5, np.array([0.1, 0.2]))
  # Every gamma up to max_gamma is scored: 10^12 asked numpy for 7 TiB.
  with pytest.raises(ValueError, match="max_gamma"):
    accounting.optimal_gamma(0.8, 0.05, max_gamma=10**12)


@pytest.mark.parametrize("gamma", [np.int8(127), np.uint8(255),
                                   np.int16(32767), 2**63 - 1])
def test_integer_gamma_at_its_dtype_maximum_does_not_wrap(gamma):
  # gamma + 1 in the gamma's own dtype would wrap to a negative exponent
  # (int8 127: -6.8e38, uint8 255: 0, int16 32767 and 2**63 - 1: -inf).
  # Python ints do not wrap; for 2**63 - 1 this is the limit 1 / (1 - 0.9).
  exact = (1 - 0.9 ** (int(gamma) + 1)) / (1 - 0.9)
  assert float(accounting.expected_tokens_per_pass(0.9, gamma)) == (
      pytest.approx(exact, rel=1e-12))
  assert float(accounting.expected_tokens_per_pass(0.5, gamma)) == (
      pytest.approx(2.0, rel=1e-12))
  assert float(accounting.walltime_improvement(0.9, gamma, 0)) == (
      pytest.approx(exact, rel=1e-12))
  assert float(accounting.expected_tokens_per_pass(1.0, gamma)) == (
      float(gamma) + 1)
  ops = float(accounting.operations_increase(0.5, gamma, 0.0))
  assert ops == pytest.approx((float(gamma) + 1) / 2, rel=1e-12)


def test_expected_tokens_is_accurate_next_to_alpha_one():
  # 1 - a^2 cancels near a = 1: the closed form returned 2.0 here (relative
  # error 4e-9, ~sqrt(eps)); the sum itself is 1 + a to the last digit.
  for a in (1 - 7.35e-9, 1 - 1e-12, 1 - 3e-5):
    assert float(accounting.expected_tokens_per_pass(a, 1)) == (
        pytest.approx(1 + a, rel=4e-16, abs=0))
    assert float(accounting.expected_tokens_per_pass(a, 3)) == (
        pytest.approx(1 + a + a * a + a * a * a, rel=1e-15, abs=0))


# --- The sampling transform --------------------------------------------------


def test_temperature_zero_is_one_hot_argmax_lowest_id_on_ties():
  logits = jnp.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0],
                      [-1.0, -2.0, -0.5, -3.0]])
  probs = sampling.probabilities(logits, sampling.GREEDY)
  np.testing.assert_array_equal(probs, np.eye(4)[[1, 0, 2]])
  assert probs.dtype == jnp.float32


def test_top_k_keeps_k_and_boundary_ties():
  logits = jnp.array([0.1, 2.0, -1.0, 1.5, 0.7, 3.0])
  probs = np.asarray(sampling.probabilities(
      logits, sampling.SamplingConfig(top_k=3)))
  np.testing.assert_array_equal(np.flatnonzero(probs), [1, 3, 5])
  expected = np.exp([2.0, 1.5, 3.0]) / np.exp([2.0, 1.5, 3.0]).sum()
  np.testing.assert_allclose(probs[[1, 3, 5]], expected, rtol=1e-6)
  tied = np.asarray(sampling.probabilities(
      jnp.array([3.0, 2.0, 2.0, 0.0]), sampling.SamplingConfig(top_k=2)))
  np.testing.assert_array_equal(np.flatnonzero(tied), [0, 1, 2])
  full = sampling.probabilities(logits, sampling.SamplingConfig(top_k=6))
  assert np.all(np.asarray(full) > 0)


def test_top_p_keeps_the_smallest_nucleus():
  logits = jnp.log(jnp.array([0.15, 0.5, 0.05, 0.3]))
  for top_p, kept in [(0.45, [1]), (0.75, [1, 3]), (0.9, [0, 1, 3]),
                      (1.0, [0, 1, 2, 3])]:
    probs = np.asarray(sampling.probabilities(
        logits, sampling.SamplingConfig(top_p=top_p)))
    np.testing.assert_array_equal(np.flatnonzero(probs), kept)
    raw = np.array([0.15, 0.5, 0.05, 0.3])[kept]
    np.testing.assert_allclose(probs[kept], raw / raw.sum(), rtol=1e-5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=8, max_size=8),
       st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.integers(0, 8),
       st.sampled_from([0.1, 0.5, 0.9, 1.0]))
def test_probabilities_are_normalised_and_keep_the_argmax(logits, temperature,
                                                          top_k, top_p):
  config = sampling.SamplingConfig(temperature=temperature, top_k=top_k,
                                   top_p=top_p)
  logits = jnp.asarray(logits, jnp.float32)
  probs = np.asarray(sampling.probabilities(logits, config))
  assert np.all(probs >= 0) and np.all(np.isfinite(probs))
  assert probs.sum() == pytest.approx(1.0, abs=1e-5)
  assert probs[int(np.argmax(np.asarray(logits)))] > 0
  if top_k and temperature > 0:
    kth = np.sort(np.asarray(logits))[::-1][top_k - 1]
    np.testing.assert_array_equal(probs > 0,
                                  (probs > 0) & (np.asarray(logits) >= kth))


@pytest.mark.parametrize("config", [
    pytest.param(sampling.SamplingConfig(), marks=pytest.mark.full),
    sampling.SamplingConfig(temperature=0.6, top_k=5, top_p=0.8),
    pytest.param(sampling.GREEDY, marks=pytest.mark.full),
])
def test_same_transform_for_target_and_draft(config):
  # The decode loop must turn target and draft logits into p and q by the
  # same transform: with the target as its own draft, p == q at every
  # verified position, so sum_x min(p, q) is 1 and every draft is kept. A
  # transform applied to one side only (or differently) makes q != p and
  # both numbers drop below 1 (the wrong-temperature control below).
  model = testing.toy_transformer(32, 3, embed_scale=1.0)
  prompts = np.tile(np.arange(1, 5, dtype=np.int32), (4, 1))
  lengths = np.full(4, 4, np.int32)
  out = specjax.speculative_generate(model, model, prompts, lengths,
                                     jax.random.key(0), gamma=3,
                                     max_new_tokens=8, sampling=config)
  s = out.summary()
  assert s["alpha_hat"] == 1.0, s
  assert s["one_minus_tv"] == pytest.approx(1.0, abs=1e-5), s
  # Control: scaling only the draft's logits (a different temperature) is
  # visible in the same statistic.
  hotter = testing.toy_transformer(32, 3, embed_scale=0.5)
  other = specjax.speculative_generate(model, hotter, prompts, lengths,
                                       jax.random.key(0), gamma=3,
                                       max_new_tokens=8, sampling=config)
  if not config.greedy:
    assert other.summary()["one_minus_tv"] < 0.999


def _reference_probabilities(logits_xV, config):
  """float64 numpy reference of temperature -> top-k -> top-p (ties kept)."""
  z = np.asarray(logits_xV, np.float64)
  if config.greedy:
    return np.eye(z.shape[-1])[z.argmax(-1)]
  keep = np.ones_like(z, bool)
  if config.top_k:
    keep = z >= np.sort(z, -1)[..., -config.top_k][..., None]
  z = np.where(keep, (z - z.max(-1, keepdims=True)) / config.temperature,
               -np.inf)
  p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  if config.top_p < 1.0:
    sorted_ = -np.sort(-p, -1)
    kept = np.cumsum(sorted_, -1) - sorted_ < config.top_p
    threshold = np.where(kept, sorted_, np.inf).min(-1, keepdims=True)
    p = np.where(p >= threshold, p, 0.0)
    p = p / p.sum(-1, keepdims=True)
  return p


@pytest.mark.parametrize("config", [
    sampling.SamplingConfig(),
    sampling.SamplingConfig(temperature=0.6, top_k=5, top_p=0.8),
    sampling.SamplingConfig(temperature=1.3, top_p=0.5),
    sampling.GREEDY,
])
def test_probabilities_match_a_float64_reference(config):
  logits = np.random.default_rng(9).normal(size=(16, 32)).astype(np.float32)
  np.testing.assert_allclose(sampling.probabilities(jnp.asarray(logits),
                                                    config),
                             _reference_probabilities(logits, config),
                             atol=2e-6)


def test_sampling_config_rejects_bad_values():
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingConfig(temperature=-0.1)
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingConfig(temperature=float("nan"))
  for top_p in (0.0, -0.5, 1.01):
    with pytest.raises(ValueError, match="top_p"):
      sampling.SamplingConfig(top_p=top_p)
  with pytest.raises(ValueError, match="top_k"):
    sampling.SamplingConfig(top_k=-1)
  with pytest.raises(TypeError, match="top_k"):
    sampling.SamplingConfig(top_k=2.5)
  with pytest.raises(TypeError, match="top_k"):
    sampling.SamplingConfig(top_k=True)
  with pytest.raises(ValueError, match="top_k"):
    sampling.probabilities(jnp.zeros(4), sampling.SamplingConfig(top_k=5))
  with pytest.raises(TypeError, match="float"):
    sampling.probabilities(jnp.zeros(4, jnp.int32), sampling.SamplingConfig())
  with pytest.raises(TypeError, match="SamplingConfig"):
    sampling.probabilities(jnp.zeros(4), {"temperature": 1.0})


@pytest.mark.parametrize("config", [sampling.SamplingConfig(), sampling.GREEDY])
def test_probabilities_refuse_rows_without_a_distribution(config):
  # -inf masks a token; a NaN, a +inf or an all -inf row is no distribution.
  np.testing.assert_allclose(sampling.probabilities(
      jnp.array([0.0, -jnp.inf, 0.0]), sampling.SamplingConfig()),
                             [0.5, 0.0, 0.5])
  for row in ([0.0, jnp.nan, 1.0], [0.0, jnp.inf, 1.0], [-jnp.inf] * 3):
    logits = jnp.zeros((2, 3, 3)).at[1, 2].set(jnp.array(row))
    with pytest.raises(ValueError, match=r"row \(1, 2\)"):
      sampling.probabilities(logits, config)


def test_sample_and_probabilities_refuse_what_they_cannot_draw_from():
  key = jax.random.key(0)
  # A float32 CDF total of inf drew the last token every time.
  with pytest.raises(ValueError, match="past float32's range: rescale"):
    sampling.sample(key, jnp.array([2e38, 2e38], jnp.float32))
  # One key for every row (a batch of keys failed inside jax.random).
  with pytest.raises(ValueError, match="key must be a single PRNG key"):
    sampling.sample(jax.random.split(key, 2), jnp.full((2, 2), 0.5))
  with pytest.raises(ValueError, match="logits has an empty vocabulary"):
    sampling.probabilities(jnp.zeros((2, 0)), sampling.GREEDY)
  # A list is an array-like, as everywhere else.
  np.testing.assert_allclose(
      sampling.probabilities([0.0, 0.0], sampling.SamplingConfig()),
      [0.5, 0.5])


def test_coupling_rejects_bad_inputs():
  p, q = jnp.array(P_WORKED), jnp.array(Q_WORKED)
  key = jax.random.key(0)
  draft = jnp.array([0, 1], jnp.int32)
  with pytest.raises(ValueError, match="vocabulary"):
    specjax.coupling_sample(key, p, jnp.array([0.5, 0.5]), draft)
  with pytest.raises(ValueError, match="vocabulary"):
    specjax.tv_distance(p, jnp.ones(4) / 4)
  with pytest.raises(TypeError, match="float"):
    specjax.residual(jnp.array([1, 0]), jnp.array([0.5, 0.5]))
  with pytest.raises(TypeError, match="integer"):
    specjax.coupling_sample(key, p, q, jnp.array([0.0, 1.0]))
  with pytest.raises(TypeError, match="key"):
    specjax.coupling_sample(0, p, q, draft)
  with pytest.raises(ValueError, match="shape"):
    specjax.coupling_sample(key, jnp.ones((3, 3)) / 3, q, draft)
  with pytest.raises(ValueError, match="key"):
    specjax.coupling_sample(jax.random.split(key, 3), p, q, draft)


def test_tiny_positive_temperature_is_rejected_not_nan():
  with pytest.raises(ValueError, match="temperature=0"):
    sampling.SamplingConfig(temperature=1e-39)
  probs = sampling.probabilities(jnp.array([1.0, 3.0, 2.0]),
                                 sampling.SamplingConfig(
                                     temperature=sampling.MIN_TEMPERATURE))
  np.testing.assert_allclose(probs, [0.0, 1.0, 0.0])


def test_top_k_ranks_raw_logits_before_rounding():
  # 9.8e-36 - 1 rounds to -1 = 0 - 1 in float32: ranking after the shift would
  # tie the four zero logits with the fourth-largest one and keep them all.
  logits = jnp.array([0, 0, 0, 0, 1, 1, 1, 9.817772474681332e-36], jnp.float32)
  probs = sampling.probabilities(
      logits, sampling.SamplingConfig(temperature=0.5, top_k=4))
  np.testing.assert_array_equal(np.asarray(probs) > 0,
                                [0, 0, 0, 0, 1, 1, 1, 1])
