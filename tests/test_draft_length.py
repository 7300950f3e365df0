"""Adaptive draft length: exactness (lab enumeration and statistical harness,
each with a negative control), probe rounds, ragged stats, bad input.

Greedy equality under each rule, with its stats: tests/test_greedy.py."""

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax import sampling as sampling_lib
from specjax import testing
from specjax.decode import draft_length
from specjax.decode import loop
from specjax.decode import verifiers
from specjax.harness import autotune
from specjax.lab import stopping
from specjax.models import TransformerConfig, TransformerLM
from specjax.models import vocab

V = 16


# ---- The lab: exact enumeration with a stopping rule.

@pytest.mark.parametrize("threshold", [0.3, 0.5])
def test_lab_confidence_rule_is_exact(threshold):
  pair = lab.make_markov_pair()
  rule = stopping.confidence_rule(pair, threshold)
  # The rule does stop early, so the check has something to check.
  assert stopping.expected_draft_length(pair, 3, rule, pair.bos) < 2.9
  assert stopping.exact_tv(pair, 3, rule, 4) < 1e-12


def test_lab_never_stopping_is_the_fixed_gamma_process():
  pair = lab.make_markov_pair()
  never = lambda i, context, drafts: False
  np.testing.assert_allclose(
      stopping.speculative_distribution(pair, 3, never, 4),
      lab.speculative_distribution(pair, 3, 4), atol=1e-14)


def test_lab_reading_the_next_draft_is_exact_but_two_ahead_is_not():
  pair = lab.make_markov_pair()
  assert stopping.exact_tv(pair, 3, stopping.peeking_rule(pair, 0.3, 1),
                           4) < 1e-12
  # Negative controls: peeking two drafts ahead, and the wrong fallback.
  assert stopping.exact_tv(pair, 3, stopping.peeking_rule(pair, 0.3, 2),
                           4) > 0.05
  assert stopping.exact_tv(pair, 3, stopping.confidence_rule(pair, 0.5), 4,
                           rule="wrong_fallback") > 0.01


def test_lab_probe_rounds_are_exact():
  """A probe round (the Goodput rule's width 0) judges x_1 alone and emits
  the coupled token: exact whichever rounds probe, and the wrong fallback
  (the negative control) is caught in rounds that all probe."""
  pair = lab.make_markov_pair()
  never = lambda i, context, drafts: False
  confidence = stopping.confidence_rule(pair, 0.5)
  for stop, probe in ((never, lambda c: c % 2 == 0), (never, lambda c: True),
                      (confidence, lambda c: c % 3 == 0)):
    assert stopping.exact_tv(pair, 3, stop, 4, probe=probe) < 1e-12
  assert stopping.exact_tv(pair, 3, never, 4, rule="wrong_fallback",
                           probe=lambda c: True) > 0.01


# ---- The compiled loop: statistical harness on a V = 8 toy target.

EV, EK, EN = 8, 3, 100_000
EPROMPT = np.array([1, 2, 3], np.int32)


def _toy(seed, flavour):
  return testing.toy_transformer(
      EV, seed, flavour=flavour, num_kv_heads=1 if flavour == "llama" else None,
      embed_scale=6.0)


@pytest.fixture(scope="module")
def toys():
  return _toy(0, "gpt2"), _toy(1, "llama")


@dataclasses.dataclass(frozen=True)
class _PeekTwoAhead(draft_length.Rule):
  """Negative control: after drawing x_i (i >= 3), stop at length i - 2
  unless x_i is the draft's mode, i.e. decide the length g from x_{g+2}
  (see lab.stopping): rows that continue judge an x_3 that is always q's
  mode against q."""
  gamma_max: int = 3

  def stop(self, count, q_BxV, x_B):
    q_x_B = jnp.take_along_axis(q_BxV, x_B[:, None], axis=1)[:, 0]
    peeked_B = (q_x_B < jnp.max(q_BxV, axis=-1)) & (count >= 3)
    return peeked_B, jnp.broadcast_to(count - 2, x_B.shape)


# Width 1 priced out; width 2 at alpha 0.5 (1.75 tokens / 1.4) beats an off
# stretch (a probe at 0.9 and a step at 1: 1 / 0.95), which beats width 2 at
# alpha 1/3 (1.44 / 1.4). The uniform prior starts rows at 0.5, so that one
# rejection in 3 tokens moves a row across: counted as kept drafts, which
# move in whole steps (on the default overlap estimate, which moves by each
# draft's keep probability, no row crossed here and no off round ran). No
# switch cost: these generations are a few tokens long, so the time a change
# saves is a fraction of a pass, and the default would keep width 2.
_MIXED_PROBES = draft_length.Goodput(c=0.1, r=(5.0, 1.2), probe=0.9,
                                     probe_every=2, prior=(1.0, 1.0),
                                     estimator="accepted", switch_cost=0.0)


# Widths 1 and 3 only (no loop of width 2): from the uniform prior the
# batch plans width 3 (3 tokens to go at alpha 1/2: 4.16 passes against
# width 1's 4.4), then width 1 once a row's first draft is rejected (alpha
# 1/3, 2 tokens to go: 3.3 passes against 3.51).
_WIDTHS_1_3 = draft_length.Goodput(c=0.2, r=(2.0, 2.0, 2.0), widths=(3, 1),
                                   prior=(1.0, 1.0), estimator="accepted",
                                   switch_cost=0.0)


def _sample(target, draft, rule, sampling):
  out = sj.speculative_generate(
      target, draft, np.tile(EPROMPT, (EN, 1)), np.full(EN, 3, np.int32),
      jax.random.key(3), gamma=rule, max_new_tokens=EK, sampling=sampling)
  return out.tokens, out.summary()


