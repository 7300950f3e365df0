"""Statistical exactness of the coupling, and of the harness that checks it.

`specjax.coupling_sample` must pass `specjax.testing.check_coupling` with
n = 10^6 draws on adversarial (p, q) pairs, and the two deliberately wrong
couplings must FAIL the very same check wherever their output law differs
from p (and pass where it coincides, which shows the check is specific, not
merely strict). The harness itself is calibrated on exact multinomial draws.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import testing

N = 10**6
SIG = testing.DEFAULT_SIGNIFICANCE

_coupling = jax.jit(specjax.coupling_sample)
_wrong_fallback = jax.jit(testing.wrong_fallback_coupling)
_always_accept = jax.jit(testing.always_accept_coupling)


def _normalise(x):
  x = np.asarray(x, dtype=np.float64)
  return (x / x.sum()).astype(np.float32)


def _one_hot(i, v):
  x = np.zeros(v, np.float32)
  x[i] = 1.0
  return x


def _cases():
  rng = np.random.default_rng(20230518)
  v_peak = 1000
  peaked = np.full(v_peak, 0.1 / (v_peak - 1))
  peaked[17] = 0.9
  same = _normalise(rng.dirichlet(np.full(16, 0.7)))
  logits = rng.normal(0.0, 3.0, 50_000)
  draft_logits = logits + rng.normal(0.0, 1.0, 50_000)
  return {
      # The seed's worked example: acceptance 0.6, residual (1/2, 1/2, 0).
      "worked_example": ([0.5, 0.3, 0.2], [0.3, 0.1, 0.6]),
      "p_equals_q": (same, same),
      "disjoint_supports": ([0.5, 0.5, 0, 0, 0], [0, 0, 0.2, 0.3, 0.5]),
      "peaked_p_uniform_q": (peaked, np.full(v_peak, 1.0 / v_peak)),
      "uniform_p_peaked_q": (np.full(v_peak, 1.0 / v_peak), peaked),
      "q_zero_where_p_positive": ([0.4, 0.3, 0.2, 0.1], [0.0, 0.6, 0.0, 0.4]),
      "p_zero_where_q_positive": ([0.6, 0.0, 0.4, 0.0], [0.25] * 4),
      "greedy_one_hot_mismatch": (_one_hot(3, 8), _one_hot(5, 8)),
      "dirichlet_V50000": (rng.dirichlet(np.full(50_000, 0.5)),
                           rng.dirichlet(np.full(50_000, 0.5))),
      "draft_like_V50000": (np.exp(logits - logits.max()),
                            np.exp(draft_logits - draft_logits.max())),
  }


CASES = {name: (_normalise(p), _normalise(q))
         for name, (p, q) in _cases().items()}


def _masked_case():
  """p with half the vocabulary masked to exactly 0 (as top-k / top-p do)."""
  rng = np.random.default_rng(7)
  p = rng.dirichlet(np.full(50_000, 0.5))
  p[rng.random(50_000) < 0.5] = 0.0
  return _normalise(p), _normalise(rng.dirichlet(np.full(50_000, 0.5)))


def _key(name, salt=0):
  return jax.random.fold_in(jax.random.key(salt), sum(map(ord, name)))


@pytest.mark.parametrize("name", list(CASES))
def test_coupling_sample_is_exact(name):
  p, q = CASES[name]
  result = testing.check_coupling(_coupling, p, q, key=_key(name), n=N)
  assert result.passed, str(result)
  assert result.output.n == N and result.acceptance.n == N
  # The acceptance rate is the maximal-coupling rate 1 - TV(p, q).
  assert result.acceptance.expected_rate == pytest.approx(
      1 - result.tv_pq, abs=1e-9)


def test_coupling_sample_is_exact_in_float64():
  p, q = CASES["worked_example"]
  with jax.enable_x64(True):
    p64, q64 = jnp.asarray(p, jnp.float64), jnp.asarray(q, jnp.float64)
    result = testing.check_coupling(specjax.coupling_sample, p64, q64,
                                    key=jax.random.key(64), n=N)
    # The control, in float64 too.
    control = testing.check_coupling(_wrong_fallback, p64, q64,
                                     key=jax.random.key(64), n=N)
  assert result.passed, str(result)
  assert not control.passed, str(control)


@pytest.mark.parametrize("dtype, tiny", [
    (jnp.bfloat16, 2.0**-8),
    pytest.param(jnp.float16, 2.0**-11, marks=pytest.mark.full)])
def test_low_precision_probabilities_keep_their_law(dtype, tiny):
  """Probabilities in bfloat16 / float16 are sampled with float32 uniforms
  and CDFs. The control draws the uniform in the input's precision, as the
  samplers once did: a bfloat16 uniform takes 128 values, so token 0 (mass
  2^-8) came out at twice its rate."""
  p = jnp.asarray([tiny, 1 - tiny], dtype)
  law = np.asarray(p, np.float64)
  p_NxV = jnp.broadcast_to(p, (N, 2))
  draws = specjax.sample(jax.random.key(0), p_NxV)
  assert testing.check_distribution(draws, law).passed
  coupled = testing.check_coupling(
      specjax.coupling_sample, p, jnp.asarray([0.5, 0.5], dtype),
      key=jax.random.key(1), n=N)
  assert coupled.passed, str(coupled)
  u_low = jax.random.uniform(jax.random.key(0), (N,), dtype=dtype)
  control = specjax.sampling.sample_from_probs(u_low, p_NxV)
  assert not testing.check_distribution(control, law).passed


def test_invalid_probabilities_and_draft_tokens_are_refused():
  p, q = jnp.asarray([0.5, 0.3, 0.2]), jnp.asarray([0.3, 0.1, 0.6])
  key = jax.random.key(0)
  for bad in (-1, 3):  # a gather would wrap or clamp it, and keep it
    with pytest.raises(ValueError, match=rf"draft_token\[0\] = {bad} is "
                       r"outside the vocabulary \[0, 3\)"):
      specjax.coupling_sample(key, p, q, jnp.full((4,), bad, jnp.int32))
  not_a_law = {"sum to 1": 2 * p, "negative": jnp.asarray([1.2, -0.2, 0.0]),
               "NaN or inf": jnp.asarray([jnp.nan, 0.5, 0.5])}
  for match, bad in not_a_law.items():
    for fn in (specjax.residual, specjax.acceptance_probability,
               specjax.tv_distance):
      with pytest.raises(ValueError, match=match):
        fn(bad, q)
      with pytest.raises(ValueError, match=match):
        fn(p, bad)
    with pytest.raises(ValueError, match=match):
      specjax.coupling_sample(key, bad, q, jnp.zeros((2,), jnp.int32))
  # sample takes weights (rows need not sum to 1), but not these.
  assert int(specjax.sample(key, jnp.asarray([0.0, 2.0, 0.0]))) == 1
  for match, bad in (("positive mass", jnp.zeros((2, 3))),
                     ("negative", jnp.asarray([0.5, -0.1, 0.6])),
                     ("NaN or inf", jnp.asarray([jnp.inf, 0.5, 0.5])),
                     ("empty vocabulary", jnp.zeros((2, 0))),
                     # Positive but denormal: XLA on CPU flushes it to 0,
                     # and every draw was token 0.
                     ("smallest normal", jnp.asarray([1e-40, 1e-40])),
                     # float64 values past float32's range read as "NaN or
                     # inf" and "all zeros" (checked after the cast).
                     ("past float32's range", np.array([1e300, 1.0])),
                     ("smallest normal", np.array([1e-300, 1e-300]))):
    with pytest.raises(ValueError, match=match):
      specjax.sample(key, bad)


@pytest.mark.full
def test_coupling_sample_never_emits_masked_tokens_at_scale():
  p, q = _masked_case()
  result = testing.check_coupling(_coupling, p, q, key=jax.random.key(5), n=N)
  assert result.output.num_impossible == 0, str(result)
  assert result.passed, str(result)
  # The control: keeping every draft emits the masked tokens q proposes.
  control = testing.check_coupling(_always_accept, p, q,
                                   key=jax.random.key(5), n=N)
  assert control.output.num_impossible > 0 and not control.passed, str(
      control)


def _control_law(control, p, q):
  """The exact output distribution of a negative control, float64 `[V]`."""
  p, q = p.astype(np.float64), q.astype(np.float64)
  if control == "always_accept":
    return q
  return np.minimum(p, q) + 0.5 * np.abs(p - q).sum() * p


def _control_separation(control, p, q, n=N):
  """How far a control's law is from p at n draws, in chi-square units.

  Returns (noncentrality, expected impossible count): the first is
  n * sum_{p > 0} (law - p)^2 / p, the second n * law({p = 0}).
  """
  law = _control_law(control, p, q)
  p64 = p.astype(np.float64)
  support = p64 > 0
  noncentrality = n * np.sum((law[support] - p64[support])**2 / p64[support])
  return noncentrality, n * law[~support].sum()


@pytest.mark.parametrize("control", ["wrong_fallback", "always_accept"])
@pytest.mark.parametrize("name", list(CASES))
def test_negative_controls_fail_where_their_law_differs(name, control):
  p, q = CASES[name]
  fn = _wrong_fallback if control == "wrong_fallback" else _always_accept
  noncentrality, impossible = _control_separation(control, p, q)
  dof = np.sum(p > 0) - 1
  result = testing.check_coupling(fn, p, q, key=_key(name, 1), n=N)
  if impossible > 100 or noncentrality > 100 + 10 * np.sqrt(2 * dof):
    # Rejected, and by a wide margin: impossible tokens, or a p-value many
    # orders of magnitude below the 1e-6 threshold.
    assert not result.passed, str(result)
    assert not result.output.passed, str(result)
    assert (result.output.num_impossible > 0
            or result.output.p_value < 1e-30), str(result)
  elif impossible == 0 and noncentrality < 1e-3:
    # Where the wrong rule happens to produce p, the same check accepts it.
    assert result.output.passed, str(result)
  else:
    pytest.fail(f"case {name} is ambiguous for {control}: noncentrality "
                f"{noncentrality}, impossible {impossible}")
  # The wrong fallback keeps the right acceptance rule; always-accept does not.
  if control == "wrong_fallback":
    assert result.acceptance.passed, str(result)
  else:
    assert result.acceptance.passed == (result.tv_pq == 0.0), str(result)


def test_every_negative_control_is_rejected_somewhere():
  rejected = {
      control: [name for name, (p, q) in CASES.items()
                if max(_control_separation(control, p, q)) > 1000]
      for control in ("wrong_fallback", "always_accept")}
  for control in rejected:
    assert {"worked_example", "peaked_p_uniform_q"} <= set(rejected[control])
  assert len(rejected["always_accept"]) == len(CASES) - 1  # all but p == q


# The harness on its own: calibration, power and validation.


def test_harness_null_calibration_with_heavy_pooling():
  """Exact multinomial draws give ~uniform p-values, even with heavy pooling."""
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.full(5000, 0.3))
  p_values = []
  for _ in range(300):
    result = testing.check_counts(rng.multinomial(2000, p), p,
                                  significance=0.05)
    assert result.num_pooled > 4000  # most expected counts are < 5
    assert result.tv <= testing.sampling_tv_bound(p, 2000, significance=1e-6)
    p_values.append(result.p_value)
  p_values = np.asarray(p_values)
  assert 0.02 <= np.mean(p_values < 0.05) <= 0.09
  assert 0.40 <= np.mean(p_values < 0.5) <= 0.60


def test_harness_rejects_one_percent_contamination_at_n_1e6():
  p = np.array([0.5, 0.3, 0.2])
  contaminated = 0.99 * p + 0.01 * np.array([0.3, 0.1, 0.6])
  counts = np.random.default_rng(1).multinomial(N, contaminated)
  result = testing.check_counts(counts, p)
  assert not result.passed and result.p_value < 1e-12, str(result)
  clean = testing.check_counts(np.random.default_rng(1).multinomial(N, p), p)
  assert clean.passed, str(clean)


def test_pooling_bins_all_reach_min_expected_and_keep_totals():
  rng = np.random.default_rng(3)
  expected = 1e4 * rng.dirichlet(np.full(3000, 0.2))
  observed = rng.poisson(expected).astype(np.float64)
  bins_e, bins_o, num_pooled = testing._pool(expected, observed, 5.0)
  assert np.all(bins_e >= 5.0)
  assert num_pooled == np.sum(expected < 5.0) > 0
  np.testing.assert_allclose(bins_e.sum(), expected.sum())
  np.testing.assert_allclose(bins_o.sum(), observed.sum())
  # Too little small mass for a full bin: it joins the smallest large cell.
  bins_e, _, _ = testing._pool(np.array([100.0, 50.0, 1.0, 2.0]),
                               np.array([90.0, 60.0, 0.0, 3.0]), 5.0)
  np.testing.assert_allclose(np.sort(bins_e), [53.0, 100.0])


def test_impossible_and_out_of_range_outcomes_fail():
  p = np.array([0.5, 0.5, 0.0])
  ok = testing.check_distribution(np.array([0, 1] * 500), p)
  assert ok.passed and ok.num_impossible == 0, str(ok)
  for bad in (2, 3, -1):
    result = testing.check_distribution(np.array([0, 1] * 500 + [bad]), p)
    assert not result.passed and result.num_impossible == 1, str(result)
    assert "FAIL" in str(result)


def test_check_distribution_matches_check_counts_and_single_cell():
  rng = np.random.default_rng(4)
  p = rng.dirichlet(np.ones(50))
  samples = rng.choice(50, size=10_000, p=p).astype(np.int32)
  a = testing.check_distribution(samples.reshape(100, 100), p)
  b = testing.check_counts(np.bincount(samples, minlength=50), p)
  assert a == b
  assert a.passed and "PASS" in str(a)
  one = testing.check_distribution(np.zeros(7, np.int32), np.array([1.0, 0.0]))
  assert one.passed and one.dof == 0 and one.p_value == 1.0


def test_tv_bound_scales_as_one_over_sqrt_n():
  p = np.full(100, 0.01)
  b1 = testing.sampling_tv_bound(p, 10**4)
  b2 = testing.sampling_tv_bound(p, 10**6)
  assert b1 / b2 == pytest.approx(10.0)
  assert testing.sampling_tv_bound(p, 10**4, significance=1e-2) < b1


def test_check_acceptance():
  rng = np.random.default_rng(5)
  accepted = rng.random(N) < 0.6
  assert testing.check_acceptance(accepted, 0.6).passed
  # The docstring's own example: a 0-d jax array, as the coupling returns.
  rate = specjax.acceptance_probability(jnp.asarray([0.5, 0.3, 0.2]),
                                        jnp.asarray([0.3, 0.1, 0.6]))
  assert testing.check_acceptance(accepted, rate).passed
  shifted = testing.check_acceptance(accepted, 0.61)
  assert not shifted.passed and shifted.z < -15, str(shifted)
  assert shifted.standard_error == pytest.approx(np.sqrt(0.61 * 0.39 / N))
  assert testing.check_acceptance(np.ones(10, bool), 1.0).passed
  never = testing.check_acceptance(np.array([True] * 9 + [False]), 1.0)
  assert not never.passed and never.p_value == 0.0 and never.z == -np.inf
  # Exact binomial test near the boundary, where a z-test would be off.
  rare = testing.check_acceptance(np.arange(N) < 3, 1e-6)
  assert rare.passed and rare.p_value == pytest.approx(0.1606, abs=1e-3)


def test_harness_p_values_match_scipy():
  stats = pytest.importorskip("scipy.stats")
  assert testing._chi2_sf(41000.0, 40000) == pytest.approx(
      stats.chi2.sf(41000.0, 40000), rel=1e-6)
  assert testing._chi2_sf(30.0, 2) == pytest.approx(stats.chi2.sf(30.0, 2),
                                                    rel=1e-9)
  two_sided = 2 * min(stats.binom.sf(600_499, N, 0.6),
                      stats.binom.cdf(600_500, N, 0.6))
  assert testing._binomial_two_sided(600_500, N, 0.6) == pytest.approx(
      two_sided, rel=1e-6)


def test_harness_input_validation():
  p = np.array([0.5, 0.5])
  with pytest.raises(TypeError, match="integer"):
    testing.check_distribution(np.array([0.0, 1.0]), p)
  with pytest.raises(ValueError, match="sum to 1"):
    testing.check_distribution(np.array([0, 1]), np.array([0.5, 0.6]))
  with pytest.raises(ValueError, match="non-negative"):
    testing.check_distribution(np.array([0, 1]), np.array([1.5, -0.5]))
  with pytest.raises(ValueError, match="significance"):
    testing.check_distribution(np.array([0, 1]), p, significance=0.0)
  with pytest.raises(ValueError, match="outcomes"):
    testing.check_counts(np.array([1, 2, 3]), p)
  with pytest.raises(TypeError, match="bool"):
    testing.check_acceptance(np.array([1, 0]), 0.5)
  with pytest.raises(ValueError, match="expected_rate"):
    testing.check_acceptance(np.array([True]), 1.5)
  with pytest.raises(ValueError, match="vocabulary"):
    testing.check_coupling(_coupling, p.astype(np.float32),
                           np.full(3, 1 / 3, np.float32),
                           key=jax.random.key(0), n=10)
  # A key array failed inside jax.random (one position, one key).
  with pytest.raises(ValueError, match="single PRNG key"):
    testing.check_coupling(_coupling, p.astype(np.float32),
                           p.astype(np.float32),
                           key=jax.random.split(jax.random.key(0), 2), n=10)
