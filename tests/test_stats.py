"""specjax.stats and the truncation-aware accounting it uses.

No models and no timing: RowStats are built by hand, and the formulas are
checked against closed forms and Monte Carlo simulations of the round.
"""

import dataclasses
import math
import types

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import accounting
from specjax import stats
from specjax import testing
from specjax.decode import GenerationResult
from specjax.decode import RowStats


def _result(accepted_per_round, gamma, lengths):
  """A GenerationResult whose rows ran the given rounds (kept drafts each)."""
  rows = len(accepted_per_round)
  hist = np.zeros((rows, gamma + 1), np.int32)
  for b, rounds in enumerate(accepted_per_round):
    for a in rounds:
      hist[b, a] += 1
  n_rounds = np.array([len(r) for r in accepted_per_round], np.int32)
  accepted = np.array([sum(r) for r in accepted_per_round], np.int32)
  verified = np.array([sum(min(a + 1, gamma) for a in r)
                       for r in accepted_per_round], np.int32)
  s = RowStats.zeros(rows, gamma).replace(
      rounds=jnp.asarray(n_rounds), target_calls=jnp.asarray(n_rounds),
      draft_calls=jnp.asarray(gamma * n_rounds),
      verified=jnp.asarray(verified), accepted=jnp.asarray(accepted),
      overlap_sum=jnp.asarray(0.5 * verified, jnp.float32),
      accept_hist=jnp.asarray(hist),
      length_hist=jnp.zeros((rows, gamma + 1), jnp.int32).at[:, gamma].set(
          n_rounds))
  return GenerationResult(tokens=jnp.zeros((rows, 1), jnp.int32),
                          lengths=jnp.asarray(lengths, jnp.int32), stats=s)


def test_summary_counts_and_ratios():
  out = _result([[2, 0, 2], [1]], gamma=2, lengths=[8, 2]).summary()
  assert out["rows"] == 2 and out["generated_tokens"] == 10
  assert out["rounds"] == 4 and out["target_calls"] == 4
  assert out["loop_rounds"] == 3  # the slowest row
  assert out["draft_calls"] == out["proposed"] == 8
  assert out["accepted"] == 5 and out["verified"] == 2 + 1 + 2 + 2
  assert out["alpha_hat"] == pytest.approx(5 / 7)
  assert out["one_minus_tv"] == pytest.approx(0.5)
  assert out["tokens_per_target_call"] == pytest.approx(10 / 4)
  assert out["accept_hist"] == [1, 1, 2]
  assert out["gamma"] == 2


def test_summary_pools_results_and_refuses_mixed_gamma():
  a = _result([[1, 1]], gamma=2, lengths=[4])
  b = _result([[0, 2, 2]], gamma=2, lengths=[7])
  pooled = stats.summarize([a, b])
  assert pooled["generated_tokens"] == 11 and pooled["rounds"] == 5
  assert pooled["loop_rounds"] == 2 + 3
  assert pooled["accept_hist"] == [1, 2, 2]
  with pytest.raises(ValueError, match="accept_hist"):
    stats.summarize([a, _result([[1]], gamma=3, lengths=[2])])


def test_summary_refuses_counters_no_generation_produces():
  base = _result([[2, 0], [1]], gamma=2, lengths=[5, 2])
  fake = lambda **kw: types.SimpleNamespace(
      stats=base.stats.replace(**{k: jnp.asarray(v) for k, v in kw.items()
                                  if k != "lengths"}),
      lengths=jnp.asarray(kw.get("lengths", base.lengths)))
  for kwargs, match in (
      (dict(lengths=[5, 2, 1]), r"results\[0\].lengths has 3 rows but its "
       "stats have 2"),
      (dict(rounds=[-2, 1], length_hist=[[0, 0, -2], [0, 0, 1]]),
       "RowStats.rounds holds -2"),
      (dict(overlap_sum=[np.inf, 1.0]), "RowStats.overlap_sum holds inf"),
      (dict(overlap_sum=[30.0, 1.0]), "overlap_sum exceeds verified"),
      (dict(accept_hist=[[50, 0, 50], [0, 1, 0]]), "accept_hist counts other "
       "rounds")):
    with pytest.raises(ValueError, match=match):
      stats.summarize(fake(**kwargs))
  with pytest.raises(TypeError, match=r"results\[0\] is a str"):
    stats.summarize("abc")
  with pytest.raises(TypeError, match="results is a NoneType"):
    stats.summarize(None)


