r"""Decoding against the physical limit: bytes, FLOPs and roofline fractions.

  python -m benchmarks.roofline --target=gpt2-124m --draft=self:2 \
      --batch=1 --gamma=4 --prompt_len=64 --max_new_tokens=128

One run, for one target, one draft, batch and gamma:

* the host: CPU model, read bandwidth (a jitted `jnp.sum` over
  `--read_mb` MB) and float32 matmul FLOP/s (a 2048^3 matmul), each timed
  interleaved with the decodes below, so that both see the same machine:
  this host's roofline device; and the fraction of that bandwidth its
  matrix products reach on 1, 2 and gamma + 1 rows
  (`roofline.rows_probe`), what a step's and a verify pass's products can
  reach;
* every pass of `generate`'s step and of a speculative round: the analytic
  bytes and FLOPs (`specjax.harness.roofline.pass_cost`; for a
  `TransformerLM` or a `SelfDraft`), the same count under XLA's
  conventions, and XLA's cost analysis of the compiled pass, with the gap
  between the last two;
* whole-buffer copies of the KV cache in the loop bodies of both compiled
  generations (`roofline.cache_copies_per_round`);
* `generate` and `speculative_generate` timed side by side (interleaved,
  the fastest of `--repeats`), tokens per target call, and each against its
  roofline on this host: prefills plus steps or rounds, each pass
  max(bytes / bandwidth, FLOPs / peak), from the analytic count (XLA's for
  a draft that has none: `roofline.has_analytic_count`);
* each loop shape's round (generate's step; token, block and tree-wor
  rounds; a stopping and a planned draft-length rule) counted three ways:
  its passes, the same passes as XLA counts them, and XLA's cost analysis
  of the compiled round (`roofline.round_counts`), with the gap;
* where a step's or round's time goes: each pass timed alone beside its
  roofline on this host, and the work outside the passes, against the
  measured round;
* the tokens/s the same counts predict on named accelerators
  (`roofline.ACCELERATORS`) with bfloat16 weights and cache, at the tokens
  per round measured here, and the draft length gamma="auto" would plan for
  each from its roofline (`autotune.roofline_goodput`). These are
  predictions, not measurements.

Weights are random (the roofline does not depend on them); the draft is a
spec of the draft registry (`specjax.harness.drafts`), `self:N` or
`truncated:N` for a random target. With `--results_dir`, writes
roofline_<target>_<draft>.json there.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import stats
from specjax.decode import loop
from specjax.harness import autotune
from specjax.harness import drafts
from specjax.harness import measure
from specjax.harness import roofline
from specjax.models import TransformerConfig
from specjax.models import TransformerLM

_TARGET = flags.DEFINE_string("target", "gpt2-124m", "Target preset name.")
_DRAFT = flags.DEFINE_string("draft", "self:2", "A draft spec of the registry.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows.", lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.",
                              lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.",
                                   lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per row.",
                                lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0,
                                  "Sampling temperature; 0 is greedy.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls of each.",
                                lower_bound=1)
_READ_MB = flags.DEFINE_integer("read_mb", 512,
                                "Array size of the bandwidth probe.",
                                lower_bound=16)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Compute and parameter dtype of both models.")
_TREE = flags.DEFINE_string(
    "tree", "2,1,1", "Branching of the tree round in the round-count table "
    "(tree-wor:<tree>).")
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", None,
    "Where roofline_<target>_<draft>.json goes (none: print only).")


def _distinct(passes):
  """`passes` with the entries of one (role, tokens) merged, their counts
  summed, in order: a draft on the target's cache reads one token in its
  first pass and in its steps, one pass to count and to time."""
  counts = {}
  for role, tokens, count in passes:
    counts[role, tokens] = counts.get((role, tokens), 0) + count
  return [(role, tokens, count) for (role, tokens), count in counts.items()]


def _table(models, passes, batch, capacity):
  """Rows of the per-pass table: analytic, under XLA's conventions, XLA."""
  rows = []
  for role, tokens, count in _distinct(passes):
    model = models[role]
    shape = dict(batch_size=batch, num_tokens=tokens, capacity=capacity)
    xla = roofline.xla_pass_cost(model, **shape)
    row = {"pass": f"{role} T={tokens}", "count": count,
           "xla_bytes": xla.bytes, "xla_flops": xla.flops}
    if roofline.has_analytic_count(model):
      physical = roofline.pass_cost(model, **shape)
      conventions = roofline.pass_cost(model, **shape, xla_conventions=True)
      row.update(analytic_bytes=physical.bytes, analytic_flops=physical.flops,
                 xla_conventions_bytes=conventions.bytes,
                 gap=xla.bytes / conventions.bytes - 1)
    rows.append(row)
  return rows