# Not marked `optimized`, though each runs 10^5 rows: an adaptive loop holds
# a round per width, so XLA's full optimizations cost more in compiling than
# they save in running. Single process, the four tests' calls took 61 s and
# 58 s at -O2, 53 s and 51 s at the suite's -O0: `python -m pytest -n0
# --durations=0 tests/test_draft_length.py -k "adaptive_generations or
# peeking"`, with JAX_DISABLE_MOST_OPTIMIZATIONS=0 (-O2) and without.
@pytest.mark.big_batch
@pytest.mark.parametrize("rule", [
    # Rows of one round stopping at different lengths (the path the peeking
    # control breaks): this draft's max q lies in about [.13, .15], so at
    # 0.14 some rounds stop after 1 draft, some after 2, some run to 3. At
    # 0.6 every round stopped after its first draft: plain gamma = 1.
    draft_length.Confidence(threshold=0.14, gamma_max=3),
    # No threshold: the planned path (whole fixed-length rounds, switched),
    # planned on the default estimate (each judged draft's sum_x min(p, q)).
    draft_length.Goodput(c=0.2, r=(1.0, 1.5, 3.0)),
    # With probe rounds: width 2 while the estimate is the prior's 0.5, then
    # probes once the batch's worst row has been rejected (see below).
    _MIXED_PROBES,
    _WIDTHS_1_3,
    # Goodput with the confidence stop: no planned program, a budget per
    # round (here 3, cheap drafts) cut by the stop, rows at every length.
    draft_length.Goodput(c=0.05, r=(1.0, 1.0, 1.0), threshold=0.14),
])
@pytest.mark.full
def test_adaptive_generations_are_exact(toys, rule):
  target, draft = toys
  sampling = sj.SamplingConfig(temperature=1.0)
  tokens, s = _sample(target, draft, rule, sampling)
  result = testing.check_generation(tokens, target, EPROMPT, sampling)
  assert result.passed, str(result)
  # Rows did stop early (fewer draft passes than gamma_max per round).
  assert s["draft_calls"] < rule.gamma_max * s["rounds"], s
  if getattr(rule, "threshold", None) is not None:
    # ... at every length: 1 and 2 (stopped) and 3 (ran through).
    assert all(s["length_hist"][1:]), s
  if rule is _MIXED_PROBES:
    # Off rounds ran (under 2 passes a round) and so did width-2 rounds (the
    # only ones that can draft more than the target judges).
    assert s["verified"] < s["draft_calls"] < 2 * s["rounds"], s
  if rule is _WIDTHS_1_3:
    assert rule.planned_widths == (1, 3)
    assert s["rounds"] < s["draft_calls"], s  # both widths ran
  # The Goodput rule on the overlap estimate read each row's prompt from both
  # prefills (its 2 scored positions); the others read none.
  prompt = jnp.asarray(EPROMPT)[None]
  o = np.minimum(*(np.asarray(sampling_lib.probabilities(m.logits(prompt),
                                                         sampling))[0, :2]
                   for m in (target, draft))).sum()
  reads = getattr(rule, "reads_prompt", False)
  assert s["prompt_scored"] == (2 * EN if reads else 0), s
  assert s["prompt_overlap_sum"] == pytest.approx(o * EN if reads else 0.0,
                                                  rel=1e-4), s
  se = np.sqrt(s["one_minus_tv"] * (1 - s["one_minus_tv"]) / s["verified"])
  assert abs(s["alpha_hat"] - s["one_minus_tv"]) < 6 * se, s


@pytest.mark.big_batch
@pytest.mark.full
def test_peeking_two_ahead_is_rejected(toys):
  target, draft = toys
  sampling = sj.SamplingConfig(temperature=1.0)
  tokens, _ = _sample(target, draft, _PeekTwoAhead(), sampling)
  result = testing.check_generation(tokens, target, EPROMPT, sampling)
  assert not result.passed, str(result)


# ---- Ragged rounds, stats, the rules themselves.

@pytest.fixture(scope="module")
def target():
  return TransformerLM.create(TransformerConfig(
      vocab_size=V, d_model=32, num_layers=3, num_heads=4, max_positions=96),
      0)


def _prompts(batch, seed=0, max_len=10):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch).astype(np.int32)
  return rng.integers(0, V, size=(batch, max_len)).astype(np.int32), lengths


def test_goodput_picks_longer_drafts_for_better_rows():
  rule = draft_length.Goodput(c=0.1, r=(1.1, 1.2, 1.3, 1.4, 1.5, 1.6))
  rates = np.asarray(rule.expected_rate(jnp.array([0.3, 0.9])))
  best = rates.argmax(axis=1) + 1
  assert best[0] < best[1]
  # The formula it maximises, checked by hand for alpha = 0.9, g = 3.
  want = (1 - 0.9 ** 4) / (1 - 0.9) / (3 * 0.1 + 1.3)
  assert rates[1, 2] == pytest.approx(want, rel=1e-5)
  stats = sj.RowStats.zeros(2, 6).replace(
      accepted=jnp.array([30, 90]), verified=jnp.array([100, 100]),
      overlap_sum=jnp.array([30.0, 90.0]))
  # One row: its own best. Both: one budget for the batch (shared passes),
  # set by the row the batch waits for: the worse one when both have as many
  # tokens to go, the better one when the worse is nearly done.
  remaining = lambda a, b: jnp.array([a, b], jnp.int32)
  one = rule.plan(stats, jnp.array([True, False]), remaining(100, 100))
  assert int(one[0]) == best[0]
  both = rule.plan(stats, jnp.array([True, True]), remaining(100, 100))
  assert np.asarray(both).tolist() == [best[0]] * 2
  nearly_done = rule.plan(stats, jnp.array([True, True]), remaining(1, 100))
  assert np.asarray(nearly_done).tolist() == [best[1]] * 2
  # The loop keeps a width while its expected time to finish is within
  # `switch_cost` (what a change of width costs, once) of the best width's,
  # plus `hysteresis` of it.
  row = (jnp.array([False, True]), remaining(100, 100))
  time = np.asarray(rule.remaining_time(stats, *row))
  for margin in (dict(switch_cost=3.0), dict(switch_cost=1.0,
                                             hysteresis=0.02)):
    loose = dataclasses.replace(rule, **margin)
    within = time <= time.min() * (1 + loose.hysteresis) + loose.switch_cost
    assert 1 < within.sum() < 6  # some widths kept, some left
    assert [bool(loose.keeps(w, stats, *row)) for w in range(1, 7)] == list(
        within)
  strict = dataclasses.replace(rule, switch_cost=0.0)
  assert [bool(strict.keeps(w, stats, *row)) for w in range(1, 7)] == [
      w == best[1] for w in range(1, 7)]


@dataclasses.dataclass(frozen=True)
class _Cycle(draft_length.Rule):
  """Plans widths 0, 2, 1, 0, 2, ... by the round count (the past only), so
  a generation switches between off stretches and both widths whatever the
  draft's acceptance: every catch-up path runs."""
  gamma_max: int = 2
  probe_every: int = 3

  @property
  def min_width(self):
    return 0

  def plan(self, stats, active_B, remaining_B):
    del remaining_B
    pattern = jnp.array([0, 0, 0, 0, 2, 1, 0, 0, 2, 2], jnp.int32)
    return jnp.full(active_B.shape, pattern[jnp.max(stats.rounds) % 10])


@pytest.mark.parametrize("kind, rules", [
    # Each compile of the planned loop is costly: the default run has the
    # all-off rule that probes every 4 rounds (greedy) and the switching rule
    # (sampled) on the twin, the switching rule on the other kinds (greedy);
    # the rest is opt-in.
    ("twin", "default"), ("self", "switching"), ("eagle", "switching"),
    pytest.param("twin", "off", marks=pytest.mark.slow),
    pytest.param("self", "off", marks=pytest.mark.slow),
    pytest.param("eagle", "off", marks=pytest.mark.slow)])
