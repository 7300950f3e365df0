"""Goodput rules priced from a device's roofline: no timer, exact ratios."""

import numpy as np
import pytest

import specjax as sj
from specjax.harness import autotune
from specjax.harness import measure
from specjax.harness import roofline
from specjax.models.ngram import NGramLM
from specjax.models import TransformerConfig
from specjax.models import TransformerLM


def _model(num_layers, vocab_size=259):
  return TransformerLM.create(TransformerConfig(
      vocab_size=vocab_size, d_model=64, num_layers=num_layers, num_heads=4,
      max_positions=256), 0)


def _seconds(model, device, num_tokens, shape):
  return device.seconds(roofline.pass_cost(
      model, batch_size=shape.batch_size, num_tokens=num_tokens,
      capacity=shape.capacity(model)))


@pytest.mark.parametrize("name", sorted(roofline.ACCELERATORS))
def test_costs_are_roofline_ratios(name):
  target, draft = _model(4), _model(1)
  device = roofline.ACCELERATORS[name]
  rule = autotune.roofline_goodput(target, draft, name, batch_size=2,
                                   gamma_max=4, prompt_len=16,
                                   max_new_tokens=32, overhead_seconds=1e-6)
  shape = measure.LoopShape(2, 16, 32, 4)
  base = _seconds(target, device, 1, shape)
  np.testing.assert_allclose(rule.c, _seconds(draft, device, 1, shape) / base,
                             rtol=1e-6)
  np.testing.assert_allclose(rule.c_first,
                             _seconds(draft, device, 2, shape) / base,
                             rtol=1e-6)
  np.testing.assert_allclose(
      rule.r, [_seconds(target, device, g + 1, shape) / base
               for g in range(1, 5)], rtol=1e-6)
  np.testing.assert_allclose(rule.overhead, 1e-6 / base, rtol=1e-6)
  np.testing.assert_allclose(rule.probe, rule.c_first + 1 + rule.overhead,
                             rtol=1e-6)
  # Bandwidth-bound: a wider verify pass reads the same weights, so it
  # costs little more than a 1-token pass, and never less.
  assert 1 <= rule.r[0] <= rule.r[-1] < 1.5
  assert rule.hysteresis == autotune.BATCHED_HYSTERESIS


def test_the_plan_follows_the_device():
  """The plan follows the device: where a pass is bound by its reads, a wide
  verify pass costs about one narrow pass, and a cheap draft pays for a wide
  round; where it is bound by compute, every token verified costs a pass,
  and no width beats autoregressive steps."""
  target, draft = _model(4), _model(1)
  reads = roofline.Device("reads fast", 1e15, 1e9, "a test")
  balanced = roofline.Device("balanced", 1e9, 1e15, "a test")
  plan = lambda d: autotune.roofline_goodput(
      target, draft, d, batch_size=1, gamma_max=8, prompt_len=16,
      max_new_tokens=32)
  compute_bound, memory_bound = plan(reads), plan(balanced)
  # Compute-bound, a pass on g + 1 tokens costs about g + 1 passes on one.
  assert compute_bound.r[-1] > 6 and memory_bound.r[-1] < 1.5
  best = lambda rule: rule.min_width + int(np.argmax(
      rule.expected_rate(np.array([0.8], np.float32))[0]))
  assert best(memory_bound) >= 3 and best(compute_bound) == 0  # 0: off


def test_auto_rule_with_a_device_times_nothing(monkeypatch):
  target, draft = _model(3), _model(1)
  monkeypatch.setattr(autotune, "measure_goodput", lambda *a, **k: (
      pytest.fail("auto_rule(device=...) must not time this machine")))
  prompts = np.zeros((2, 9), np.int32)
  lengths = np.array([9, 5], np.int32)
  rule = autotune.auto_rule(target, draft, prompts, lengths,
                            max_new_tokens=24, device="h100 sxm")
  assert rule == autotune.roofline_goodput(
      target, draft, roofline.ACCELERATORS["H100 SXM"], batch_size=2,
      gamma_max=autotune.AUTO_GAMMA_MAX, prompt_len=9, max_new_tokens=24,
      widths=autotune.doubling_widths(autotune.AUTO_GAMMA_MAX))


def test_drafts_without_an_analytic_count():
  target = _model(2, vocab_size=32)
  rng = np.random.default_rng(0)
  ngram = NGramLM.fit(rng.integers(0, 32, 500), 32, order=2)
  rule = autotune.roofline_goodput(target, ngram, "TPU v5e", batch_size=1,
                                   gamma_max=3)
  assert 1e-3 <= rule.c < 1
  target = _model(3)
  shared = sj.SelfDraft(target, layers=(0,), share_cache=True)
  rule = autotune.roofline_goodput(target, shared, "H200 SXM",
                                   batch_size=1, gamma_max=3)
  assert rule.c_first == rule.c and 0 < rule.c < 1


def test_bad_inputs_are_refused_by_name():
  target, draft = _model(2), _model(1)
  plan = lambda device, **kw: autotune.roofline_goodput(
      target, draft, device, batch_size=1, **kw)
  with pytest.raises(ValueError, match="H100 SXM"):
    plan("a100")
  with pytest.raises(ValueError, match="Device"):
    plan(3.35e12)
  with pytest.raises(ValueError, match="overhead_seconds"):
    plan("TPU v6e", overhead_seconds=-1.0)
  with pytest.raises(ValueError, match="gamma_max"):
    plan("TPU v6e", gamma_max=0)
  with pytest.raises(ValueError, match="vocab"):
    autotune.roofline_goodput(target, _model(1, vocab_size=300), "TPU v6e",
                              batch_size=1)