def test_new_rowstats_fields_are_summed_without_changes():
  """A counter another change adds to RowStats reaches the summary as is."""

  @flax.struct.dataclass(kw_only=True)
  class MoreStats(RowStats):
    future_counter: jax.Array

  base = _result([[1], [0, 0]], gamma=1, lengths=[2, 2])
  more = MoreStats(**{f.name: getattr(base.stats, f.name)
                      for f in dataclasses.fields(RowStats)},
                   future_counter=jnp.array([0, 3], jnp.int32))
  out = stats.summarize(types.SimpleNamespace(stats=more, lengths=base.lengths))
  assert out["future_counter"] == 3
  assert out["alpha_hat"] == base.summary()["alpha_hat"]


def test_autoregressive_summary():
  out = _result([[0] * 5], gamma=0, lengths=[5]).summary()
  assert math.isnan(out["alpha_hat"])
  assert out["expected_tokens_per_target_call"] == 1.0
  assert out["formula_tokens_per_target_call"] == 1.0


def test_formula_prices_a_rules_ragged_rounds_at_their_own_lengths():
  """Under a draft-length rule `gamma` is gamma_max, but rounds draft fewer:
  the formula averages (1 - a^(n+1)) / (1 - a) over the rounds' lengths n,
  and the budget-cut expectation, priced for one length, is not given."""
  base = _result([[1, 0, 2, 0], [0, 1]], gamma=4, lengths=[9, 3])
  # Rounds of 1, 2, 4, 0 (an off step) and 2, 2 drafts the row could keep.
  lengths_BxG1 = np.zeros((2, 5), np.int32)
  for b, row in enumerate([[1, 2, 4, 0], [2, 2]]):
    for n in row:
      lengths_BxG1[b, n] += 1
  ragged = base.replace(stats=base.stats.replace(
      length_hist=jnp.asarray(lengths_BxG1)))
  out = ragged.summary()
  a = out["alpha_hat"]
  f = lambda n: (1 - a ** (n + 1)) / (1 - a)
  assert out["gamma"] == 4 and out["length_hist"] == [1, 1, 3, 0, 1]
  assert out["formula_tokens_per_target_call"] == pytest.approx(
      (f(1) + 3 * f(2) + f(4) + 1) / 6)
  assert out["formula_tokens_per_target_call"] < 0.9 * f(4)  # not gamma_max
  assert math.isnan(out["expected_tokens_per_target_call"])
  # Off steps and probe rounds alone emit one token each.
  off = base.replace(stats=base.stats.replace(
      length_hist=jnp.zeros((2, 5), jnp.int32).at[:, 0].set(
          jnp.array([4, 2]))))
  assert off.summary()["formula_tokens_per_target_call"] == 1.0
  # Stats built by hand without the lengths would price every round as an
  # off step.
  with pytest.raises(ValueError, match="length_hist counts 0 rounds"):
    base.replace(stats=base.stats.replace(
        length_hist=jnp.zeros((2, 5), jnp.int32))).summary()
  assert off.summary()["expected_tokens_per_target_call"] == 1.0
  # A fixed gamma's rounds keep the budget-cut expectation, below the
  # uncut formula.
  fixed = base.summary()
  assert fixed["formula_tokens_per_target_call"] == pytest.approx(f(4))
  assert fixed["expected_tokens_per_target_call"] < f(4)


def _simulate_rounds(alpha, gamma, n, size, rng):
  out = np.empty(size, np.int64)
  for i in range(size):
    left, k = n, 0
    while left > 0:
      a = 0
      while a < gamma and rng.random() < alpha:
        a += 1
      left -= a + 1
      k += 1
    out[i] = k
  return out


