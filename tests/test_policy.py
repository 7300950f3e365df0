"""specjax.harness.policy_sim: the planned loop's rounds, simulated in counts.

Each test asserts a count that a correct simulator gives exactly (or within
a few standard errors) and a plausible bug does not: a round that emits its
kept drafts without the extra token, a batch charged per row instead of
waiting for its slowest row, an oracle that reads the wrong positions, a
numpy plan that drifts from the library's."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import state
from specjax.harness import policy_sim as ps

# Round costs of widths 1..8 in `generate` steps: any increasing, concave
# costs (a round's verify pass grows slower than its tokens).
COSTS_W = (1.4, 1.8, 2.4, 2.7, 3.1, 3.2, 3.5, 3.6)
N = 50


def _rounds(sim, width):
  """int `[R]`: each run's rounds of `width` (STEP -1, PROBE 0, 1..G)."""
  return sim.rounds_RxW[:, width + 1]


@pytest.mark.parametrize("width", [1, 3, 8])
def test_a_perfect_draft_emits_width_plus_one_tokens_a_round(width):
  sim = ps.simulate(ps.Recorded(np.ones((2, N))), COSTS_W, ps.Fixed(width),
                    3, np.random.default_rng(0))
  rounds = math.ceil(N / (width + 1))
  np.testing.assert_array_equal(_rounds(sim, width), rounds)
  np.testing.assert_array_equal(sim.rounds_RxW.sum(1), rounds)
  np.testing.assert_allclose(sim.steps_R, rounds * COSTS_W[width - 1])
  # Every round kept and judged all its drafts but the last, which keeps
  # those left in the text (past its end a draft is never kept) and judges
  # one more, if there is room.
  left = N - (rounds - 1) * (width + 1)
  np.testing.assert_array_equal(sim.accepted_RxB,
                                (rounds - 1) * width + min(left, width))
  np.testing.assert_array_equal(sim.verified_RxB,
                                (rounds - 1) * width + min(left + 1, width))
  np.testing.assert_array_equal(sim.changes_R, 0)


@pytest.mark.parametrize("width", [1, 4])
def test_a_useless_draft_emits_one_token_a_round(width):
  sim = ps.simulate(ps.Recorded(np.zeros((2, N))), COSTS_W, ps.Fixed(width),
                    3, np.random.default_rng(0))
  np.testing.assert_array_equal(_rounds(sim, width), N)
  np.testing.assert_allclose(sim.steps_R, N * COSTS_W[width - 1])
  np.testing.assert_array_equal(sim.accepted_RxB, 0)
  np.testing.assert_array_equal(sim.verified_RxB, N)  # one rejection a round


def test_the_batch_waits_for_its_slowest_row():
  # Row 0 keeps every draft, row 1 none: every round is charged once for
  # the batch, until row 1 is done; row 0 judges nothing after its end.
  a_BxT = np.stack([np.ones(N), np.zeros(N)])
  sim = ps.simulate(ps.Recorded(a_BxT), COSTS_W, ps.Fixed(4), 2,
                    np.random.default_rng(0))
  np.testing.assert_allclose(sim.steps_R, N * COSTS_W[3])
  np.testing.assert_array_equal(sim.verified_RxB[:, 0],
                                math.ceil(N / 5) * 4)
  np.testing.assert_array_equal(sim.verified_RxB[:, 1], N)


@pytest.mark.parametrize("rows", ["recorded", "synthetic"])
def test_tokens_a_round_match_the_closed_form(rows):
  """At acceptance a, a round of width w emits (1 - a^(w+1)) / (1 - a)
  tokens on average, mu. By Wald's identity, the rounds R to emit N tokens
  satisfy mu E[R] = E[tokens emitted, the last round's uncut], in
  [N, N + w]: so N / mu <= E[R] <= (N + w) / mu, up to sampling error.
  Emitting w tokens a full round, or the kept drafts alone, is mu's
  off-by-one, (1 - a^w) / (1 - a): the same check rejects it."""
  a, w, n = 0.7, 4, 2000
  if rows == "recorded":
    sim = ps.simulate(ps.Recorded(np.full((1, n), a)), COSTS_W, ps.Fixed(w),
                      60, np.random.default_rng(1))
  else:
    sim = ps.simulate(ps.Synthetic(a, n), COSTS_W, ps.Fixed(w), 40,
                      np.random.default_rng(1))
  rounds_R = _rounds(sim, w).astype(float)
  se = rounds_R.std(ddof=1) / math.sqrt(rounds_R.size)

  def consistent(mu):
    return (n / mu - 4 * se <= rounds_R.mean() <= (n + w) / mu + 4 * se)

  assert consistent((1 - a ** (w + 1)) / (1 - a))
  assert not consistent((1 - a ** w) / (1 - a))
  assert not consistent(1 / (1 - a))  # unbounded width


