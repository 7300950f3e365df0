"""specjax.harness.measure: the loop's cost model, its prediction and its check.

Structure and consistency only (tiny models, synthetic costs): no test
asserts how fast anything runs.
"""

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import accounting
from specjax.decode import loop
from specjax.harness import measure


def _costs(**overrides):
  base = dict(batch_size=1, prompt_len=20, max_new_tokens=64, gamma=4,
              draft_window_s=2e-4, draft_step_s=1e-4, verify_s=1.5e-3,
              other_s=3e-4, target_prefill_s=4e-3, draft_prefill_s=5e-4,
              call_s=2e-4, ar_step_s=1e-3, ar_other_s=1e-4,
              ar_prefill_s=3.9e-3, ar_call_s=1.5e-4)
  return measure.LoopCosts(**{**base, **overrides})


@pytest.fixture(scope="module")
def tiny():
  config = sj.TransformerConfig(vocab_size=40, d_model=32, num_layers=1,
                                num_heads=2, max_positions=96)
  return (sj.TransformerLM.create(config, 0),
          sj.TransformerLM.create(dataclasses.replace(config, d_model=16), 1))


def test_round_and_prediction_on_synthetic_costs():
  c = _costs()
  assert c.draft_s == pytest.approx(2e-4 + 3 * 1e-4)
  assert c.round_s == pytest.approx(c.draft_s + 1.5e-3 + 3e-4)
  assert c.c == pytest.approx(0.1) and c.r == pytest.approx(1.5)
  p = measure.predict(c, 0.8)
  rounds = accounting.expected_rounds(0.8, 4, 64)
  assert p["loop_rounds"] == pytest.approx(rounds)
  assert p["decode_speedup"] == pytest.approx(
      p["tokens_per_round"] * c.ar_round_s / c.round_s)
  assert p["speedup"] == pytest.approx(
      (1.5e-4 + 3.9e-3 + 64 * 1.1e-3)
      / (2e-4 + 4e-3 + 5e-4 + rounds * c.round_s))
  # In units of the AR step the same number is accounting.loop_speedup's.
  unit = c.ar_round_s
  assert p["decode_speedup"] == pytest.approx(accounting.loop_speedup(
      0.8, 4, 64, c.draft_step_s / unit, c.verify_s / unit,
      c_window=c.draft_window_s / unit, overhead=c.other_s / unit))
  # A batch waits for its slowest row.
  assert measure.predict(_costs(batch_size=8), 0.8)["loop_rounds"] > rounds


def test_passes_timed_at_zero_give_nan_not_an_error():
  # A tiny model on a busy machine can time its n and 2n loops equal.
  c = _costs(ar_step_s=0.0, ar_other_s=0.0)
  assert measure.predict(c, 0.8)["decode_speedup"] == 0.0
  assert math.isnan(measure.predict(_costs(verify_s=0.0, other_s=0.0,
                                           draft_window_s=0.0,
                                           draft_step_s=0.0),
                                    0.8)["decode_speedup"])
  d = measure.decompose(c, 0.8, round_s=c.round_s, ar_round_s=1e-3,
                        loop_rounds=20.0, null_draft_round_s=2e-3)
  assert math.isnan(d["decode_efficiency"])
  assert math.isnan(d["factors"]["baseline"])