@pytest.mark.full
def test_probe_rounds_keep_greedy_output_and_judge_a_draft(target, kind,
                                                           rules):
  """Rounds that all probe (a probe costing next to nothing): one token a
  round, the target's greedy output, and one judged draft a round; off
  stretches of a probe and three draft-free steps ("off"); then a rule that
  switches between off stretches and widths 1 and 2 ("switching"); on every
  draft kind (own cache, the target's cache, the target's features, which
  probes every off round)."""
  prompts, lengths = _prompts(3, seed=5)
  key = jax.random.key(0)
  ref = sj.generate(target, prompts, lengths, key, max_new_tokens=16,
                    sampling=sj.GREEDY)
  if kind == "twin":
    # The target as a draft with its own cache: its q is the target's p
    # unless its cache missed a committed token, which checks each catch-up
    # window.
    draft = target
  elif kind == "self":
    draft = sj.SelfDraft(target, layers=1, share_cache=True)
  else:
    draft = sj.EagleDraft.create(target, 0)
  off = [draft_length.Goodput(c=0.1, r=(50.0, 50.0), probe=1e-3,
                              probe_every=every) for every in (1, 4)]
  # The twin's default run checks the switching rule sampled, below.
  for rule in {"default": off[1:], "off": off,
               "switching": [_Cycle()]}[rules]:
    out = sj.speculative_generate(target, draft, prompts, lengths, key,
                                  gamma=rule, max_new_tokens=16,
                                  sampling=sj.GREEDY)
    np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=str(rule))
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    s = out.summary()
    if rule in off:  # every round off: one token each
      assert s["rounds"] == 16 * 3, s
      probes = (16 * 3 if rule.probe_every == 1 or kind == "eagle"
                else 4 * 3)
      assert s["draft_calls"] == s["verified"] == probes, s
      # A probe round judges a draft but emits one token, as an off step.
      assert s["length_hist"] == [s["rounds"], 0, 0], s
      assert s["formula_tokens_per_target_call"] == 1.0
      # (An untrained head's greedy drafts are never the target's.)
      assert s["accepted"] > 0 or kind == "eagle", s
    if kind == "twin":
      assert s["accepted"] == s["verified"] > 0, (rule, s)
  if rules == "default":
    # Sampled, q = p exactly wherever the draft's cache holds every committed
    # token: sum_x min(p, q) = 1 at every judged position.
    s = sj.speculative_generate(target, draft, prompts, lengths, key,
                                gamma=_Cycle(), max_new_tokens=16).summary()
    assert s["one_minus_tv"] > 1 - 1e-5, s
    assert s["accepted"] <= s["verified"] <= s["draft_calls"]
    # Probe rounds and widths 1 and 2: ragged rounds, each emitting its
    # length + 1 at alpha = 1 (a probe: 1), which the formula prices, not
    # gamma_max + 1 = 3 a round; only budget cuts leave the measured lower.
    assert np.count_nonzero(s["length_hist"]) == 3, s
    assert (s["tokens_per_target_call"] <= s["formula_tokens_per_target_call"]
            < 2.5), s
    assert math.isnan(s["expected_tokens_per_target_call"])


@pytest.mark.full
def test_rules_that_differ_in_numbers_share_one_compiled_loop(target):
  """A rule's numbers (costs, prior, threshold) are traced, so new ones (a
  warm start, fresh measurements) reuse the compiled loop, and still take
  effect; its structure (a probe or none, gamma_max) is the program's."""
  prompts, lengths = _prompts(3, seed=5)
  run = lambda rule: sj.speculative_generate(
      target, target, prompts, lengths, jax.random.key(0), gamma=rule,
      max_new_tokens=16, sampling=sj.GREEDY)
  # The probe test's all-off rule above: its program, when run after it.
  first = draft_length.Goodput(c=0.1, r=(50.0, 50.0), probe=1e-3,
                               probe_every=4)
  out = run(first)
  compiled = loop._generate._cache_size()
  cheap = dataclasses.replace(first, r=(1.0, 1.1), switch_cost=0.0)
  for rule in (dataclasses.replace(first, c=0.3, prior=(9.0, 1.0)), cheap):
    again = run(rule)
    np.testing.assert_array_equal(again.tokens, out.tokens)  # greedy
  assert loop._generate._cache_size() == compiled
  # Cheap verify passes: the same program now drafts, where `first` probed.
  assert (again.summary()["draft_calls"]
          > 2 * out.summary()["draft_calls"]), (again.summary(), out.summary())
  # A warm start drops the prompt's prior (prompt_prior 0: the loop scores
  # no prompt, another program); warm starts after it share that one.
  run(first.warm_start(out))
  compiled = loop._generate._cache_size()
  run(first.warm_start(again))
  assert loop._generate._cache_size() == compiled
  skeleton = lambda rule: draft_length.split(rule)[0]
  assert skeleton(cheap) == skeleton(first)
  assert skeleton(dataclasses.replace(first, probe=None)) != skeleton(first)
  assert skeleton(draft_length.Confidence(0.2)) == skeleton(
      draft_length.Confidence(0.9))


@pytest.mark.full
def test_a_pinned_rule_runs_one_width_on_the_rules_own_loop(target):
  """`pinned(rule, g)` plans and keeps width g whatever the rows' estimates
  and budgets, with `rule`'s skeleton: its calls run rounds of g drafts on
  the loop compiled for `rule`, at every g."""
  rule = draft_length.Goodput(c=0.1, r=(1.0, 1.1, 1.2), probe=1.0,
                              hysteresis=0.02)
  rng = np.random.default_rng(0)
  verified = np.array([0, 1000, 1000, 5, 40, 7])
  stats = sj.RowStats.zeros(6, 3).replace(
      verified=jnp.asarray(verified, jnp.int32),
      overlap_sum=jnp.asarray([0.0, 0.0, 1000.0, 2.5, 39.0, 1.0]))
  active_B = jnp.asarray([True, True, True, True, False, True])
  remaining_B = jnp.asarray(rng.integers(1, 500, 6), jnp.int32)
  for g in (1, 2, 3):
    pin = draft_length.pinned(rule, g)
    assert draft_length.split(pin)[0] == draft_length.split(rule)[0]
    np.testing.assert_array_equal(pin.plan(stats, active_B, remaining_B), g)
    for w in range(4):
      assert bool(pin.keeps(w, stats, active_B, remaining_B)) is (w == g)
  prompts, lengths = _prompts(2, seed=6)
  run = lambda gamma: sj.speculative_generate(
      target, target, prompts, lengths, jax.random.key(0), gamma=gamma,
      max_new_tokens=16, sampling=sj.GREEDY)
  run(draft_length.pinned(rule, 1))
  compiled = loop._generate._cache_size()
  for g in (2, 3):
    s = run(draft_length.pinned(rule, g)).stats
    np.testing.assert_array_equal(s.draft_calls, g * s.rounds)
  run(rule)
  assert loop._generate._cache_size() == compiled
  with pytest.raises(TypeError, match="without a threshold"):
    draft_length.pinned(dataclasses.replace(rule, probe=None, threshold=0.5),
                        1)
  with pytest.raises(TypeError, match="Goodput"):
    draft_length.pinned(draft_length.Confidence(0.5, 3), 1)
  for width in (0, 4):
    with pytest.raises(ValueError, match="width"):
      draft_length.pinned(rule, width)
  with pytest.raises(TypeError, match="width"):
    draft_length.pinned(rule, 2.0)