@pytest.mark.parametrize("alpha,gamma,n", [(0.7, 3, 20), (0.95, 8, 33),
                                           (0.3, 1, 9)])
def test_rounds_distribution_matches_simulation(alpha, gamma, n):
  rng = np.random.default_rng(0)
  sims = _simulate_rounds(alpha, gamma, n, 4000, rng)
  dist = accounting.rounds_distribution(alpha, gamma, n)
  assert dist.sum() == pytest.approx(1.0)
  # The whole law, not only its mean; and the same check rejects the law of
  # one draft more a round, or one token more a row (its controls).
  assert testing.check_distribution(sims, dist).passed
  for wrong in ((alpha, gamma + 1, n), (alpha, gamma, n + 1)):
    assert not testing.check_distribution(
        sims, accounting.rounds_distribution(*wrong)).passed, wrong
  mean = float(np.arange(n + 1) @ dist)
  assert abs(sims.mean() - mean) < 5 * sims.std() / math.sqrt(sims.size)
  # Batches wait for their slowest row: E[max of 4 rows], whose law is
  # F^4 (F the rows' cdf); the law of the slowest of 8 is rejected.
  maxes = sims[:4000 // 4 * 4].reshape(-1, 4).max(axis=1)
  expected = accounting.expected_rounds(alpha, gamma, n, batch_size=4)
  assert expected > mean
  assert abs(maxes.mean() - expected) < 5 * maxes.std() / math.sqrt(maxes.size)
  slowest = lambda b: np.diff(np.clip(np.cumsum(dist), 0, 1) ** b, prepend=0)
  assert expected == pytest.approx(float(np.arange(n + 1) @ slowest(4)))
  assert testing.check_distribution(maxes, slowest(4)).passed
  assert not testing.check_distribution(maxes, slowest(8)).passed


def test_rounds_distribution_at_long_budgets_keeps_its_mean():
  """Only the band of the law's mass is carried, its tails below 1e-30
  dropped: the mean still equals the renewal recursion E[R(m)] = 1 +
  sum_j P(a round emits j + 1) E[R(m - j - 1)], E[R(m <= 0)] = 0."""
  for alpha, gamma, n in ((0.5, 2, 3000), (0.9, 7, 2000), (0.05, 1, 1500)):
    emit_J = [alpha ** j * (1 - alpha) for j in range(gamma)] + [alpha ** gamma]
    rounds_M = np.zeros(n + 1)
    for m in range(1, n + 1):
      rounds_M[m] = 1 + sum(p * rounds_M[max(m - j - 1, 0)]
                            for j, p in enumerate(emit_J))
    assert accounting.expected_rounds(alpha, gamma, n) == pytest.approx(
        rounds_M[n], rel=1e-12)


def test_rounds_distribution_past_the_budget_is_gammas_own():
  """Drafts beyond the budget cannot be emitted: gamma >= n - 1 all give
  the same law, an absurd gamma too (it once sized a list of gamma
  entries)."""
  want = accounting.rounds_distribution(0.8, 6, 6)
  for gamma in (5, 7, 40, 2 ** 62):
    np.testing.assert_allclose(accounting.rounds_distribution(0.8, gamma, 6),
                               want, rtol=1e-12)
  # A row finishes in one round when it keeps n - 1 = 5 drafts, which
  # gamma = 4 cannot.
  assert want[1] == pytest.approx(0.8 ** 5)
  assert accounting.rounds_distribution(0.8, 4, 6)[1] == 0.0


def test_truncation_lowers_tokens_per_call_and_vanishes_for_long_runs():
  full = float(accounting.expected_tokens_per_pass(0.9, 4))
  short = accounting.expected_tokens_per_call(0.9, 4, 12)
  long = accounting.expected_tokens_per_call(0.9, 4, 4096)
  assert short < long < full + 1e-12
  assert long == pytest.approx(full, rel=2e-3)
  # Closed forms at the edges: always accept, never accept.
  assert accounting.expected_rounds(1.0, 4, 12) == 3.0  # ceil(12 / 5)
  assert accounting.expected_rounds(0.0, 4, 12) == 12.0
  assert stats.expected_tokens_per_target_call(1.0, 4, [12, 5]) == 17 / 4
  assert stats.expected_tokens_per_target_call(
      1.0, 4, (n for n in (12, 5))) == 17 / 4
  for bad in (10, "abc"):
    with pytest.raises(TypeError, match="row_tokens must be the rows'"):
      stats.expected_tokens_per_target_call(1.0, 4, bad)


def test_loop_speedup_reduces_to_walltime_improvement():
  for alpha, gamma, c, r in ((0.8, 4, 0.05, 1.2), (0.5, 2, 0.2, 1.0)):
    paper = float(accounting.walltime_improvement(alpha, gamma, c, r))
    ours = accounting.loop_speedup(alpha, gamma, 4000, c, r)
    assert ours == pytest.approx(paper, rel=2e-3)
  # The catch-up window and the overhead each cost what they say.
  base = accounting.loop_speedup(0.8, 4, 64, 0.1, 1.0)
  slower = accounting.loop_speedup(0.8, 4, 64, 0.1, 1.0, c_window=0.2,
                                   overhead=0.3)
  assert base / slower == pytest.approx((0.2 + 3 * 0.1 + 1.0 + 0.3)
                                        / (0.1 + 3 * 0.1 + 1.0))
  # A bigger batch waits for slower rows: never faster.
  assert accounting.loop_speedup(0.8, 4, 64, 0.1, 1.0, batch_size=8) < base
  # A free verify pass was priced (16.5x here) where walltime_improvement
  # and batch_speedups refuse it.
  with pytest.raises(ValueError, match="r must be > 0"):
    accounting.loop_speedup(0.8, 4, 100, 0.05, 0)


def test_crossover_batch():
  assert accounting.crossover_batch([1, 2, 4, 8], [2.0, 1.5, 1.1, 0.9]) == (
      pytest.approx(4 * 2 ** 0.5))
  assert accounting.crossover_batch([1, 2], [1.2, 1.1]) is None
  assert accounting.crossover_batch([1, 2], [0.9, 0.8]) == 1.0
  with pytest.raises(ValueError, match="increasing"):
    accounting.crossover_batch([2, 1], [1.0, 1.0])
  # NaN compares False both ways: it would pass the order check, or
  # interpolate to NaN, or be skipped over; inf interpolates to inf or NaN.
  for speedups in ([2, np.nan, 0.5], [np.nan, 2, 0.5], [2, np.inf, 0.5]):
    with pytest.raises(ValueError, match="speedups must be finite"):
      accounting.crossover_batch([1, 2, 4], speedups)
  for sizes in ([1, np.nan, 4], [1, 2, np.inf]):
    with pytest.raises(ValueError, match="batch_sizes must be finite"):
      accounting.crossover_batch(sizes, [2, 2, 0.5])
  # float64 coercion read "4" as 4.0 and True as 1.0.
  with pytest.raises(TypeError, match="batch_sizes must be a real number"):
    accounting.crossover_batch(["1", "2"], [2.0, 0.5])
  with pytest.raises(TypeError, match="speedups must hold numbers, not bools"):
    accounting.crossover_batch([1, 2], [True, False])
  # Accepted before: speedups are ratios of times, batch sizes counts.
  with pytest.raises(ValueError, match="speedups must be > 0"):
    accounting.crossover_batch([1, 2], [1.5, -0.5])
  with pytest.raises(ValueError, match="increasing integers"):
    accounting.crossover_batch([1, 2.5], [1.5, 0.5])


def test_loop_accounting_refuses_bad_inputs_by_name():
  # 0 tokens take 0 rounds: no ratio (a bare ZeroDivisionError, or NaN).
  with pytest.raises(ValueError, match="num_tokens"):
    accounting.loop_speedup(0.5, 4, 0, 0.1, 1.0)
  with pytest.raises(ValueError, match="num_tokens"):
    accounting.expected_tokens_per_call(0.5, 4, 0)
  # Scalar-only functions name the array argument.
  with pytest.raises(ValueError, match="alpha must be a scalar"):
    accounting.rounds_distribution(np.array([0.5, 0.6]), 4, 3)
  with pytest.raises(ValueError, match="gamma must be a scalar"):
    accounting.rounds_distribution(0.5, np.array([1, 2]), 3)
  with pytest.raises(ValueError, match="c must be a scalar"):
    accounting.loop_speedup(0.5, 4, 8, np.array([0.1, 0.2]), 1.0)


def test_batch_speedups():
  out = accounting.batch_speedups(0.8, 4, 100, [1, 2, 4], [0.1, 0.2, 0.3],
                                  [1.0, 1.2, 1.5], overhead_B=0.05)
  assert out.shape == (3,)
  for i, (b, c, r) in enumerate(((1, 0.1, 1.0), (2, 0.2, 1.2), (4, 0.3, 1.5))):
    assert out[i] == accounting.loop_speedup(0.8, 4, 100, c, r, overhead=0.05,
                                             batch_size=b)
  # r_B = None was read as a free verify pass; 2.7 as a batch of 2; lists of
  # different lengths failed with numpy's broadcast message.
  with pytest.raises(TypeError, match="r_B is required"):
    accounting.batch_speedups(0.8, 4, 100, [1, 2], 0.1, None)
  with pytest.raises(ValueError, match="r_B must be > 0"):
    accounting.batch_speedups(0.8, 4, 100, [1, 2], 0.1, [1.0, 0.0])
  with pytest.raises(ValueError, match="r_B must be finite"):
    accounting.batch_speedups(0.8, 4, 100, [1, 2], 0.1, [1.0, np.nan])
  with pytest.raises(ValueError, match="batch_sizes must be integers"):
    accounting.batch_speedups(0.8, 4, 100, [2.7], 0.1, 1.0)
  with pytest.raises(ValueError, match="batch_sizes must be integers >= 1"):
    accounting.batch_speedups(0.8, 4, 100, [0, 2], 0.1, 1.0)
  with pytest.raises(ValueError, match="c_B has shape"):
    accounting.batch_speedups(0.8, 4, 100, [1, 2, 4], [0.1, 0.2], 1.0)
  # A grid of batch sizes was flattened and paired with c_B row-major.
  with pytest.raises(ValueError, match="batch_sizes must be a 1-D"):
    accounting.batch_speedups(0.8, 4, 100, [[1, 2], [4, 8]], 0.1, 1.0)
  with pytest.raises(ValueError, match="overhead_B has shape"):
    accounting.batch_speedups(0.8, 4, 100, [1, 2], 0.1, 1.0,
                              overhead_B=[0.1, 0.1, 0.1])


def test_pooled_estimators():
  a, se = stats.pooled_alpha(30, 40)
  assert a == 0.75 and se == pytest.approx(math.sqrt(0.75 * 0.25 / 40))
  assert all(math.isnan(x) for x in stats.pooled_alpha(0, 0))
  # Rounds that kept 0 and 2 drafts: emitted 1 and 3, se = sd / sqrt(2).
  assert stats.tokens_per_round_se([1, 0, 1]) == pytest.approx(
      np.std([1, 3], ddof=1) / math.sqrt(2))
  assert stats.tokens_per_round_se(np.array([1, 0, 1], np.int32)) == (
      stats.tokens_per_round_se([1, 0, 1]))
  assert stats.pooled_alpha(np.int64(30), np.array(40)) == (
      stats.pooled_alpha(30, 40))


def test_clustered_alpha_counts_rows_not_drafts():
  # Two rows of 10 drafts, one accepting all, one none: the binomial se
  # reads 20 independent trials (.112); over two rows it is .5.
  a, se = stats.clustered_alpha([10, 0], [10, 10])
  assert a == 0.5 and se == pytest.approx(0.5)
  assert stats.pooled_alpha(10, 20)[1] == pytest.approx(0.1118, abs=1e-4)
  # By hand: R / (R - 1) * sum (a_r - alpha v_r)^2, over sum v.
  acc, ver = np.array([3, 5, 9]), np.array([4, 8, 10])
  alpha = acc.sum() / ver.sum()
  want = np.sqrt(1.5 * np.sum((acc - alpha * ver) ** 2)) / ver.sum()
  assert stats.clustered_alpha(acc, ver) == (alpha, pytest.approx(want))
  # One unit: no spread to estimate from; nothing verified: no alpha.
  a, se = stats.clustered_alpha([3], [4])
  assert a == 0.75 and math.isnan(se)
  assert all(math.isnan(x) for x in stats.clustered_alpha([0, 0], [0, 0]))
  # Units that verified nothing are not units of alpha: one informative row
  # beside empty ones read a zero se (its residual is 0 by construction).
  a, se = stats.clustered_alpha([4, 0, 0], [6, 0, 0])
  assert a == pytest.approx(4 / 6) and math.isnan(se)
  assert stats.clustered_alpha([3, 5, 9, 0], [4, 8, 10, 0]) == (
      alpha, pytest.approx(want))
  with pytest.raises(ValueError, match="one length"):
    stats.clustered_alpha([1, 2], [3])
  with pytest.raises(ValueError, match="unit by unit"):
    stats.clustered_alpha([5, 1], [4, 9])
  with pytest.raises(TypeError, match="integer counts"):
    stats.clustered_alpha([0.5, 1], [1, 1])


def test_summary_alpha_se_is_over_rows():
  """Rows that disagree widen alpha_se past the binomial's: at T = 0 a
  row's drafts follow one fixed text and are far from independent."""
  result = _result([[1] * 10, [0] * 10], gamma=1, lengths=[20, 10])
  s = stats.summarize(result)
  assert s["row_accepted"] == [10, 0] and s["row_verified"] == [10, 10]
  assert s["alpha_hat"] == 0.5 and s["alpha_se"] == pytest.approx(0.5)


def test_bad_counts_and_rates_are_refused_by_name():
  # Each of these used to come back as a plausible number.
  with pytest.raises(ValueError, match="accepted .* must be <= verified"):
    stats.pooled_alpha(5, 3)
  with pytest.raises(ValueError, match="accepted must be >= 0"):
    stats.pooled_alpha(-1, 3)
  with pytest.raises(ValueError, match="verified must be >= 0"):
    stats.pooled_alpha(0, -3)
  with pytest.raises(TypeError, match="accepted"):
    stats.pooled_alpha(2.7, 3)
  with pytest.raises(ValueError, match="accept_hist must hold counts >= 0"):
    stats.tokens_per_round_se([5, -1, 3])
  with pytest.raises(TypeError, match="accept_hist must hold integer"):
    stats.tokens_per_round_se(np.array([5.5, 1.0]))
  with pytest.raises(ValueError, match="accept_hist must be 1-D"):
    stats.tokens_per_round_se(np.ones((2, 2), np.int64))
  for alpha in (1.5, -1.0, math.inf):
    with pytest.raises(ValueError, match="alpha must be in"):
      stats.expected_tokens_per_target_call(alpha, 4, [10])
  with pytest.raises(TypeError, match="alpha"):
    stats.expected_tokens_per_target_call("0.5", 4, [10])
  with pytest.raises(TypeError, match="row_tokens must hold integer"):
    stats.expected_tokens_per_target_call(0.5, 4, [2.7])
  with pytest.raises(ValueError, match="row_tokens must hold counts >= 0"):
    stats.expected_tokens_per_target_call(0.5, 4, np.array([10, -10]))
  with pytest.raises(ValueError, match="gamma"):
    stats.expected_tokens_per_target_call(0.5, -1, [10])
  # NaN is "not measured" (no verified drafts), as summarize passes it.
  assert math.isnan(stats.expected_tokens_per_target_call(math.nan, 4, [10]))
  assert stats.expected_tokens_per_target_call(math.nan, 0, [10]) == 1.0
  assert stats.expected_tokens_per_target_call(
      1.0, 4, np.array([12, 5], np.int32)) == 17 / 4
  assert stats.expected_tokens_per_target_call(
      1.0, 4, (n for n in (12, 5))) == 17 / 4


# ------------------------------------- accepted drafts in budget-cut rounds

@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    "block", pytest.param("token", marks=pytest.mark.full),
    pytest.param("tree:2,1", marks=pytest.mark.full),
    pytest.param("tree-wor:2,1", marks=pytest.mark.full)])