def test_decompose_names_the_component_that_is_off():
  c = _costs()
  p = measure.predict(c, 0.8)
  exact = dict(round_s=c.round_s, ar_round_s=c.ar_round_s,
               loop_rounds=p["loop_rounds"],
               null_draft_round_s=c.verify_s + c.other_s)
  d = measure.decompose(c, 0.8, **exact)
  assert d["decode_efficiency"] == pytest.approx(1.0) and d["off"] == ""
  cases = {
      "draft": dict(round_s=c.round_s + c.draft_s),
      "verify": dict(round_s=c.round_s + 0.4 * c.verify_s,
                     null_draft_round_s=1.4 * c.verify_s + c.other_s),
      "acceptance": dict(loop_rounds=1.3 * p["loop_rounds"]),
      "baseline": dict(ar_round_s=0.8 * c.ar_round_s),
  }
  for component, change in cases.items():
    d = measure.decompose(c, 0.8, **{**exact, **change})
    assert d["off"] == component, (component, d["factors"])
    assert d["decode_efficiency"] < 0.9
    assert np.prod(list(d["factors"].values())) == pytest.approx(
        d["decode_efficiency"])
  # Without the null-draft loop the round is one component.
  d = measure.decompose(c, 0.8, **{**exact, "null_draft_round_s": None,
                                   "round_s": 1.3 * c.round_s})
  assert d["off"] == "round" and math.isnan(d["measured_draft_s"])


def test_loop_shape_mirrors_the_loop(tiny):
  target, _ = tiny
  shape = measure.LoopShape(batch_size=2, prompt_len=20, max_new_tokens=40,
                            gamma=3)
  assert shape.width == loop.prompt_bucket(20) == 32
  # 32 + 40 + 3 + 1 = 76 positions, rounded up to a multiple of 16: every
  # gamma up to 7 shares the cache shape, and with it each timed pass.
  assert loop.CACHE_BLOCK == 16
  assert shape.buffer_len == 80
  assert {measure.LoopShape(2, 20, 40, g).buffer_len for g in range(1, 8)
          } == {80}
  assert measure.LoopShape(2, 20, 40, 8).buffer_len == 96
  assert shape.capacity(target) == 80
  assert shape.capacity(sj.NGramLM.uniform(40)) == 80  # no limit
  big = measure.LoopShape(1, 20, 60, 8)
  assert big.capacity(target) == target.max_positions
  assert big.fill(target, 9) + 9 <= target.max_positions
  # The prefill the loop builds has exactly this capacity.
  prompts = jnp.zeros((2, 32), jnp.int32)
  cache, _ = loop._prefill(target, prompts, shape.buffer_len,
                           jnp.array([20, 20]))
  assert cache.max_len == shape.capacity(target)
  with pytest.raises(ValueError, match="gamma"):
    measure.LoopShape(1, 20, 40, -1)


def test_model_key_is_shapes_not_identity(tiny):
  target, draft = tiny
  same_shapes = sj.TransformerLM.create(target.config, 7)
  assert measure.model_key(same_shapes) == measure.model_key(target)
  assert measure.model_key(draft) != measure.model_key(target)
  bigram = sj.NGramLM.uniform(40)
  assert measure.model_key(bigram) != measure.model_key(target)


def test_pass_memo_is_keyed_by_everything_that_sets_the_cost(tiny):
  target, draft = tiny
  memo = {}
  kw = dict(batch_size=1, seconds=1e-3, repeats=1, memo=memo)
  t = measure.pass_seconds(target, num_tokens=2, capacity=40, fill=10, **kw)
  assert t >= 0 and len(memo) == 1
  # A same-shaped model reuses the timing; capacity, tokens or model do not.
  twin = sj.TransformerLM.create(target.config, 3)
  assert measure.pass_seconds(twin, num_tokens=2, capacity=40, fill=10,
                              **kw) == t
  assert len(memo) == 1
  measure.pass_seconds(target, num_tokens=2, capacity=48, fill=10, **kw)
  measure.pass_seconds(target, num_tokens=3, capacity=40, fill=10, **kw)
  measure.pass_seconds(draft, num_tokens=2, capacity=40, fill=10, **kw)
  assert len(memo) == 4
  with pytest.raises(ValueError, match="capacity"):
    measure.pass_seconds(target, num_tokens=5, capacity=8, fill=4, **kw)
  # A memo hit does not hide a bad timing argument.
  with pytest.raises(ValueError, match="repeats"):
    measure.pass_seconds(target, num_tokens=2, capacity=40, fill=10,
                         **{**kw, "repeats": 0})