@pytest.mark.full
def test_goodput_plans_only_its_widths(target):
  """With `widths`, `plan` gives only those widths (0 too, with a probe),
  the loop holds a loop of rounds for each of them alone, and a pinned rule
  refuses another; widths=None and every width are one rule."""
  rule = draft_length.Goodput(c=0.05, r=(1.0, 1.1, 1.2, 1.3, 4.0),
                              widths=(4, 1, 2, 1), probe=1.0)
  assert rule.widths == (1, 2, 4)
  assert rule.planned_widths == (0, 1, 2, 4)
  assert [autotune.doubling_widths(g) for g in (1, 3, 6, 16)] == [
      (1,), (1, 2, 3), (1, 2, 4, 6), (1, 2, 4, 8, 16)]
  assert draft_length.Goodput(c=0.1, r=(1.0, 1.1), widths=(2, 1)) == (
      draft_length.Goodput(c=0.1, r=(1.0, 1.1)))
  rng = np.random.default_rng(1)
  for _ in range(20):
    verified = rng.integers(0, 200, 4)
    stats = sj.RowStats.zeros(4, 5).replace(
        verified=jnp.asarray(verified, jnp.int32),
        overlap_sum=jnp.asarray(verified * rng.uniform(0, 1, 4), jnp.float32))
    active_B = jnp.asarray(rng.uniform(size=4) < 0.8)
    remaining_B = jnp.asarray(rng.integers(1, 300, 4), jnp.int32)
    planned = int(np.asarray(rule.plan(stats, active_B, remaining_B))[0])
    assert planned in rule.planned_widths
    for w in (3, 5):  # never kept: no loop runs them
      assert not bool(rule.keeps(w, stats, active_B, remaining_B))
  # Costs near float32's largest: every allowed width's time overflows to
  # +inf, as the widths left out are. Their tie planned width 1, which the
  # planned loop holds no loop of: no round ran and the loop never ended.
  huge = draft_length.Goodput(c=3e37, r=(1.0,) * 4, widths=(2, 4))
  stats = sj.RowStats.zeros(2, 4)
  for remaining in (1, 100):
    remaining_B = jnp.full((2,), remaining, jnp.int32)
    planned = int(huge.plan(stats, jnp.array([True, True]), remaining_B)[0])
    assert planned in (2, 4), (remaining, planned)
  with pytest.raises(ValueError, match="widths"):
    draft_length.pinned(dataclasses.replace(rule, probe=None), 3)
  # Rows that keep every draft: width 2 is the cheapest per token; allowed
  # only 1 and 3, the rule plans 1, and so drafts (greedy, the target as
  # its own draft; one compile: the program without widths is elsewhere).
  every = draft_length.Goodput(c=0.1, r=(1.0, 1.1, 5.0))
  some = dataclasses.replace(every, widths=(1, 3))
  kept = sj.RowStats.zeros(2, 3).replace(
      verified=jnp.asarray([50, 50], jnp.int32),
      overlap_sum=jnp.asarray([50.0, 50.0]))
  plans = lambda rule: np.asarray(rule.plan(kept, jnp.asarray([True, True]),
                                            jnp.asarray([16, 16])))
  assert plans(every).tolist() == [2, 2] and plans(some).tolist() == [1, 1]
  prompts, lengths = _prompts(2, seed=7)
  s = sj.speculative_generate(
      target, target, prompts, lengths, jax.random.key(0), gamma=some,
      max_new_tokens=16, sampling=sj.GREEDY).stats
  np.testing.assert_array_equal(s.draft_calls, s.rounds)


def test_goodput_estimates_acceptance_from_overlaps():
  """By default each judged draft adds its keep probability sum_x min(p, q)
  to the kept count (Rao-Blackwellised); estimator='accepted' counts the
  drafts kept. Both start from the prior's pseudo-counts."""
  rule = draft_length.Goodput(c=0.1, r=(1.0, 1.1))
  stats = sj.RowStats.zeros(2, 2).replace(
      accepted=jnp.array([3, 0]), verified=jnp.array([4, 0]),
      overlap_sum=jnp.array([3.6, 0.0]))
  np.testing.assert_allclose(rule.alpha(stats), [6.6 / 8, 3 / 4], rtol=1e-6)
  counts = dataclasses.replace(rule, estimator="accepted")
  np.testing.assert_allclose(counts.alpha(stats), [6 / 8, 3 / 4], rtol=1e-6)


def test_overlap_estimate_needs_the_exact_token_verifier(target):
  """A lossy verifier keeps drafts more often than sum_x min(p, q) says:
  the loop refuses the overlap estimate there, before compiling."""
  get = verifiers.get_verifier
  assert get("token").keeps_with_overlap
  assert not any(get(v).keeps_with_overlap
                 for v in ("lenient:0.5", "block", "always_accept"))
  prompts, lengths = _prompts(2)
  rule = draft_length.Goodput(c=0.1, r=(1.0, 1.1))
  with pytest.raises(ValueError, match="estimator='accepted'"):
    sj.speculative_generate(target, target, prompts, lengths,
                            jax.random.key(0), gamma=rule, max_new_tokens=4,
                            verifier="lenient:0.5")


