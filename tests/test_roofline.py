"""The roofline's counts against XLA's, and no whole-cache copy per round."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.harness import roofline
from specjax.models import TransformerConfig
from specjax.models import TransformerLM

# Counts of the programs users run: optimized (the suite compiles at -O0
# otherwise) and with XLA:CPU's default code generator (the suite turns its
# fusion emitters off: tests/compile_settings.py).
pytestmark = pytest.mark.optimized
_AS_USERS_RUN = ({"xla_cpu_use_fusion_emitters": True}
                 if jax.default_backend() == "cpu" else None)


def _model(flavour, **overrides):
  config = dict(vocab_size=259, d_model=128, num_layers=2, num_heads=4,
                max_positions=256, flavour=flavour)
  if flavour == "llama":
    config["num_kv_heads"] = 2
  return TransformerLM.create(TransformerConfig(**{**config, **overrides}), 0)


@pytest.mark.parametrize("flavour", ["gpt2", "llama", "self"])
@pytest.mark.parametrize("batch, num_tokens", [(1, 1), (2, 3)])
def test_analytic_count_matches_xla_cost_analysis(flavour, batch, num_tokens):
  model = (sj.SelfDraft(_model("llama", num_layers=3), layers=(0, 2))
           if flavour == "self" else _model(flavour))
  shape = dict(batch_size=batch, num_tokens=num_tokens, capacity=192)
  xla = roofline.xla_pass_cost(model, **shape,
                               compiler_options=_AS_USERS_RUN)
  counted = roofline.pass_cost(model, **shape, xla_conventions=True)
  physical = roofline.pass_cost(model, **shape)
  np.testing.assert_allclose(counted.flops, xla.flops, rtol=0.05)
  assert physical.flops == counted.flops
  # XLA never counts less than what the pass must move.
  assert physical.bytes < counted.bytes <= xla.bytes * 1.01
  if (batch, num_tokens) == (1, 1):
    # A decode step: nothing else of size (a copy of this cache would add
    # a third), but XLA may charge a one-row gather its whole table.
    np.testing.assert_allclose(counted.bytes, xla.bytes, rtol=0.06)
  else:  # and activations, which grow with the tokens of the pass
    assert xla.bytes <= 1.4 * counted.bytes


def test_analytic_bytes_follow_the_cache_and_the_weights():
  model = _model("llama")  # untied: the input table is read at its rows
  c = model.config
  at = lambda **kw: roofline.pass_cost(
      model, **{"batch_size": 1, "num_tokens": 1, "capacity": 64, **kw})
  kv_slot = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
  # One more cache slot: one more slot read by every layer's attention.
  assert at(capacity=65).bytes - at().bytes == kv_slot
  # One more row reads its cache, writes its new slot and logits, and reads
  # its input embedding row, but not the weights again.
  assert at(batch_size=2).bytes - at().bytes == (
      64 * kv_slot + kv_slot + c.vocab_size * 4 + c.d_model * 4)
  weights = sum(x.nbytes for x in jax.tree.leaves(model.state))
  table = c.vocab_size * c.d_model * 4
  assert at().bytes == (weights - table + c.d_model * 4 + 65 * kv_slot
                        + c.vocab_size * 4)


@pytest.mark.parametrize("batch", [
    1, pytest.param(2, marks=pytest.mark.full)])  # batch 1 is the hard case
@pytest.mark.parametrize("verifier", [
    None, "token", pytest.param("block", marks=pytest.mark.full), "tree:2,1"])
def test_no_whole_cache_copy_in_the_loop(batch, verifier):
  """Counted in the optimized HLO of the compiled generation: no loop body
  copies a layer's whole key or value buffer (None: `generate`)."""
  target = _model("gpt2", num_layers=2)
  draft = None if verifier is None else _model("gpt2", num_layers=1)
  assert roofline.cache_copies_per_round(
      target, draft, batch_size=batch, prompt_len=16, max_new_tokens=16,
      gamma=3, verifier=verifier or "token",
      compiler_options=_AS_USERS_RUN) == 0