def test_a_grids_gammas_share_every_pass_but_the_verify(tiny, monkeypatch):
  """A 16-position prompt bucket and 40 new tokens need 58-64 positions at
  gammas 1-7, one capacity once rounded up to loop.CACHE_BLOCK: over that
  grid the cost model times each prefill and draft pass once, and one
  verify pass per gamma (before the rounding: every pass per gamma)."""
  target, draft = tiny
  monkeypatch.setattr(measure, "passes_seconds",
                      lambda model, *, passes, **kw: [1e-4] * len(passes))
  monkeypatch.setattr(measure, "null_loop_seconds",
                      lambda *a, **kw: (1e-5, 1e-4))
  memo = {}
  for gamma in range(1, 8):
    measure.loop_costs(target, draft, batch_size=1, prompt_len=8,
                       max_new_tokens=40, gamma=gamma, seconds=1e-3,
                       repeats=1, memo=memo)
  passes = [k for k in memo if k[0] == "pass"]
  assert {k[4] for k in passes} == {64}  # capacity
  tokens = lambda model: sorted(k[3] for k in passes
                                if k[1] == measure.model_key(model))
  assert tokens(target) == [1, 2, 3, 4, 5, 6, 7, 8, 16]  # + the prefill
  assert tokens(draft) == [1, 2, 16]  # step, window, prefill
  assert len(passes) == 12


def test_passes_are_timed_together_and_checked(tiny, monkeypatch):
  target, _ = tiny
  kw = dict(batch_size=1, capacity=40, seconds=1e-3, repeats=1)
  times = measure.passes_seconds(target, passes=((1, 10), (4, 10)), **kw)
  assert len(times) == 2 and all(t >= 0 for t in times)
  # The bad second pass is refused before the first is timed.
  timed = []
  monkeypatch.setattr(measure, "forward_loops",
                      lambda *a: timed.append(a) or (1, None, None))
  with pytest.raises(ValueError, match="capacity"):
    measure.passes_seconds(target, passes=((1, 10), (5, 36)), **kw)
  assert not timed
  with pytest.raises(ValueError, match="at least one"):
    measure.passes_seconds(target, passes=(), **kw)


@pytest.mark.full
def test_loop_round_steps_times_each_width_against_generate(tiny):
  target, draft = tiny
  shape = measure.LoopShape(2, 6, 12, 3)
  steps = measure.loop_round_steps(target, draft, shape, sj.GREEDY,
                                   widths=(1, 3), calls=1, repeats=1)
  assert len(steps) == 2 and all(math.isfinite(x) and x > 0 for x in steps)
  own = np.arange(12, dtype=np.int32).reshape(2, 6) % 40
  again = measure.loop_round_steps(target, draft, shape, sj.GREEDY,
                                   widths=(3,), calls=1, repeats=1,
                                   prompts_BxP=own)
  assert len(again) == 1 and again[0] > 0
  with pytest.raises(ValueError, match="widths"):
    measure.loop_round_steps(target, draft, shape, sj.GREEDY, widths=(0,))
  with pytest.raises(ValueError, match="prompts_BxP"):
    measure.loop_round_steps(target, draft, shape, sj.GREEDY, widths=(1,),
                             prompts_BxP=own[:1])