def _round_table(target, draft, *, batch, gamma, plen, new, sampling):
  """Rows of the round-count table: each loop shape's round counted three
  ways (`roofline.round_counts`), for a pair with analytic counts."""
  shapes = {
      "generate": dict(draft=None),
      f"token, gamma {gamma}": dict(gamma=gamma),
      f"block, gamma {gamma}": dict(gamma=gamma, verifier="block"),
      f"tree-wor:{_TREE.value}": dict(verifier=f"tree-wor:{_TREE.value}"),
      f"stopping rule, gamma_max {gamma}": dict(
          draft_length=sj.Confidence(gamma_max=gamma, threshold=0.5)),
      f"planned rule at width {gamma}": dict(
          draft_length=sj.Goodput(c=0.1, r=(1.0,) * gamma, gamma_max=gamma),
          width=gamma),
  }
  rows = []
  for name, kw in shapes.items():
    kw = {"draft": draft, **kw}
    counts = roofline.round_counts(
        target, kw.pop("draft"), batch_size=batch,
        prompt_len=loop.prompt_bucket(plen), max_new_tokens=new,
        sampling=sampling, **kw)
    rows.append({"round": name,
                 **{f"{k}_bytes": c.bytes for k, c in counts.items()},
                 **{f"{k}_flops": c.flops for k, c in counts.items()},
                 "gap": counts["xla"].bytes / counts["analytic_xla"].bytes - 1})
  return rows


def _time_parts(models, passes, *, batch, capacity, fill, shape, sampling,
                host, repeats):
  """Where a round's time goes: each distinct pass timed alone
  (`measure.passes_seconds`) beside its roofline on this host, and the
  round's work outside the passes (`measure.null_loop_seconds`)."""
  parts = []
  for role in ("draft", "target"):
    mine = [(t, n) for r, t, n in _distinct(passes) if r == role]
    if not mine:
      continue
    timed = measure.passes_seconds(
        models[role], batch_size=batch, capacity=capacity,
        passes=[(t, fill) for t, _ in mine], seconds=0.2, repeats=repeats)
    for (t, n), sec in zip(mine, timed):
      roof = host.seconds(roofline.count(
          models[role], batch_size=batch, num_tokens=t, capacity=capacity))
      parts.append({"part": f"{role} T={t}", "count": n, "seconds": sec,
                    "roofline_seconds": roof})
  outside, _ = measure.null_loop_seconds(
      models["target"], models.get("draft"), shape, sampling,
      repeats=repeats)
  parts.append({"part": "outside the passes", "count": 1,
                "seconds": outside, "roofline_seconds": 0.0})
  return parts