def test_goodput_probes_where_no_width_pays():
  """The rule plans a probe round (0) for a batch waiting on a row whose
  draft is mostly rejected, and speculates again for a row it predicts."""
  rule = draft_length.Goodput(c=0.05, r=(1.5, 1.7, 2.0), overhead=0.05,
                              probe=1.1, probe_every=4)
  assert rule.min_width == 0 and len(rule.round_costs()) == 4
  # An off stretch: one probe and three steps of 1 + overhead.
  assert rule.round_costs()[0] == pytest.approx((1.1 + 3 * 1.05) / 4)
  stats = sj.RowStats.zeros(2, 3).replace(
      accepted=jnp.array([25, 95]), verified=jnp.array([100, 100]),
      overlap_sum=jnp.array([25.0, 95.0]))
  go = lambda *active: rule.plan(stats, jnp.array(active),
                                 jnp.array([100, 100], jnp.int32))
  assert np.asarray(go(True, True)).tolist() == [0, 0]
  assert int(go(False, True)[1]) >= 2
  assert draft_length.Goodput(c=0.05, r=(1.5, 1.7, 2.0)).min_width == 1
  # A finished row does not turn the others' off stretch into a width-1
  # round (it once counted as budget 1): the loop's next width is 0.
  from specjax.decode import adaptive  # pylint: disable=import-outside-toplevel
  state = types.SimpleNamespace(stats=stats, done=jnp.array([False, True]),
                                generated=jnp.array([28, 128], jnp.int32))
  assert int(adaptive.width(rule, state, 128)) == 0


def test_goodput_charges_the_whole_round():
  """A round costs c_first + (g - 1) c + r_g + overhead target passes; the
  fixed per-round overhead makes longer drafts worth more."""
  r = (1.1, 1.2, 1.3, 1.4, 1.5, 1.6)
  bare = draft_length.Goodput(c=0.3, r=r)
  full = draft_length.Goodput(c=0.3, r=r, c_first=0.5, overhead=2.0)
  assert full.round_costs()[2] == pytest.approx(0.5 + 2 * 0.3 + 1.3 + 2.0)
  alpha = jnp.array([0.7])
  best = lambda rule: int(np.asarray(rule.expected_rate(alpha)).argmax()) + 1
  assert best(full) > best(bare)


def test_monotone_fit_pools_a_slow_timing():
  """Measured costs are fitted non-decreasing by pooling, not a running max:
  one slow timing moves the fit by its share, not every wider width to it."""
  fit = autotune.monotone_fit
  assert fit([1.1, 1.3, 1.3, 2.0]) == (1.1, 1.3, 1.3, 2.0)  # already monotone
  # The 2-token pass timed slow (2.0): a running max would price widths 2..5
  # at 2.0; pooled, the violators share their mean.
  assert fit([2.0, 1.3, 1.4, 1.5]) == pytest.approx((1.55,) * 4)
  assert fit([1.2, 1.9, 1.3, 1.6, 2.4]) == pytest.approx(
      (1.2, 1.6, 1.6, 1.6, 2.4))
  assert fit([0.8, 0.9, 1.2], low=1.0) == pytest.approx((1.0, 1.0, 1.2))
  # Least squares among non-decreasing fits: no small monotone move helps.
  rng = np.random.default_rng(0)
  x = rng.normal(size=12)
  y = np.asarray(fit(x, low=-np.inf))
  assert (np.diff(y) >= 0).all()
  for _ in range(200):
    z = np.maximum.accumulate(y + rng.normal(scale=0.05, size=12))
    assert ((z - x) ** 2).sum() >= ((y - x) ** 2).sum() - 1e-12


def test_measured_rounds_cost_what_the_loops_rounds_cost(target, monkeypatch):
  """`measure_goodput(calibrate=True)` (timings stubbed): every width's round
  costs what the loop's own round of that width does, in `generate` steps
  (`measure.loop_round_steps`), whatever shape the passes timed alone have;
  without the loop's rounds (the control) the passes alone price them."""
  from specjax.harness import measure  # pylint: disable=import-outside-toplevel
  # The target's passes on 1..5 tokens (a jump at 3 tokens, which the
  # loop's rounds do not have), then the draft's on 1 and 2 tokens.
  timed = {}  # calibrate -> the target's widths timed (its first call)
  def stub(model, *, passes, **kwargs):
    del model, kwargs
    if now["calibrate"] not in timed:
      timed[now["calibrate"]] = [t for t, _ in passes]
      seconds = {1: 1.0, 2: 1.2, 3: 3.0, 4: 3.1, 5: 3.2}
      return [seconds[t] for t, _ in passes]
    return [0.1, 0.15][:len(passes)]  # the draft's passes on 1 and 2 tokens
  monkeypatch.setattr(measure, "passes_seconds", stub)
  monkeypatch.setattr(measure, "null_loop_seconds",
                      lambda *a, **k: (0.25, 0.0))
  in_loop = [1.5, 1.9, 2.3, 2.6]
  asked, on = [], []
  monkeypatch.setattr(measure, "loop_round_steps",
                      lambda *a, widths, rule=None, **k: asked.append(
                          tuple(widths)) or on.append(rule)
                      or in_loop[:len(widths)])
  now = {}
  def measured(calibrate):
    now["calibrate"] = calibrate
    return autotune.measure_goodput(
        target, target, batch_size=3, gamma_max=4, prompt_len=8,
        max_new_tokens=16, calibrate=calibrate)
  rule = measured(True)
  alone = measured(False)
  # The default, and so gamma="auto": the loop's own rounds (memoised).
  default = autotune.measure_goodput(
      target, target, batch_size=3, gamma_max=4, prompt_len=8,
      max_new_tokens=16)
  autotune._MEASURED.clear()  # stubbed: not for later calls
  assert default is rule
  assert asked == [(1, 2, 3, 4)]
  # The widths were timed on the measured rule's own loop (`pinned`), which
  # its calls then reuse.
  assert draft_length.split(on[0])[0] == draft_length.split(rule)[0]
  # Calibrated, the target's passes are timed only for the probe round.
  assert timed == {True: [1, 2], False: [1, 2, 3, 4, 5]}
  step = 1.0 + rule.overhead
  rounds = [x / step for x in rule.round_costs()[1:]]  # widths 1..4
  assert rounds == pytest.approx(in_loop)
  want_alone = [(0.15 + (g - 1) * 0.1 + [1.2, 3.0, 3.1, 3.2][g - 1] + 0.25)
                / step for g in range(1, 5)]
  assert [x / step for x in alone.round_costs()[1:]] == pytest.approx(
      want_alone)
  # Priced alone, width 2 looks dearer than the loop's width 4.
  assert want_alone[1] > in_loop[3]
  # A probe round is scaled as the width-1 round is.
  assert rule.probe == pytest.approx(alone.probe * in_loop[0] * step
                                     / (0.15 + 1.2 + 0.25))