@pytest.mark.full
def test_loop_round_steps_prices_a_rule_on_its_own_loop(tiny):
  """With `rule`, every width runs on the rule's one compiled loop
  (`draft_length.pinned`), which the rule's own call then reuses."""
  target, draft = tiny
  shape = measure.LoopShape(2, 6, 12, 3)
  rule = sj.Goodput(c=0.1, r=(1.0, 1.1, 1.2), probe=1.0)
  before = loop._generate._cache_size()
  steps = measure.loop_round_steps(target, draft, shape, sj.GREEDY,
                                   widths=(1, 3), calls=1, repeats=1,
                                   rule=rule)
  assert len(steps) == 2 and all(math.isfinite(x) and x > 0 for x in steps)
  compiled = loop._generate._cache_size()
  assert compiled - before <= 2  # the rule's loop (and `generate`'s)
  prompts = np.arange(12, dtype=np.int32).reshape(2, 6) % 40
  sj.speculative_generate(target, draft, prompts, np.full((2,), 6, np.int32),
                          jax.random.key(1), gamma=rule, max_new_tokens=12,
                          sampling=sj.GREEDY)
  assert loop._generate._cache_size() == compiled
  with pytest.raises(TypeError, match="Goodput"):
    measure.loop_round_steps(target, draft, shape, sj.GREEDY, widths=(1,),
                             rule=sj.Confidence(0.5, 3))
  with pytest.raises(ValueError, match="width"):
    measure.loop_round_steps(target, draft, shape, sj.GREEDY, widths=(4,),
                             rule=rule)


@pytest.mark.full
def test_null_model_accepts_its_twin_and_rejects_its_negation():
  null = measure.NullLM.like(sj.NGramLM.uniform(40))
  prompts, lengths = np.zeros((2, 8), np.int32), np.array([8, 5], np.int32)
  out = sj.speculative_generate(null, null, prompts, lengths,
                                jax.random.key(0), gamma=3, max_new_tokens=10,
                                sampling=sj.SamplingConfig(temperature=1.0))
  s = out.summary()
  assert s["alpha_hat"] == 1.0 and s["loop_rounds"] == math.ceil(10 / 4)
  neg = null.replace(table=-null.table)
  s = sj.speculative_generate(null, neg, prompts, lengths, jax.random.key(0),
                              gamma=3, max_new_tokens=10,
                              sampling=sj.GREEDY).summary()
  assert s["alpha_hat"] == 0.0 and s["loop_rounds"] == 10