def test_loop_copies_sees_a_copy():
  """Negative control: a loop that XLA:CPU compiles with whole-buffer
  copies (a one-slot dynamic-update-slice read by a dot at batch 1)."""
  shape = (1, 2, 16, 8)

  def run(cache, q, new, n):
    def body(i, carry):
      cache, acc = carry
      cache = jax.lax.dynamic_update_slice_in_dim(cache, new, i % 16, axis=2)
      return cache, acc + jnp.einsum("bkth,bksh->bkts", q, cache).sum()
    return jax.lax.fori_loop(0, n, body, (cache, 0.0))

  args = (jnp.zeros(shape), jnp.ones((1, 2, 1, 8)), jnp.ones((1, 2, 1, 8)), 3)
  text = jax.jit(run).lower(*args).compile(_AS_USERS_RUN).as_text()
  if jax.default_backend() != "cpu":
    pytest.skip("the control's copies are XLA:CPU's")
  assert roofline.loop_copies(text, [shape]) > 0
  assert roofline.loop_copies(text, [(1, 2, 16, 9)]) == 0


def test_rounds_and_the_roofline():
  assert roofline.ar_step() == [("target", 1, 1)]
  assert roofline.chain_round(4) == [("draft", 2, 1), ("draft", 1, 3),
                                     ("target", 5, 1)]
  assert roofline.chain_round(1) == [("draft", 2, 1), ("target", 2, 1)]
  model = _model("gpt2")
  costs = roofline.round_cost(roofline.chain_round(2),
                              {"target": model, "draft": model},
                              batch_size=1, capacity=64)
  parts = [c for name, c in costs.items() if name != "round"]
  assert costs["round"].bytes == pytest.approx(sum(c.bytes for c in parts))
  device = roofline.Device("test", 1e9, 1e12, "a test")
  # Bandwidth-bound at batch 1: each pass takes its bytes / bandwidth.
  assert roofline.round_seconds(costs, device) == pytest.approx(
      sum(c.bytes for c in parts) / 1e9)
  for d in roofline.ACCELERATORS.values():
    assert d.source and d.bytes_per_s > 1e11 and d.flops_per_s > 1e13


def test_bad_inputs_are_refused_by_name():
  model = _model("gpt2")
  with pytest.raises(ValueError, match="capacity"):
    roofline.pass_cost(model, batch_size=1, num_tokens=4, capacity=2)
  with pytest.raises(ValueError, match="batch_size"):
    roofline.pass_cost(model, batch_size=0, num_tokens=1, capacity=8)
  with pytest.raises(TypeError, match="xla_pass_cost"):
    roofline.pass_cost(object(), batch_size=1, num_tokens=1, capacity=8)
  with pytest.raises(ValueError, match="gamma"):
    roofline.chain_round(0)
  with pytest.raises(TypeError, match="draft_length must be"):
    roofline.xla_round_cost(model, model, batch_size=1, prompt_len=8,
                            max_new_tokens=8, draft_length=3)
  with pytest.raises(ValueError, match="no draft-length rule"):
    roofline.xla_round_cost(model, None, batch_size=1, prompt_len=8,
                            max_new_tokens=8, width=2)
  with pytest.raises(ValueError, match="'draft' model"):
    roofline.round_cost(roofline.chain_round(2), {"target": model},
                        batch_size=1, capacity=8)
  with pytest.raises(ValueError, match="bytes_per_s"):
    roofline.Device("x", 0, 1.0, "")


@pytest.mark.full
def test_the_benchmark_runs_and_writes_its_results(tmp_path):
  subprocess.run(
      [sys.executable, "-m", "benchmarks.roofline", "--target=byte-3m",
       "--draft=truncated:1", "--prompt_len=8", "--max_new_tokens=8",
       "--repeats=1", "--read_mb=16", f"--results_dir={tmp_path}"],
      check=True, capture_output=True, text=True)
  (path,) = tmp_path.glob("roofline_*.json")
  result = json.loads(path.read_text())
  for name in ("generate", "speculative"):
    row = result["rows"][name]
    assert row["loop_body_cache_copies"] == 0
    assert 0 < row["fraction_of_roofline"] and row["tokens_per_s"] > 0
    assert set(row["predicted_tokens_per_s"]) == set(roofline.ACCELERATORS)
  assert {p["pass"] for p in result["passes"]} == {
      "target T=1", "draft T=2", "draft T=1", "target T=5"}
  assert len(result["rounds"]) == 6
  for r in result["rounds"]:  # (the suite's XLA flags reach the benchmark)
    assert 0.9 < r["xla_bytes"] / r["analytic_xla_bytes"] < 2
  parts = result["rows"]["speculative"]["time_parts"]
  assert [p["part"] for p in parts] == [
      "draft T=2", "draft T=1", "target T=5", "outside the passes"]
  assert set(result["auto_plans"]) == set(roofline.ACCELERATORS)
  assert set(result["row_product_fractions"]) == {"1", "2", "5"}