def test_measured_widths_time_only_those_rounds(target, monkeypatch):
  """`measure_goodput(widths=...)` (timings stubbed) times the loop's rounds
  of those widths alone, on a rule planning only them; r between them is
  interpolated, and the probe round is scaled as the narrowest one is."""
  from specjax.harness import measure  # pylint: disable=import-outside-toplevel
  timed = []
  def stub(model, *, passes, **kwargs):
    del kwargs
    del model
    timed.append([t for t, _ in passes])
    # The target's passes first, then the draft's on 1 and 2 tokens.
    return ([1.0, 1.2, 1.4] if len(timed) == 1 else [0.1, 0.15])[
        :len(passes)]
  monkeypatch.setattr(measure, "passes_seconds", stub)
  monkeypatch.setattr(measure, "null_loop_seconds",
                      lambda *a, **k: (0.25, 0.0))
  asked = []
  monkeypatch.setattr(measure, "loop_round_steps",
                      lambda *a, widths, rule=None, **k: asked.append(
                          (tuple(widths), rule)) or [2.0, 3.0])
  rule = autotune.measure_goodput(
      target, target, batch_size=1, gamma_max=4, prompt_len=8,
      max_new_tokens=16, widths=[4, 2])
  autotune._MEASURED.clear()  # stubbed: not for later calls
  assert rule.widths == (2, 4) and rule.planned_widths == (0, 2, 4)
  assert [w for w, _ in asked] == [(2, 4)]
  assert draft_length.split(asked[0][1])[0] == draft_length.split(rule)[0]
  # The target's passes on 1..3 tokens: a width-2 round's, timed alone.
  assert timed[0] == [1, 2, 3]
  step = 1.0 + rule.overhead
  r2, r4 = (steps * step - 0.15 - (g - 1) * 0.1 - 0.25
            for g, steps in ((2, 2.0), (4, 3.0)))
  assert rule.r[1] == pytest.approx(r2) and rule.r[3] == pytest.approx(r4)
  assert rule.r[2] == pytest.approx((r2 + r4) / 2)
  assert rule.probe == pytest.approx((0.15 + 1.0 + 0.25) * 2.0 * step
                                     / (0.15 + 0.1 + 1.4 + 0.25))


def test_pass_times_that_break_subadditivity_are_retimed(target, monkeypatch):
  """A target pass on t tokens cannot cost more than t single-token passes:
  `measure_goodput` (timings stubbed) retimes passes that break that (a
  1-token pass timed 5x too cheap, the unit of every cost), warns when every
  attempt breaks it, and refuses a 1-token pass of 0 s; sub-linear times
  (the control) are taken at once."""
  from specjax.harness import measure  # pylint: disable=import-outside-toplevel
  good = [1.0, 1.05, 1.1, 1.6]  # the target's passes on 1..4 tokens
  bad = [0.2, 1.05, 1.1, 1.6]
  def measured(target_times):
    calls = []
    def stub(model, *, passes, **kwargs):
      del model, kwargs
      if len(passes) == 4:
        calls.append(1)
        return target_times[min(len(calls), len(target_times)) - 1]
      return [0.1, 0.15][:len(passes)]  # the draft's passes
    monkeypatch.setattr(measure, "passes_seconds", stub)
    monkeypatch.setattr(measure, "null_loop_seconds",
                        lambda *a, **k: (0.25, 0.0))
    try:
      rule = autotune.measure_goodput(
          target, target, batch_size=2, gamma_max=3, prompt_len=8,
          max_new_tokens=16, calibrate=False)
    finally:
      autotune._MEASURED.clear()  # stubbed: not for later calls
    return rule, len(calls)
  rule, attempts = measured([good])
  assert attempts == 1 and rule.r == pytest.approx((1.05, 1.1, 1.6))
  rule, attempts = measured([bad, good])
  assert attempts == 2 and rule.r == pytest.approx((1.05, 1.1, 1.6))
  with pytest.warns(RuntimeWarning, match="subadditivity"):
    rule, attempts = measured([bad])
  assert attempts == 3 and rule.r[0] == pytest.approx(1.05 / 0.2)
  with pytest.raises(RuntimeError, match="gamma=<int>"):
    measured([[0.0, 1.05, 1.1, 1.6]])


def test_measured_rule_damps_width_changes_less_for_a_batch(target,
                                                           monkeypatch):
  """`measure_goodput` (timings stubbed) keeps the default margins at batch
  1 (no `hysteresis`, the default `switch_cost`) and gives a batch of more
  rows `BATCHED_HYSTERESIS`; the margins are what `keeps` reads."""
  from specjax.harness import measure  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(measure, "passes_seconds",
                      lambda model, *, passes, **k: [1.0 + 0.1 * t
                                                     for t, _ in passes])
  monkeypatch.setattr(measure, "null_loop_seconds",
                      lambda *a, **k: (0.25, 0.0))
  try:
    one, eight = (autotune.measure_goodput(
        target, target, batch_size=b, gamma_max=3, prompt_len=8,
        max_new_tokens=16, calibrate=False) for b in (1, 8))
  finally:
    autotune._MEASURED.clear()  # stubbed: not for later calls
  assert one.hysteresis == draft_length.Goodput.hysteresis == 0.0
  assert eight.hysteresis == autotune.BATCHED_HYSTERESIS == 0.02
  assert one.switch_cost == eight.switch_cost == 0.25
  # Width 1 is 3 passes over the best width's 10: left at batch 1 (0.25
  # over is the most kept), kept at batch 8 (0.2 + 0.25 over 10).
  time_G = jnp.array([10.3, 10.0, 11.0])
  monkeypatch.setattr(draft_length.Goodput, "remaining_time",
                      lambda self, *a: time_G)
  for rule, kept in ((one, False), (eight, True)):
    rule = dataclasses.replace(rule, probe=None)
    assert bool(rule.keeps(1, None, None, None)) is kept


def _result(accepted, verified):
  stats = sj.RowStats.zeros(2, 4).replace(
      accepted=jnp.array(accepted, jnp.int32),
      verified=jnp.array(verified, jnp.int32))
  return sj.GenerationResult(tokens=jnp.zeros((2, 4), jnp.int32),
                             lengths=jnp.full((2,), 4, jnp.int32), stats=stats)


def test_warm_start_sets_the_prior_from_a_previous_generation():
  rule = draft_length.Goodput(c=0.05, r=(1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8,
                                         1.9), probe=1.1)
  # The pooled acceptance: 95 of 100 drafts kept.
  warm = rule.warm_start(_result([45, 50], [48, 52]), strength=10.0)
  assert warm.prior == pytest.approx((95.5 / 101 * 10, 5.5 / 101 * 10))
  # The pilot replaces the rows' prompts as their start.
  assert warm.prompt_prior == 0.0
  assert dataclasses.replace(warm, prior=rule.prior,
                             prompt_prior=rule.prompt_prior) == rule
  # A pilot that kept every draft still leaves both pseudo-counts positive.
  assert min(rule.warm_start(_result([5, 5], [5, 5])).prior) > 0
  # Before any round: the uniform prior (acceptance 1/2) plans 2 drafts,
  # the default one (3/4) 4, the warm one (~0.95) the widest round.
  fresh = sj.RowStats.zeros(1, 8)
  first = lambda r: int(r.plan(fresh, jnp.array([True]),
                               jnp.array([64], jnp.int32))[0])
  uniform = dataclasses.replace(rule, prior=(1.0, 1.0))
  assert (first(uniform), first(rule), first(warm)) == (2, 4, 8)