def test_compare_on_synthetic_results():
  """compare() pools the runs' statistics and checks its own arithmetic."""
  c = _costs(max_new_tokens=8, gamma=2)

  def result(kept):  # one row, rounds keeping `kept` drafts each
    hist = np.bincount(kept, minlength=3)[None]
    n = len(kept)
    stats = sj.RowStats.zeros(1, 2).replace(
        rounds=jnp.array([n]), target_calls=jnp.array([n]),
        draft_calls=jnp.array([2 * n]),
        verified=jnp.array([sum(min(k + 1, 2) for k in kept)]),
        accepted=jnp.array([sum(kept)]),
        overlap_sum=jnp.array([0.7 * n], jnp.float32),
        accept_hist=jnp.asarray(hist), length_hist=jnp.array([[0, 0, n]]))
    return types.SimpleNamespace(stats=stats, lengths=jnp.array([8]))

  ar = [types.SimpleNamespace(stats=sj.RowStats.zeros(1, 0).replace(
      rounds=jnp.array([8]), accept_hist=jnp.array([[8]]),
      length_hist=jnp.array([[8]])),
                              lengths=jnp.array([8]))] * 3
  spec = [result([2, 2, 1]), result([2, 0, 2, 1]), result([1, 2, 2])]
  row = measure.compare(c, ar, [0.012, 0.013, 0.0125], spec,
                        [0.009, 0.011, 0.010], null_draft_round_s=1.9e-3)
  assert row["alpha_hat"] == pytest.approx(15 / 19)
  assert row["measured_loop_rounds"] == pytest.approx(10 / 3)
  assert row["efficiency"] == pytest.approx(row["speedup"]
                                            / row["predicted_speedup"])
  factors = [v for k, v in row.items() if k.startswith("factor_")]
  assert np.prod(factors) == pytest.approx(row["decode_efficiency"])
  assert row["speedup_se"] > 0 and row["decode_speedup_se"] > 0
  # The se is the reported median's (bootstrapped over prompts), not the
  # standard error of the mean of the same ratios, which it used to be.
  times = [0.010] * 4 + [0.050]
  row5 = measure.compare(c, ar[:1] * 5, [0.0125] * 5, spec[:1] * 5, times)
  ratios = (0.0125 / 8) / (np.array(times) / 8)
  mean_se = np.std(ratios, ddof=1) / np.sqrt(5)
  draws = np.random.default_rng(0).integers(0, 5, (
      measure.BOOTSTRAP_DRAWS, 5))
  assert row5["speedup"] == 1.25
  assert row5["speedup_se"] == pytest.approx(
      np.std([np.median(ratios[i]) for i in draws], ddof=1))
  assert row5["speedup_se"] != pytest.approx(mean_se, rel=0.05)
  assert row["predicted_tokens_per_target_call"] < row[
      "formula_tokens_per_target_call"]
  # Call times that do not match the results were broadcast over them, or
  # gave NaN or negative speedups with a warning.
  for bad in ([0.009], [0.009, 0.011, -0.01], [0.009, np.nan, 0.01], []):
    with pytest.raises(ValueError, match="spec_seconds must be"):
      measure.compare(c, ar, [0.012, 0.013, 0.0125], spec, bad)
  # Costs of another gamma than the loop's price another loop.
  with pytest.raises(ValueError, match="results come from a loop of gamma = 2"
                     ", but costs price gamma = 3"):
    measure.compare(_costs(max_new_tokens=8, gamma=3), ar,
                    [0.012, 0.013, 0.0125], spec, [0.009, 0.011, 0.010])
  # A rule's rounds that drafted fewer than gamma: no fixed-gamma prediction,
  # the measured numbers stay.
  ragged = [types.SimpleNamespace(stats=r.stats.replace(
      length_hist=jnp.array([[0, 1, r.stats.rounds[0] - 1]])),
                                  lengths=r.lengths) for r in spec]
  rule_row = measure.compare(c, ar, [0.012, 0.013, 0.0125], ragged,
                             [0.009, 0.011, 0.010], null_draft_round_s=1.9e-3)
  blank = [k for k, v in rule_row.items() if v is None]
  assert "predicted_speedup" in blank and "factor_acceptance" in blank
  assert all(k.startswith(measure.FIXED_GAMMA_FIELDS) for k in blank
             if row[k] is not None)
  assert rule_row["speedup"] == row["speedup"]
  assert rule_row["formula_tokens_per_target_call"] < row[
      "formula_tokens_per_target_call"]
  # A row stopped by EOS ran fewer autoregressive steps than the decode
  # split counts (with EOS at the first token it read 4.0 for a true 0.5).
  eos = types.SimpleNamespace(stats=ar[0].stats, lengths=jnp.array([1]))
  with pytest.raises(ValueError, match=r"ar_results\[1\] row 0 generated 1 "
                     "tokens, not costs.max_new_tokens = 8"):
    measure.compare(c, [ar[0], eos, ar[0]], [0.012, 0.013, 0.0125], spec,
                    [0.009, 0.011, 0.010])