def _regime_text():
  """One row: easy (0.97) for its first half, useless (0.05) after."""
  a_BxT = np.full((1, 128), 0.97)
  a_BxT[:, 64:] = 0.05
  return a_BxT


@pytest.mark.parametrize("text", ["constant", "regime", "random"])
def test_the_oracle_is_never_worse_than_the_best_fixed_width(text):
  if text == "constant":
    a_BxT = np.full((1, 128), 0.8)
  elif text == "regime":
    a_BxT = _regime_text()
  else:
    g = np.random.default_rng(3)
    a_BxT = np.clip(g.beta(4, 1.5, (4, 1))
                    + 0.2 * g.standard_normal((4, 128)), 0, 1)
  runs = 300
  sim = lambda policy: ps.simulate(ps.Recorded(a_BxT), COSTS_W, policy, runs,
                                   np.random.default_rng(1))
  fixed = {w: sim(ps.Fixed(w)) for w in range(1, 9)}
  best = max(fixed.values(), key=ps.Simulated.mean_speedup)
  oracle = sim(ps.Oracle())
  gain_R = oracle.tokens / oracle.steps_R - best.tokens / best.steps_R
  assert gain_R.mean() >= -3 * gain_R.std(ddof=1) / math.sqrt(runs)
  if text == "regime":
    # Wide rounds in the easy half, STEPs in the useless one: far ahead of
    # any one width.
    assert oracle.mean_speedup() > 1.3 * best.mean_speedup()
    assert (_rounds(oracle, ps.STEP) >= 40).all()
    assert (_rounds(oracle, 8) >= 4).all()


def test_the_oracle_steps_where_no_width_pays():
  sim = ps.simulate(ps.Recorded(np.zeros((2, N))), COSTS_W, ps.Oracle(), 2,
                    np.random.default_rng(0))
  np.testing.assert_array_equal(_rounds(sim, ps.STEP), N)
  np.testing.assert_allclose(sim.steps_R, N)  # a STEP costs 1
  np.testing.assert_array_equal(sim.verified_RxB, 0)


def test_the_rule_plans_width_1_for_a_useless_draft():
  """Goodput with exact costs and no probe rounds: each round judges one
  draft, the estimate falls from the prior's 3/4, and width 1 is the
  cheapest round."""
  rule = ps.rule_in_steps(COSTS_W)
  sim = ps.simulate(ps.Recorded(np.zeros((1, N))), COSTS_W, ps.Rule(rule), 1,
                    np.random.default_rng(0))
  assert sim.rounds_RxW.sum() == N
  assert _rounds(sim, 1)[0] >= N - 5
  assert sim.steps_R[0] < N * COSTS_W[0] + 5


def test_the_rule_goes_off_for_a_useless_draft():
  """With probe rounds the rule leaves the draft alone: PROBE rounds judge
  one draft each, STEPs none, and it beats every fixed width (each costs
  at least N * COSTS_W[0] here)."""
  rule = ps.rule_in_steps(COSTS_W, probe=1.1)
  sim = ps.simulate(ps.Recorded(np.zeros((2, N))), COSTS_W, ps.Rule(rule), 1,
                    np.random.default_rng(0), probe=1.1)
  assert sim.rounds_RxW.sum() == N
  assert _rounds(sim, ps.STEP)[0] >= N // 2
  off = _rounds(sim, ps.STEP)[0]
  np.testing.assert_array_equal(sim.verified_RxB, N - off)
  assert N < sim.steps_R[0] < N * COSTS_W[0]
  with pytest.raises(ValueError, match="probe="):
    ps.simulate(ps.Recorded(np.zeros((1, N))), COSTS_W, ps.Rule(rule), 1,
                np.random.default_rng(0))


def test_the_rule_climbs_to_the_widest_round_for_a_perfect_draft():
  rule = ps.rule_in_steps(COSTS_W, probe=1.1)
  sim = lambda policy: ps.simulate(ps.Recorded(np.ones((1, 256))), COSTS_W,
                                   policy, 1, np.random.default_rng(0),
                                   probe=1.1)
  auto, widest = sim(ps.Rule(rule)), sim(ps.Fixed(8))
  assert _rounds(auto, 8)[0] >= 0.8 * auto.rounds_RxW.sum()
  assert auto.steps_R[0] <= 1.1 * widest.steps_R[0]