def test_rounds_cut_by_the_budget_count_what_the_verifier_kept(spec):
  """`accepted` and `accept_hist` count every draft the verifier kept, also
  in a round the budget cuts (max_new_tokens = 3 cuts most rounds of gamma
  2): the same count under every verifier, with the full round's law.

  Context-free laws (Sun et al.'s example, p = (1/3, 2/3), q = (2/3, 1/3))
  make each round's decision independent of the rounds before it, so the
  kept count of the rounds pooled over 10^5 rows follows the exact
  full-round law (token: mean 10/9, block: 11/9); a count trimmed to the
  tokens the budget let through does not."""
  import specjax as sj  # pylint: disable=g-import-not-at-top
  from specjax.lab import models as lab_models  # pylint: disable=g-import-not-at-top
  from specjax.lab import trees as lab_trees  # pylint: disable=g-import-not-at-top
  from specjax.lab import verifiers as lv  # pylint: disable=g-import-not-at-top
  pair, gamma = lv.paper_example()
  target, draft = lab_models.markov_lms(pair)
  rows = 100_000
  verifier = sj.get_verifier(spec)
  if isinstance(verifier, sj.TreeVerifier):
    blocks, _ = lab_trees.tree_round_law(pair, verifier.topology,
                                         verifier.mode)
    gamma = None
  else:
    blocks, _ = lv.round_law(pair, gamma, spec)
  # P(the round keeps k drafts) = P(it emits k + 1 tokens), any context.
  law_K = np.array([b[0].sum() for b in blocks])
  out = sj.speculative_generate(
      target, draft, np.zeros((rows, 1), np.int32), np.ones(rows, np.int32),
      jax.random.key(0), gamma=gamma, verifier=spec, max_new_tokens=3)
  hist_K = np.asarray(out.stats.accept_hist).sum(0)
  result = testing.check_counts(hist_K, law_K)
  assert result.passed, f"{spec}: {result}"
  s = out.summary()
  k_K = np.arange(len(law_K))
  assert s["accepted"] == hist_K @ k_K
  mean = law_K @ k_K
  se = math.sqrt(law_K @ k_K ** 2 - mean ** 2) / math.sqrt(s["rounds"])
  assert abs(s["accepted"] / s["rounds"] - mean) < 5 * se, (s, mean)
  # The negative control: the drafts a round emitted (generated tokens less
  # one per round), which the budget trims, miss the full round's mean.
  emitted = (s["generated_tokens"] - s["rounds"]) / s["rounds"]
  assert mean - emitted > 10 * se, (emitted, mean)


def test_paired_ratio_gain_and_its_interval():
  rng = np.random.default_rng(0)
  calls = rng.integers(5, 10, 400)
  tokens_b = calls * 2 + rng.integers(0, 3, 400)
  gain, low, high = stats.paired_ratio_gain(tokens_b * 11, calls,
                                            tokens_b * 10, calls)
  np.testing.assert_allclose([gain, low, high], 0.1, atol=1e-9)
  # Noise that pairs cancel only in part: an interval around the gain.
  noisy = tokens_b + rng.integers(-2, 3, 400)
  gain, low, high = stats.paired_ratio_gain(noisy, calls, tokens_b, calls)
  assert low < gain < high and high - low < 0.05
  with pytest.raises(ValueError, match="one equal length"):
    stats.paired_ratio_gain([1, 2], [1, 2], [1], [1])