def test_costs_and_measurements_are_checked_before_any_work(tiny):
  """Each of these was a ZeroDivisionError, a NaN row, or work that ran
  (compiles, timings) before the bad argument was found."""
  target, draft = tiny
  with pytest.raises(TypeError, match="LoopCosts.verify_s must be a real"):
    _costs(verify_s=None)
  with pytest.raises(ValueError, match="LoopCosts.verify_s must be finite"):
    _costs(verify_s=np.nan)
  with pytest.raises(ValueError, match="LoopCosts.max_new_tokens must be"):
    _costs(max_new_tokens=0)
  with pytest.raises(TypeError, match="costs must be a LoopCosts"):
    measure.predict(dict(gamma=4), 0.5)
  with pytest.raises(ValueError, match="loop_rounds .* must be > 0"):
    measure.decompose(_costs(), 0.5, round_s=1e-3, ar_round_s=1e-3,
                      loop_rounds=0)
  with pytest.raises(ValueError, match="round_s must be finite"):
    measure.decompose(_costs(), 0.5, round_s=np.nan, ar_round_s=1e-3,
                      loop_rounds=5)
  shape = measure.LoopShape(1, 8, 4, 2)
  t1 = sj.SamplingConfig()
  with pytest.raises(ValueError, match="seconds"):
    measure.loop_costs(target, draft, batch_size=1, prompt_len=8,
                       max_new_tokens=4, gamma=2, seconds=-1.0)
  # A pair the loop refuses was priced (audit: c .00013, r 1.48).
  other_vocab = sj.NGramLM.uniform(target.vocab_size // 2)
  with pytest.raises(ValueError, match="vocab"):
    measure.loop_costs(target, other_vocab, batch_size=1, prompt_len=8,
                       max_new_tokens=4, gamma=2)
  with pytest.raises(TypeError, match="draft"):
    measure.loop_costs(target, None, batch_size=1, prompt_len=8,
                       max_new_tokens=4, gamma=2)
  with pytest.raises(ValueError, match="repeats must be >= 1"):
    measure.null_loop_seconds(target, draft, shape, t1, repeats=0)
  # AttributeErrors and "'int' object is not iterable" named nothing.
  with pytest.raises(TypeError, match="model must implement"):
    measure.pass_seconds("x", batch_size=1, num_tokens=1, capacity=8, fill=0)
  with pytest.raises(TypeError, match="shape must be a measure.LoopShape"):
    measure.null_loop_seconds(target, draft, (1, 8, 4, 2), t1)
  with pytest.raises(TypeError, match="widths must be a sequence"):
    measure.loop_round_steps(target, draft, shape, t1, widths=2)
  with pytest.raises(ValueError, match="calls must be >= 1"):
    measure.loop_round_steps(target, draft, shape, t1, widths=(1,), calls=0)
  with pytest.raises(ValueError, match="widths is empty"):
    measure.loop_round_steps(target, draft, shape, t1, widths=())
  with pytest.raises(ValueError, match="prompts_BxP must be"):
    measure.null_draft_round_seconds(
        target, draft, shape, t1, prompts_BxP=np.ones((2, 8), np.int32),
        prompt_lengths_B=np.full(2, 8), key=jax.random.key(0),
        costs=_costs())


def test_held_out_best_picks_each_unit_on_the_others():
  # Unit 2 alone makes setting 1 the fastest in total (4 s against 12 s);
  # left out, units 0 and 1 still pick setting 1, and unit 2 is scored
  # under setting 0, which the others prefer.
  seconds = [[1.0, 2.0], [1.0, 2.0], [10.0, 0.0]]
  picks, total = measure.held_out_best(seconds)
  assert picks.tolist() == [1, 1, 0] and total == 14.0
  # A unit's copies (a bootstrap resample) are all left out of its pick;
  # a unit of weight 0 is absent.
  picks, total = measure.held_out_best(seconds, np.array([2, 0, 1]))
  assert picks.tolist() == [1, -1, 0] and total == 2 * 2.0 + 10.0
  for bad, match in (([[1.0, 2.0]], "P >= 2"), ([1.0, 2.0], r"\[P, G\]"),
                     ([[1.0], [np.nan]], "finite"), ([[1.0], [-1.0]], ">= 0")):
    with pytest.raises(ValueError, match=match):
      measure.held_out_best(bad)
  for weights in ([1, 0, 0], [1.0, 1.0, 1.0], [1, -1, 1], [1, 1]):
    with pytest.raises(ValueError, match="weights_P"):
      measure.held_out_best(seconds, np.array(weights))


def test_held_out_best_has_no_winners_curse():
  # Four settings equally fast in truth (1 s a unit, noise sd .05): the
  # best total picked on the same units is the least of four noisy sums,
  # biased low by about one sd of a sum (.2 s of 16); each held-out pick
  # is made without its unit's noise, so its mean is the truth.
  rng = np.random.default_rng(0)
  sims, units = 2000, 16
  seconds = 1.0 + 0.05 * rng.standard_normal((sims, units, 4))
  naive = seconds.sum(1).min(1)
  held = np.array([measure.held_out_best(s)[1] for s in seconds])
  se = 0.05 * np.sqrt(units) / np.sqrt(sims)  # of a mean of sums
  assert abs(held.mean() - units) < 4 * se
  # The negative control: the same-units best is rejected as biased.
  assert naive.mean() < units - 10 * se


@pytest.mark.full
def test_null_loops_run_on_a_vocabulary_of_two():
  """Their filler prompts cycled through ids 0..6, which the loop refused
  under a smaller vocabulary, so gamma="auto" failed there (audit: V = 4,
  "prompts[1, 1] = 4 is outside the vocabulary [0, 4)")."""
  bigram = sj.NGramLM.uniform(2)
  for draft, gamma in ((bigram, 2), (None, 0)):  # speculative, autoregressive
    shape = measure.LoopShape(batch_size=2, prompt_len=5, max_new_tokens=4,
                              gamma=gamma)
    # Raised "prompts[0, 2] = 2 is outside the vocabulary [0, 2)".
    measure.null_loop_seconds(bigram, draft, shape, sj.SamplingConfig(),
                              repeats=1)
    prompts_BxP, _ = measure._prompts(shape, bigram.vocab_size)
    assert set(np.unique(prompts_BxP)) == {0, 1}


def test_versus_best_fixed_scores_every_decoder_against_the_best_fixed():
  """The ratios, the best fixed pick and the held-out pick are what the
  timings say; the intervals resample whole prompts, so with every prompt
  alike they collapse onto the point estimate."""
  rng = np.random.default_rng(0)
  # baseline, fixed gammas 1 and 2, an adaptive decoder; 6 prompts.
  seconds_PxN = np.array([2.0, 1.0, 0.8, 0.7]) * rng.uniform(
      0.9, 1.1, (6, 4))
  vs = measure.versus_best_fixed(seconds_PxN, [1, 2])
  totals_N = seconds_PxN.sum(0)
  np.testing.assert_allclose(vs["speedup_N"], totals_N[0] / totals_N)
  assert vs["best"] == int(np.argmin(totals_N[[1, 2]]))
  best = [1, 2][vs["best"]]
  np.testing.assert_allclose(vs["vs_best_N"], totals_N[best] / totals_N)
  low_N, high_N = vs["vs_best_95_Nx2"].T
  assert np.all(low_N <= high_N)
  assert low_N[3] <= vs["vs_best_N"][3] <= high_N[3]
  picks_P, held_s = measure.held_out_best(seconds_PxN[:, [1, 2]])
  np.testing.assert_array_equal(vs["held_out_picks_P"], picks_P)
  np.testing.assert_allclose(vs["vs_held_out_N"], held_s / totals_N)
  same = measure.versus_best_fixed(np.tile([2.0, 1.0, 0.8, 0.7], (5, 1)),
                                   [1, 2])
  np.testing.assert_allclose(same["vs_best_95_Nx2"][:, 0],
                             same["vs_best_95_Nx2"][:, 1])
  np.testing.assert_allclose(same["vs_best_N"], [0.4, 0.8, 1.0, 8 / 7])
  # One prompt: no held-out pick to make.
  assert "vs_held_out_N" not in measure.versus_best_fixed(
      seconds_PxN[:1], [1, 2])


@pytest.mark.parametrize("seconds, fixed, match", [
    (np.ones((3, 1)), [1], "N >= 2 decoders"),
    (np.ones((3, 3)), [], "at least one fixed"),
    (np.ones((3, 3)), [0], r"fixed\[i\] must be >= 1"),
    (np.zeros((3, 3)), [1], "finite and > 0"),
])
def test_versus_best_fixed_refuses_bad_input(seconds, fixed, match):
  with pytest.raises(ValueError, match=match):
    measure.versus_best_fixed(seconds, fixed)