def test_goodput_starts_each_row_from_its_prompt():
  """A row whose prompt scored n positions starts from their mean overlap
  (shrunk half a position each way) weighted as min(n, prompt_prior) drafts,
  with what is left of the weight on `prior`; no prompt, or the "accepted"
  estimator, or prompt_prior 0: `prior` alone."""
  rule = draft_length.Goodput(c=0.1, r=(1.0, 1.1), prompt_prior=8.0)
  stats = sj.RowStats.zeros(3, 2).replace(
      prompt_scored=jnp.array([0, 4, 63], jnp.int32),
      prompt_overlap_sum=jnp.array([0.0, 3.5, 62.5], jnp.float32))
  a_B, b_B = (np.asarray(x) for x in rule.initial_counts(stats))
  np.testing.assert_allclose(a_B, [3.0, 4 * 0.8 + 0.5 * 3, 8 * 63 / 64],
                             rtol=1e-6)
  np.testing.assert_allclose(b_B, [1.0, 4 * 0.2 + 0.5 * 1, 8 / 64],
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(rule.alpha(stats)), a_B / (a_B + b_B),
                             rtol=1e-6)
  assert rule.reads_prompt
  for off in (dataclasses.replace(rule, prompt_prior=0.0),
              dataclasses.replace(rule, estimator="accepted")):
    assert not off.reads_prompt
    np.testing.assert_allclose(np.asarray(off.alpha(stats)), 0.75)
  # A well-predicted prompt plans the widest round before any round is
  # judged; the default prior plans 4 (as in the warm-start test above).
  wide = draft_length.Goodput(c=0.05, r=(1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8,
                                         1.9), probe=1.1)
  row = (jnp.array([True]), jnp.array([64], jnp.int32))
  primed = stats.replace(prompt_scored=jnp.array([63], jnp.int32),
                         prompt_overlap_sum=jnp.array([60.0], jnp.float32),
                         verified=jnp.zeros(1, jnp.int32),
                         overlap_sum=jnp.zeros(1, jnp.float32),
                         accepted=jnp.zeros(1, jnp.int32))
  assert int(wide.plan(primed, *row)[0]) == 8
  assert int(dataclasses.replace(wide, prompt_prior=0.0).plan(primed, *row)[0]
             ) == 4


def test_prompt_overlap_scores_the_prompts_last_positions():
  """Row b's last min(window, n_b - 1) positions, each model's law of the
  next prompt token; non-finite logits are left out. The window is the
  rule's weight in positions."""
  rule = draft_length.Goodput(c=0.1, r=(1.0,), prompt_prior=15.5)
  window = rule.prompt_window
  assert window == 16
  assert dataclasses.replace(rule, prompt_prior=0.0).prompt_window == 0
  assert dataclasses.replace(rule, estimator="accepted").prompt_window == 0
  rng = np.random.default_rng(0)
  p_logits = jnp.asarray(rng.normal(size=(4, window + 16, V)), jnp.float32)
  q_logits = jnp.asarray(rng.normal(size=(4, window + 16, V)), jnp.float32)
  lengths = jnp.array([window + 16, 5, 1, 9], jnp.int32)
  # Row 3's position 2 (scored: 2 <= 9 - 2) holds a NaN in q.
  q_logits = q_logits.at[3, 2, 0].set(jnp.nan)
  sampling = sj.SamplingConfig(temperature=1.0)
  at, ok = loop._prompt_window(lengths, window + 16, window)
  window_of = lambda l: jnp.take_along_axis(l, at[..., None], axis=1)
  # Traced, as in the loop (called eagerly, `probabilities` refuses the NaN).
  overlap = jax.jit(lambda p, q: loop._prompt_overlap(
      window_of(p), window_of(q), ok, None, sampling))
  scored, total = overlap(p_logits, q_logits)
  np.testing.assert_array_equal(scored, [window, 4, 0, 7])
  p = np.asarray(sampling_lib.probabilities(p_logits, sampling))
  q = np.asarray(jax.jit(sampling_lib.probabilities, static_argnums=1)(
      q_logits, sampling))  # NaN at (3, 2), left out below
  o = np.minimum(p, q).sum(-1)
  want = [o[0, 15:window + 15].sum(), o[1, :4].sum(), 0.0,
          o[3, [0, 1, 3, 4, 5, 6, 7]].sum()]
  np.testing.assert_allclose(np.asarray(total), want, rtol=1e-5)
  # The same logits for both models: every scored position overlaps fully.
  scored, total = overlap(p_logits, p_logits)
  np.testing.assert_allclose(np.asarray(total), np.asarray(scored), rtol=1e-5)


@pytest.mark.full
def test_prefill_returns_the_logits_at_the_window(target):
  """The window alone through the last block, the final norm and the head
  (a Transformer, `logits_at`), or the full logits gathered (an n-gram):
  the logits the model gives there, and the cache a plain prefill
  leaves."""
  prompts, lengths = _prompts(3, seed=7, max_len=12)
  at, _ = loop._prompt_window(jnp.asarray(lengths), 12, 5)
  bigram = sj.NGramLM.fit(np.arange(200) % V, V, order=2)
  # The vocabulary wrappers pass `logits_at` on where their model has it.
  padded = vocab.PaddedVocabLM(model=target, vocab_size=V + 4, num_real=V)
  reduced = vocab.ReducedVocabLM.create(target, np.arange(0, V, 2))
  padded_bigram = vocab.PaddedVocabLM(model=bigram, vocab_size=V, num_real=V)
  assert hasattr(padded, "logits_at")
  assert not hasattr(padded_bigram, "logits_at")
  # Self-drafts with caches of their own (a skip set; a prefix with an
  # adapter, perturbed off the identity it starts as).
  adapter = sj.ExitAdapter.create(target, 2)
  adapter = adapter.replace(state=jax.tree.map(
      lambda x: x + 0.1, adapter.state))
  selfs = (sj.SelfDraft.skipping(target, skip=[1]),
           sj.SelfDraft(target, layers=2, adapter=adapter))
  for model in (target, bigram, padded, reduced, padded_bigram, *selfs):
    full, _ = model(prompts, model.init_cache(3, 12))
    cache, got = loop._prefill(model, prompts, 16, jnp.asarray(lengths), at)
    np.testing.assert_allclose(
        np.asarray(got), np.take_along_axis(np.asarray(full),
                                            np.asarray(at)[..., None], 1),
        rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache.lengths, lengths)
    plain, _ = loop._prefill(model, prompts, 16, jnp.asarray(lengths))
    for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(plain)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