_ROUNDS = {
    "generate": dict(draft=False),
    "token": dict(gamma=3),
    "block": dict(gamma=3, verifier="block"),
    "tree": dict(verifier="tree-wor:2,2,1"),
    "traversal": dict(verifier="traversal:3,1"),
    "stopping rule": dict(draft_length=sj.Confidence(gamma_max=3,
                                                     threshold=0.5)),
    "planned rule": dict(draft_length=sj.Goodput(c=0.2, r=(1.0,) * 3,
                                                 gamma_max=3), width=2),
    "shared cache": dict(gamma=3, shared=True),
}


@pytest.mark.parametrize("shape", [
    s if s == "token" else pytest.param(s, marks=pytest.mark.full)
    for s in _ROUNDS])
def test_round_counts_for_every_loop_shape(shape):
  """XLA's count of the compiled round against its passes': the passes,
  counted as XLA counts them, are never more than XLA finds, the FLOPs
  agree, and what XLA finds beyond them (sampling and verification on the
  round's logits, the commit) grows with the vocabulary."""
  kw = dict(_ROUNDS[shape])
  with_draft, shared = kw.pop("draft", True), kw.pop("shared", False)
  gaps = {}
  for vocab in (259, 2048):
    target = _model("gpt2", vocab_size=vocab, num_layers=3)
    draft = None
    if with_draft:
      draft = (sj.SelfDraft(target, layers=(0,), share_cache=True) if shared
               else _model("gpt2", vocab_size=vocab, num_layers=1))
    counts = roofline.round_counts(
        target, draft, batch_size=1, prompt_len=16, max_new_tokens=16,
        compiler_options=_AS_USERS_RUN, **kw)
    xla, once = counts["xla"], counts["analytic_xla"]
    np.testing.assert_allclose(once.flops, xla.flops, rtol=0.15)
    assert once.bytes <= xla.bytes
    gaps[vocab] = xla.bytes - once.bytes
    if vocab == 259:  # the weights dominate the round
      assert xla.bytes <= 1.6 * once.bytes, counts
  assert gaps[2048] > gaps[259], gaps


def test_round_passes():
  draft = _model("gpt2", num_layers=1)
  assert roofline.round_passes(None) == [("target", 1, 1)]
  assert roofline.round_passes(draft, gamma=3) == roofline.chain_round(3)
  shared = sj.SelfDraft(_model("gpt2", num_layers=2), layers=(0,),
                        share_cache=True)
  assert roofline.round_passes(shared, gamma=2) == [
      ("draft", 1, 1), ("draft", 1, 1), ("target", 3, 1)]
  # 2,2,1: the root, then 2 nodes with children, then 4; 2 + 4 + 4 nodes.
  assert roofline.round_passes(draft, verifier="tree:2,2,1") == [
      ("draft", 2, 1), ("draft", 2, 1), ("draft", 4, 1), ("target", 11, 1)]
  rule = sj.Goodput(c=0.2, r=(1.0,) * 4, gamma_max=4)
  assert roofline.round_passes(draft, draft_length=rule, width=2) == (
      roofline.chain_round(2))
  assert roofline.as_xla_counts(roofline.chain_round(4)) == [
      ("draft", 2, 1), ("draft", 1, 1), ("target", 5, 1)]
  with pytest.raises(ValueError, match="width"):
    roofline.xla_round_cost(_model("gpt2"), draft, batch_size=1,
                            prompt_len=16, max_new_tokens=8, gamma=2,
                            width=1)


@pytest.mark.full
def test_the_decode_benchmark_prints_the_roofline_fractions():
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.decode", "--target=byte-3m",
       "--draft=truncated:1", "--batch=1", "--gamma=2", "--prompt_len=8",
       "--max_new_tokens=8", "--repeats=1", "--copy_mb=16"],
      check=True, capture_output=True, text=True)
  (line,) = [l for l in out.stdout.splitlines()
             if l.startswith("fraction of roofline")]
  assert "generate" in line and "speculative" in line and "GB/s" in line