def _bf16(model):
  """`model` with bfloat16 weights and cache (the counts read dtypes)."""
  if isinstance(model, TransformerLM):
    return model.astype("bfloat16", "bfloat16")
  if isinstance(model, sj.SelfDraft):
    return model.replace(target=_bf16(model.target))
  return model


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  batch, gamma, plen, new = (_BATCH.value, _GAMMA.value, _PROMPT_LEN.value,
                             _MAX_NEW.value)
  sampling = (sj.GREEDY if _TEMPERATURE.value == 0 else
              sj.SamplingConfig(temperature=_TEMPERATURE.value))
  target = TransformerLM.create(TransformerConfig.preset(
      _TARGET.value, dtype=_DTYPE.value, param_dtype=_DTYPE.value), 0)
  made = drafts.make_draft(_DRAFT.value, target, seed=0)
  draft = made.model
  probes, host_device = roofline.host_probes(_READ_MB.value)
  # Matrix products on 1, 2 and gamma + 1 rows (GPT-2's block shapes),
  # timed with the rest: what a verify pass's products reach.
  row_counts = sorted({1, 2, gamma + 1})
  row_bytes = {}
  for rows in row_counts:
    probes[f"{rows}-row products"], row_bytes[rows] = roofline.rows_probe(rows)
  print(f"target {_TARGET.value} ({target.param_count() / 1e6:.1f}M params), "
        f"draft {made.description} ({made.params / 1e6:.1f}M params); batch "
        f"{batch}, gamma {gamma}, prompt {plen}, {new} new tokens, "
        f"temperature {sampling.temperature:g}; {_DTYPE.value}; "
        f"{jax.devices()[0].device_kind}")

  rng = np.random.default_rng(0)
  prompts = rng.integers(0, target.vocab_size, (batch, plen), dtype=np.int32)
  lengths = np.full((batch,), plen, np.int32)
  key = jax.random.key(0)
  capacity = measure.LoopShape(batch, plen, new, gamma).capacity(target)
  models = {"target": target, "draft": draft}
  ar_passes, spec_passes = roofline.ar_step(), roofline.round_passes(
      draft, gamma=gamma)

  print(f"\npasses at cache capacity {capacity} (MB read + written; "
        "'XLA conv.' counts the cache write as its whole buffer read and "
        "written, gathers as their whole tables, as XLA's cost analysis "
        "does):")
  print(f"  {'pass':14s} {'x':>3s} {'analytic':>10s} {'XLA conv.':>10s} "
        f"{'XLA':>10s} {'gap':>7s} {'GFLOP':>8s} {'XLA GFLOP':>10s}")
  table = _table(models, ar_passes + spec_passes, batch, capacity)
  for r in table:
    mb = lambda k: f"{r[k] / 1e6:10.2f}" if k in r else f"{'-':>10s}"
    gap = f"{r['gap']:+7.1%}" if "gap" in r else f"{'-':>7s}"
    flops = (f"{r['analytic_flops'] / 1e9:8.3f}" if "analytic_flops" in r
             else f"{'-':>8s}")
    print(f"  {r['pass']:14s} {r['count']:3d} {mb('analytic_bytes')} "
          f"{mb('xla_conventions_bytes')} {mb('xla_bytes')} {gap} {flops} "
          f"{r['xla_flops'] / 1e9:10.3f}")

  round_rows = []
  if all(roofline.has_analytic_count(m) for m in (target, draft)):
    print("\nrounds of the compiled loop (MB; 'analytic' counts every pass "
          "of the round, 'as XLA' counts them under XLA's conventions with "
          "a loop body once, as XLA does; 'gap' is XLA's count over that: "
          "the round's work outside its passes):")
    print(f"  {'round':34s} {'analytic':>9s} {'as XLA':>9s} {'XLA':>9s} "
          f"{'gap':>7s}")
    round_rows = _round_table(target, draft, batch=batch, gamma=gamma,
                              plen=plen, new=new, sampling=sampling)
    for r in round_rows:
      print(f"  {r['round']:34s} {r['analytic_bytes'] / 1e6:9.1f} "
            f"{r['analytic_xla_bytes'] / 1e6:9.1f} {r['xla_bytes'] / 1e6:9.1f} "
            f"{r['gap']:+7.1%}")

  ar = functools.partial(sj.generate, target, prompts, lengths, key,
                         max_new_tokens=new, sampling=sampling)
  spec = functools.partial(sj.speculative_generate, target, draft, prompts,
                           lengths, key, gamma=gamma, max_new_tokens=new,
                           sampling=sampling)
  outputs = {}
  times = measure.interleaved_times(
      {"generate": ar, "speculative": spec, **probes}, _REPEATS.value,
      outputs=outputs)
  host = host_device(times)
  summary = stats.summarize(outputs["speculative"])
  generated = batch * new
  copies = {
      "generate": roofline.cache_copies_per_round(
          target, batch_size=batch, prompt_len=loop.prompt_bucket(plen),
          max_new_tokens=new, sampling=sampling),
      "speculative": roofline.cache_copies_per_round(
          target, draft, batch_size=batch, prompt_len=loop.prompt_bucket(plen),
          max_new_tokens=new, gamma=gamma, sampling=sampling)}

  rows = {}
  for name, passes, rounds in (
      ("generate", ar_passes, new),
      ("speculative", spec_passes, summary["loop_rounds"])):
    speculative = name == "speculative"
    cost_models = models if speculative else {"target": target}
    shape = dict(batch_size=batch, capacity=capacity, prompt_len=plen)
    prefill, round_ = roofline.call_costs(passes, cost_models, **shape)
    predicted_s = roofline.call_seconds(prefill, round_, rounds, host)
    measured_s = min(times[name])
    bf16 = {role: _bf16(m) for role, m in cost_models.items()}
    prefill16, round16 = roofline.call_costs(passes, bf16, **shape)
    rows[name] = {
        "tokens_per_s": generated / measured_s,
        "roofline_tokens_per_s": generated / predicted_s,
        "fraction_of_roofline": predicted_s / measured_s,
        "rounds": rounds,
        "tokens_per_target_call": (generated / rounds if name == "generate"
                                   else summary["tokens_per_target_call"]),
        "round_bytes": round_["round"].bytes,
        "round_flops": round_["round"].flops,
        "loop_body_cache_copies": copies[name],
        "predicted_tokens_per_s": {
            d.name: generated / roofline.call_seconds(prefill16, round16,
                                                      rounds, d)
            for d in roofline.ACCELERATORS.values()},
    }

  print(f"\nhost: {roofline.cpu_model()}, {os.cpu_count()} CPUs; read bandwidth "
        f"{host.bytes_per_s / 1e9:.1f} GB/s; float32 matmul "
        f"{host.flops_per_s / 1e9:.0f} GFLOP/s ({host.source})")
  row_fractions = {
      rows: row_bytes[rows] / min(times[f"{rows}-row products"])
      / host.bytes_per_s for rows in row_counts}
  print("  matrix products, as a fraction of the read bandwidth (rows x "
        "[768, 3072] float32, 12 matrices): " + ", ".join(
            f"{rows} row{'s' * (rows > 1)} {f:.2f}"
            for rows, f in row_fractions.items()))
  print(f"  {'':12s} {'tokens/s':>9s} {'roofline':>9s} {'fraction':>9s} "
        f"{'tok/call':>9s} {'MB/round':>9s} {'copies':>7s}")
  for name, r in rows.items():
    print(f"  {name:12s} {r['tokens_per_s']:9.1f} "
          f"{r['roofline_tokens_per_s']:9.1f} "
          f"{r['fraction_of_roofline']:9.2f} "
          f"{r['tokens_per_target_call']:9.2f} {r['round_bytes'] / 1e6:9.1f} "
          f"{r['loop_body_cache_copies']:7d}")
  print(f"  speculative / generate: {rows['speculative']['tokens_per_s'] / rows['generate']['tokens_per_s']:.2f}x "
        f"measured, {rows['speculative']['roofline_tokens_per_s'] / rows['generate']['roofline_tokens_per_s']:.2f}x "
        "by the roofline")

  print("\nwhere a step's or round's time goes (ms): each pass timed alone "
        "(the difference of n and 2n passes in one call) beside its roofline "
        "on this host; the work outside the passes timed as the loop with "
        "null models; their sum against the measured step or round (the "
        "call's time over its rounds):")
  print(f"  {'':12s} {'part':20s} {'x':>3s} {'timed':>8s} {'roofline':>9s} "
        f"{'fraction':>9s}")
  for name, passes in (("generate", ar_passes), ("speculative", spec_passes)):
    speculative = name == "speculative"
    shape = measure.LoopShape(batch, plen, new, gamma if speculative else 0)
    parts = _time_parts(
        models if speculative else {"target": target}, passes, batch=batch,
        capacity=capacity, fill=shape.fill(target, gamma + 1), shape=shape,
        sampling=sampling, host=host, repeats=_REPEATS.value)
    for part in parts:
      fraction = (part["roofline_seconds"] / part["seconds"]
                  if part["seconds"] and part["roofline_seconds"] else None)
      print(f"  {name:12s} {part['part']:20s} {part['count']:3d} "
            f"{part['seconds'] * 1e3:8.3f} "
            f"{part['roofline_seconds'] * 1e3:9.3f} "
            + (f"{fraction:9.2f}" if fraction else f"{'-':>9s}"))
    total = sum(p["seconds"] * p["count"] for p in parts)
    measured = min(times[name]) / rows[name]["rounds"]
    print(f"  {name:12s} {'sum of the parts':20s} {'':3s} {total * 1e3:8.3f}"
          f"; measured {measured * 1e3:.3f} per step or round")
    rows[name]["time_parts"] = parts
    rows[name]["measured_seconds_per_round"] = measured

  # gamma="auto" planned for each accelerator from its roofline
  # (`autotune.roofline_goodput`), at the acceptance measured here.
  alpha = float(summary["alpha_hat"])
  plans = {}
  for d in roofline.ACCELERATORS.values():
    rule = autotune.roofline_goodput(
        _bf16(target), _bf16(draft), d, batch_size=batch, prompt_len=plen,
        max_new_tokens=new, gamma_max=autotune.AUTO_GAMMA_MAX)
    rate = np.asarray(rule.expected_rate(np.array([alpha], np.float32)))[0]
    plans[d.name] = {"c": rule.c, "r_max": rule.r[-1],
                     "width": rule.min_width + int(np.argmax(rate))}
  print("\npredicted tokens/s with bfloat16 weights and cache (a prediction "
        "from the counts above at the tokens per round measured here, not a "
        "measurement), and the draft length gamma=auto plans for the device "
        f"from its roofline at the acceptance measured here ({alpha:.3f}; "
        "c: a draft pass in target passes):")
  print(f"  {'device':10s} {'generate':>9s} {'speculative':>12s} "
        f"{'c':>6s} {'auto width':>11s}")
  for d in roofline.ACCELERATORS.values():
    print(f"  {d.name:10s} {rows['generate']['predicted_tokens_per_s'][d.name]:9.0f} "
          f"{rows['speculative']['predicted_tokens_per_s'][d.name]:12.0f} "
          f"{plans[d.name]['c']:6.3f} {plans[d.name]['width']:11d}")
  for d in roofline.ACCELERATORS.values():
    print(f"  {d.name}: {d.source}")

  if _RESULTS_DIR.value:
    os.makedirs(_RESULTS_DIR.value, exist_ok=True)
    path = os.path.join(_RESULTS_DIR.value,
                        f"roofline_{_TARGET.value}_{_DRAFT.value}.json"
                        .replace(":", "-"))
    with open(path, "w") as fh:
      json.dump({"command": "python -m benchmarks.roofline "
                            + " ".join(sys.argv[1:]),
                 "host": {"cpu": roofline.cpu_model(), "cpus": os.cpu_count(),
                          "read_bytes_per_s": host.bytes_per_s,
                          "matmul_flops_per_s": host.flops_per_s},
                 "target": _TARGET.value, "draft": made.description,
                 "batch": batch, "gamma": gamma, "prompt_len": plen,
                 "max_new_tokens": new, "capacity": capacity,
                 "temperature": sampling.temperature, "dtype": _DTYPE.value,
                 "device": jax.devices()[0].device_kind,
                 "passes": table, "rounds": round_rows, "rows": rows,
                 "alpha_hat": alpha, "auto_plans": plans,
                 "row_product_fractions": row_fractions,
                 "accelerators": {d.name: d.source for d in
                                  roofline.ACCELERATORS.values()}},
                fh, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
  app.run(main)