def test_the_numpy_plan_is_goodputs():
  """`Estimate` (float64, numpy) picks the width `Goodput.plan` picks on the
  same counts, over all widths and over gamma="auto"'s."""
  g = np.random.default_rng(0)
  for widths in (None, (1, 2, 4, 8)):
    rule = ps.rule_in_steps(COSTS_W, widths=widths, prompt_prior=0.0)
    for _ in range(40):
      verified_B = g.integers(0, 60, 3)
      overlap_B = verified_B * g.random(3)
      remaining_B = g.integers(0, 128, 3)
      remaining_B[0] = max(remaining_B[0], 1)  # a row still going
      view = ps.View(
          going_R=np.ones(1, bool), active_RxB=remaining_B[None] > 0,
          remaining_RxB=remaining_B[None],
          accepted_RxB=np.zeros((1, 3), int),  # read by neither
          verified_RxB=verified_B[None], overlap_RxB=overlap_B[None],
          ahead=None)
      numpy_plan = ps.Estimate(widths=widths, initial=(
          3.0 + overlap_B, 4.0 + verified_B)).start(1, 3, COSTS_W)
      library_plan = ps.Rule(rule).start(1, 3, COSTS_W)
      assert numpy_plan.choose(view) == library_plan.choose(view)


def test_prompt_counts_are_goodputs_initial_counts():
  g = np.random.default_rng(0)
  overlap_BxK = g.random((4, 16))
  for window in (16, 8, 4):
    kept_B, judged_B = ps.prompt_counts(overlap_BxK, window)
    rule = ps.rule_in_steps(COSTS_W, prompt_prior=float(window))
    stats = state.RowStats.zeros(4, 1).replace(
        prompt_scored=jnp.full((4,), window, jnp.int32),
        prompt_overlap_sum=jnp.asarray(overlap_BxK[:, -window:].sum(1),
                                       jnp.float32))
    a0_B, b0_B = rule.initial_counts(stats)
    np.testing.assert_allclose(kept_B, a0_B, rtol=1e-5)
    np.testing.assert_allclose(judged_B, a0_B + b0_B, rtol=1e-5)


def test_a_change_of_width_is_charged_once_per_change():
  """The same draws (a policy does not read the change cost): the steps
  differ by exactly `change` per counted change; one width changes none."""
  rows = ps.Recorded(_regime_text())
  run = lambda policy, change: ps.simulate(
      rows, COSTS_W, policy, 20, np.random.default_rng(2), change=change)
  free, paid = run(ps.Oracle(), 0.0), run(ps.Oracle(), 0.5)
  np.testing.assert_array_equal(free.changes_R, paid.changes_R)
  assert free.changes_R.sum() >= 10
  np.testing.assert_allclose(paid.steps_R - free.steps_R,
                             0.5 * free.changes_R)
  fixed = run(ps.Fixed(3), 0.5)
  np.testing.assert_array_equal(fixed.changes_R, 0)
  np.testing.assert_allclose(fixed.steps_R, run(ps.Fixed(3), 0.0).steps_R)


def test_synthetic_rows_draw_as_goodput_policy_drew():
  """`Synthetic` rows run one after another draw in the order the
  simulator drew before it moved into the library, so the simulated tables
  in results/adaptive_gamma/README.md reproduce: these steps are what that
  simulator counted on these arguments (probe rounds, STEPs and changes of
  width among them)."""
  rule = ps.rule_in_steps(COSTS_W, probe=1.1)
  rows = ps.Synthetic(0.35, 40, 2, spread=0.1, burst=0.1, overlap_var=0.01)
  sim = ps.simulate(rows, COSTS_W, ps.Rule(rule), 3,
                    np.random.default_rng(0), probe=1.1, change=0.3,
                    lockstep=False)
  np.testing.assert_allclose(sim.steps_R, [44.1, 38.5, 41.4], rtol=1e-12)
  assert _rounds(sim, ps.STEP)[2] > 0 and _rounds(sim, ps.PROBE)[2] > 0


def test_bad_arguments_are_refused():
  rows = ps.Recorded(np.ones((1, 4)))
  with pytest.raises(ValueError, match="width"):
    ps.simulate(rows, COSTS_W, ps.Fixed(9), 1, np.random.default_rng(0))
  with pytest.raises(ValueError, match="costs_W"):
    ps.simulate(rows, (1.0, -1.0), ps.Fixed(1), 1, np.random.default_rng(0))
  with pytest.raises(ValueError, match="keep probabilities"):
    ps.Recorded(np.full((1, 4), 1.5))
  with pytest.raises(ValueError, match="prices only"):
    ps.simulate(rows, COSTS_W[:4], ps.Rule(ps.rule_in_steps(COSTS_W)), 1,
                np.random.default_rng(0))