@pytest.mark.parametrize("previous, strength, error, match", [
    ("pilot", 16.0, TypeError, "GenerationResult"),
    (_result([0, 0], [0, 0]), 16.0, ValueError, "judged no drafts"),
    (_result([1, 1], [2, 2]), 0.0, ValueError, "strength"),
    (_result([1, 1], [2, 2]), "a lot", TypeError, "strength"),
])
def test_warm_start_bad_input(previous, strength, error, match):
  rule = draft_length.Goodput(c=0.1, r=(1.0, 1.1))
  with pytest.raises(error, match=match):
    rule.warm_start(previous, strength=strength)


@pytest.mark.slow  # ~15 s: times the models at 8 widths on one planned loop
def test_auto_rule_measures_costs_once(target):
  prompts, lengths = _prompts(2)
  draft = sj.SelfDraft(target, layers=1)
  known = set(autotune._MEASURED)
  rule = autotune.auto_rule(target, draft, prompts, lengths,
                            max_new_tokens=8, sampling=sj.GREEDY)
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(0), gamma=rule,
                                max_new_tokens=8, sampling=sj.GREEDY)
  ref = sj.generate(target, prompts, lengths, jax.random.key(0),
                    max_new_tokens=8, sampling=sj.GREEDY)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert len(out.summary()["accept_hist"]) == 9  # gamma_max = 8
  before = dict(autotune._MEASURED)
  # The same shapes and sampling: no new timing, the same rule.
  assert autotune.auto_rule(target, draft, prompts, lengths,
                            max_new_tokens=8, sampling=sj.GREEDY) == rule
  assert autotune._MEASURED == before
  # It plans widths 1, 2, 4, 8 (its rule is the one measured).
  (measured,) = (r for key, r in before.items() if key not in known)
  assert measured == rule
  assert rule.widths == autotune.doubling_widths(8) == (1, 2, 4, 8)


@pytest.mark.parametrize("make, error, match", [
    (lambda: draft_length.Confidence(threshold=1.5), ValueError, "threshold"),
    (lambda: draft_length.Confidence(gamma_max=0), ValueError, "gamma_max"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 1.1), gamma_max=3),
     ValueError, "r must"),
    (lambda: draft_length.Goodput(c=-1.0, r=(1.0,)), ValueError, "c "),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 0.0)), ValueError, "r must"),
    (lambda: draft_length.Goodput(c=0.1, r=1.0), TypeError, "r must"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), overhead=-1.0), ValueError,
     "overhead"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), hysteresis=-0.1),
     ValueError, "hysteresis"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), switch_cost=-0.1),
     ValueError, "switch_cost"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), switch_cost="x"),
     TypeError, "switch_cost"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), probe=0.0), ValueError,
     "probe"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), probe="fast"), TypeError,
     "probe"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), probe=1.0, threshold=0.5),
     ValueError, "probe"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), probe=1.0, probe_every=0),
     ValueError, "probe_every"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), estimator="kept"),
     ValueError, "estimator"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), prompt_prior=-1.0),
     ValueError, "prompt_prior"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), prompt_prior=None),
     TypeError, "prompt_prior"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0,), prior=5), TypeError,
     "prior must be two"),
    (lambda: draft_length.Goodput(c=0.1, r=()), ValueError,
     "r must hold one verify cost ratio"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 1.1), widths=(0, 1)),
     ValueError, "widths"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 1.1), widths=(3,)),
     ValueError, "widths"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 1.1), widths=()),
     ValueError, "widths"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 1.1), widths="12"),
     TypeError, "widths"),
    (lambda: draft_length.Goodput(c=0.1, r=(1.0, 1.1), widths=(1.5,)),
     TypeError, "widths"),
    # The loop computes in float32: a cost that overflows it is refused,
    # and so is a prior that underflows to 0 (0 / 0 estimates).
    (lambda: draft_length.split(draft_length.Goodput(c=1e39, r=(1.0,))),
     ValueError, "float32"),
    (lambda: draft_length.split(draft_length.Goodput(
        c=0.1, r=(1.0,), prior=(1e-50, 1e-50))), ValueError, "float32"),
    # Each field fits float32, their sum (a round's cost) does not.
    (lambda: draft_length.Goodput(c=2e38, r=(1.0, 1.0)), ValueError,
     "round costs .* overflow float32"),
    # None is Goodput's "no threshold"; a Confidence rule is its threshold.
    (lambda: draft_length.Confidence(threshold=None), TypeError,
     "threshold must be a probability"),
])
def test_bad_rules_get_clear_errors(make, error, match):
  with pytest.raises(error, match=match):
    make()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(draft=None), TypeError, "draft must implement"),
    (dict(seconds=0.0), ValueError, "seconds"),
    (dict(repeats=0), ValueError, "repeats"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(widths=(3,)), ValueError, "widths"),
    # It priced a pair that speculative_generate refuses.
    (dict(draft=sj.NGramLM.uniform(V + 1)), ValueError, "vocab_size"),
])
def test_measure_goodput_bad_input_is_refused_before_timing(target, kwargs,
                                                            error, match):
  args = dict(target=target, draft=target, batch_size=1, prompt_len=4,
              max_new_tokens=8, gamma_max=2, calibrate=False)
  with pytest.raises(error, match=match):
    autotune.measure_goodput(**{**args, **kwargs})


def test_gamma_auto_is_refused_naming_the_two_step_form(target, monkeypatch):
  """The decoder never times itself: "auto" names autotune.auto_rule."""
  def timed(*_, **__):
    raise AssertionError("speculative_generate timed the models")
  monkeypatch.setattr(autotune, "measure_goodput", timed)
  prompts, lengths = _prompts(2)
  with pytest.raises(ValueError, match="autotune.auto_rule"):
    sj.speculative_generate(target, target, prompts, lengths,
                            jax.random.key(0), gamma="auto", max_new_tokens=4)


def test_auto_rule_refuses_a_block_verifier_before_timing(target, monkeypatch):
  def timed(*_, **__):
    raise AssertionError("auto_rule timed before checking the verifier")
  monkeypatch.setattr(autotune, "measure_goodput", timed)
  prompts, lengths = _prompts(2)
  with pytest.raises(ValueError, match="adaptive draft length"):
    autotune.auto_rule(target, target, prompts, lengths, max_new_tokens=4,
                       verifier="block")


@pytest.mark.parametrize("gamma, error", [("fast", ValueError),
                                          (object(), TypeError),
                                          (2.5, TypeError)])
def test_bad_gamma_gets_clear_error(target, gamma, error):
  prompts, lengths = _prompts(2)
  with pytest.raises(error, match="gamma"):
    sj.speculative_generate(target, target, prompts, lengths,
                            jax.random.key(0), gamma=gamma, max_new_tokens=4)
