r"""Decode speed: `generate` vs `speculative_generate`, measured and predicted.

  python -m benchmarks.decode --target=byte-85m --draft=truncated:0 \
      --batch=1 --gamma=4 --max_new_tokens=256 --prompt_len=64 --repeats=5

  # speedup against batch size, figure and JSON under results/batch_scaling:
  python -m benchmarks.decode --batches=1,2,4,8,16,32 --max_new_tokens=64

  # per mesh: per-device memory, tokens/s, collectives (any device count;
  # `bash benchmarks/gpu_run.sh` is the prepared GPU/TPU run):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
  python -m benchmarks.decode --target=byte-3m-llama --vocab_size=256 \
      --draft=truncated:1 --batch=8 --max_new_tokens=16 --prompt_len=16 \
      --repeats=2 --mesh=data:1,model:1 --mesh=data:2,model:4 \
      --mesh=data:8,model:1

One run measures, for one target, one draft, batch and gamma (after
compilation; the variants interleaved so that a loaded machine slows them
alike; every speed, time and ratio from the fastest of `--repeats` calls,
the `--mesh` table's tokens/s from their median):

* tokens/s of whole `generate` and `speculative_generate` calls;
* alpha (accepted / judged drafts) of the speculative run;
* every cost of both loops on their own shapes (`specjax.harness.measure.loop_costs`:
  the draft's 2-token window and 1-token steps, the verify pass, the target's
  autoregressive step, the prefills, each at the loop's cache capacity; the
  per-round work outside the passes and the fixed per-call cost from the
  same loops run with `NullLM`s), and c, r from them;
* the decode-only and end-to-end speedups `measure.predict` derives, beside
  the measured ones, and `measure.decompose`'s account of any gap (the
  draft's and verify's in-loop times from the same loop with a null draft);
* the rate at which autoregressive decoding streams the target's weights
  (param bytes * target steps/s) against the machine's memory copy bandwidth
  and against the fastest XLA reads those weights (a sum over them);
* each call as a fraction of its roofline on this host (`roofline.call_costs`
  priced at the read bandwidth and matmul FLOP/s probed beside the calls;
  `benchmarks.roofline` has the whole report).

With `--mesh` (repeatable), instead: for each mesh, `generate` and
`speculative_generate` compiled with the models sharded by
`specjax.sharding.RULES`, their per-device memory
(`compiled.memory_analysis()`), per-device parameter bytes, the collectives
of the compiled HLO, tokens/s, and whether the tokens equal the first mesh's
(`benchmarks/sharded.py`). On CPU the numbers are for correctness only. A
vocabulary is sharded on `model` only where `model` divides it:
`--vocab_size=256` makes the byte presets' 259 divisible.

With `--batches`, the same measurement at each batch size (without the
bandwidth rows and the null-draft split), then c(B), r(B), the measured and
predicted speedups and the batch at which speculation stops paying
(`accounting.crossover_batch`), written to `--results_dir` as
batch_scaling.json and fig_batch_scaling.{png,pdf}.

Drafts (`--draft`, a spec of the draft registry, `specjax.harness.drafts`),
for an untrained target:
  truncated:N      the target's embeddings, first N blocks, final norm and
                   head (truncated:0 of byte-85m is a 0.99M-parameter draft);
  perturbed:S      the whole target with Gaussian noise of S times each
                   weight array's RMS added (alpha near 1, but c near 1);
  random:D,L       an independent random model of the target's flavour with
                   width D and L layers;
  random:PRESET    an independent random model from `TransformerConfig`'s
                   presets;
  self:N, skip:I,J, prompt_lookup, ...: the registry's other kinds.
The table names the draft used. An untrained GPT-2 target (tied embeddings)
is near-uniform at temperature 1, but its argmax mostly repeats the current
token, as does any shallow draft's: greedy, truncated:0 of byte-85m agrees
with it ~95% of the time (and ~2% at temperature 1, where truncated:1 gets
~70%). `--target_logit_scale` multiplies the target's final-norm scale (so
its logits) to make it peakier or flatter.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import specjax as sj
from specjax import distributed
from specjax import stats
from specjax.harness import drafts
from specjax.harness import figures
from specjax.harness import measure
from specjax.harness import roofline
from specjax.models import TransformerConfig
from specjax.models import TransformerLM
from benchmarks import sharded

_TARGET = flags.DEFINE_string("target", "byte-85m", "Target preset name.")
_DRAFT = flags.DEFINE_string(
    "draft", "truncated:0",
    "A draft spec (specjax.harness.drafts): 'truncated:N', 'perturbed:S', "
    "'random:D,L', 'random:<preset>', 'self:N', ...")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows decoded together.",
                              lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.",
                              lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Tokens per row.",
                                lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.",
                                   lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per variant.",
                                lower_bound=1)
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.0, "Sampling temperature; 0 is greedy.")
_LOGIT_SCALE = flags.DEFINE_float(
    "target_logit_scale", 1.0, "Multiplies the target's final-norm scale.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights, prompts and keys.")
_LOOP_SECONDS = flags.DEFINE_float(
    "loop_seconds", 0.5, "Duration of the timed loops of forward passes that "
    "give c and r (each is also run at twice the length; the difference is "
    "what is timed).")
_BATCHES = flags.DEFINE_list(
    "batches", None, "Batch sizes for the batch-scaling mode, e.g. "
    "1,2,4,8,16,32 (default: one run at --batch).")
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", "results/batch_scaling", "Where --batches writes.")
_MERGE = flags.DEFINE_bool(
    "merge", False, "Keep the rows of batch_scaling.json already in "
    "--results_dir for batch sizes this run does not measure (to add a size "
    "without rerunning the others); the commands of both runs are recorded.")
_COPY_MB = flags.DEFINE_integer(
    "copy_mb", 512, "Array size for the memory bandwidth measurement.")
_MESH = flags.DEFINE_multi_string(
    "mesh", None, "Mesh spec, e.g. data:2,model:4; repeat the flag for a "
    "table over several meshes (see the module docstring).")
_VOCAB = flags.DEFINE_integer(
    "vocab_size", None, "Override the target preset's vocabulary (e.g. 256, "
    "so that it divides a `model` axis).")
distributed.define_flags(mesh=False)
distributed.define_dtype_flags(default="float32")


# ----------------------------------------------------------------- timing --


def _copy_calls(megabytes: int) -> tuple[dict[str, Callable[[], Any]], int]:
  """Calls that each copy `megabytes`, and the bytes one moves (read + write).

  numpy copies on one thread into a preallocated array; XLA's elementwise
  `x + 1` runs on all threads and, donated, writes into the buffer it reads
  (no fresh pages to fault in).
  """
  n = megabytes * 2**20 // 4
  src = np.ones(n, np.float32)
  dst = np.empty_like(src)
  xla_copy = jax.jit(lambda x: x + 1.0, donate_argnums=0)
  box = [jnp.ones(n, jnp.float32)]

  def xla():
    box[0] = xla_copy(box[0])
    return box[0]

  calls = {"copy numpy": lambda: np.copyto(dst, src), "copy XLA": xla}
  return calls, 2 * src.nbytes


# ------------------------------------------------------------------- main --


def _models():
  overrides = distributed.dtypes_from_flags()
  if _VOCAB.value:
    overrides["vocab_size"] = _VOCAB.value
  target = TransformerLM.create(
      TransformerConfig.preset(_TARGET.value, **overrides), _SEED.value)
  if _LOGIT_SCALE.value != 1.0:
    scale = _LOGIT_SCALE.value
    module = target.module()
    norm_scale = module.final_norm.scale
    norm_scale.set_value(norm_scale.get_value() * scale)
    target = TransformerLM.from_module(module)
  draft = drafts.make_draft(_DRAFT.value, target, seed=_SEED.value)
  return target, draft.model, (f"{draft.description}, "
                               f"{draft.params / 1e6:.2f}M params")


def measure_batch(target, draft, batch: int, sampling, *, memo: dict,
                  split_round: bool, extra: dict | None = None):
  """One configuration: costs, interleaved timed calls, `measure.compare`.

  Returns (row, times of every call in `extra` too, speculative result).
  """
  gamma, new, plen = _GAMMA.value, _MAX_NEW.value, _PROMPT_LEN.value
  rng = np.random.default_rng(_SEED.value)
  prompts = rng.integers(0, 256, size=(batch, plen), dtype=np.int32)
  lengths = np.full((batch,), plen, np.int32)
  key = jax.random.key(_SEED.value)
  costs = measure.loop_costs(
      target, draft, batch_size=batch, prompt_len=plen, max_new_tokens=new,
      gamma=gamma, sampling=sampling, seconds=_LOOP_SECONDS.value,
      repeats=_REPEATS.value, memo=memo)
  ar = functools.partial(sj.generate, target, prompts, lengths, key,
                         max_new_tokens=new, sampling=sampling)
  spec = functools.partial(sj.speculative_generate, target, draft, prompts,
                           lengths, key, gamma=gamma, max_new_tokens=new,
                           sampling=sampling)
  times = measure.interleaved_times(
      {"generate": ar, "speculative": spec, **(extra or {})}, _REPEATS.value)
  ar_out, spec_out = ar(), spec()
  if sampling.greedy:  # a cheap end-to-end check of exactness
    np.testing.assert_array_equal(ar_out.tokens, spec_out.tokens)
  null_round = None
  if split_round:
    null_round = measure.null_draft_round_seconds(
        target, draft, measure.LoopShape(batch, plen, new, gamma), sampling,
        prompts_BxP=prompts, prompt_lengths_B=lengths, key=key, costs=costs,
        repeats=_REPEATS.value, memo=memo)
  row = measure.compare(costs, [ar_out], times["generate"], [spec_out],
                        times["speculative"], null_round)
  row["batch_size"] = batch
  return row, times, spec_out


def _ms(x):
  return f"{x * 1e3:.3f} ms" if abs(x) < 1e-2 else f"{x * 1e3:.2f} ms"


def _print(rows):
  key_width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f"{k:<{key_width}}  {v}" if k else "")


def single(target, draft, draft_desc, sampling):
  """One batch size, the full table (the default mode)."""
  batch, gamma, new = _BATCH.value, _GAMMA.value, _MAX_NEW.value
  copy_fns, copy_bytes = _copy_calls(_COPY_MB.value)
  # The fastest XLA reads the target's weights: a sum over every array.
  params = jax.tree.leaves(target.state)
  read_all = jax.jit(lambda leaves: sum(jnp.sum(x) for x in leaves))
  probes, host_device = roofline.host_probes(_COPY_MB.value)
  extra = {**copy_fns, "read weights": lambda: read_all(params), **probes}
  load_before = os.getloadavg()[0]
  row, times, spec_out = measure_batch(target, draft, batch, sampling,
                                       memo={}, split_round=True, extra=extra)
  load_after = os.getloadavg()[0]
  # The fastest call of each, as measure.compare takes it for the speeds
  # and speedups: the per-call times and bandwidths printed beside them
  # must be the same calls' (see specjax.harness.measure, "Noise").
  t = {k: min(v) for k, v in times.items()}
  s = stats.summarize(spec_out)
  param_bytes = sum(x.nbytes for x in params)
  ar_step_s = row["measured_ar_round_s"]
  stream = param_bytes / ar_step_s
  read_bw = param_bytes / t["read weights"]
  bandwidth = {k: copy_bytes / t[f"copy {k}"] for k in ("numpy", "XLA")}
  copy_bw = max(bandwidth.values())
  cap = measure.LoopShape(batch, _PROMPT_LEN.value, new, gamma).capacity(target)
  # Each call against its roofline on this host: prefills plus steps or
  # rounds, every pass at max(bytes / read bandwidth, FLOPs / peak).
  host = host_device(times)
  fraction = {}
  for name, models, passes, rounds in (
      ("generate", {"target": target}, roofline.ar_step(), new),
      ("speculative", {"target": target, "draft": draft},
       roofline.round_passes(draft, gamma=gamma), s["loop_rounds"])):
    prefill, round_ = roofline.call_costs(passes, models, batch_size=batch,
                                          capacity=cap,
                                          prompt_len=_PROMPT_LEN.value)
    fraction[name] = roofline.call_seconds(prefill, round_, rounds,
                                           host) / t[name]
  factors = ", ".join(f"{k} {row[f'factor_{k}']:.3f}"
                      for k in ("acceptance", "draft", "verify", "baseline"))
  _print([
      ("target", f"{_TARGET.value}: {target.param_count() / 1e6:.2f}M params"
       + ("" if _LOGIT_SCALE.value == 1 else
          f", final-norm scale x{_LOGIT_SCALE.value:g}")),
      ("draft", draft_desc),
      ("setup", f"batch {batch}, gamma {gamma}, prompt {_PROMPT_LEN.value}, "
                f"max_new_tokens {new}, temperature {sampling.temperature:g}"
                f"{' (greedy)' if sampling.greedy else ''}, cache {cap} slots"),
      ("machine", f"{os.cpu_count()} CPUs ({jax.devices()[0].platform}), "
                  f"load average {load_before:.1f} -> {load_after:.1f} "
                  "(shared with other jobs: timings are noisy); the fastest "
                  f"of {_REPEATS.value} interleaved runs"),
      ("", ""),
      ("generate", f"{row['ar_tokens_per_s']:9.1f} tokens/s  "
                   f"({t['generate'] * 1e3:.0f} ms per call)"),
      ("speculative_generate",
       f"{row['spec_tokens_per_s']:9.1f} tokens/s  ({t['speculative'] * 1e3:.0f}"
       f" ms per call, {s['loop_rounds']} rounds)"),
      ("alpha (measured)",
       f"{row['alpha_hat']:.3f}  (1 - TV {row['one_minus_tv']:.3f}; "
       f"{row['tokens_per_target_call']:.2f} tokens per target call, formula "
       f"{row['predicted_tokens_per_target_call']:.2f} with the last round "
       f"cut at the budget, {row['formula_tokens_per_target_call']:.2f} "
       "without)"),
      ("", ""),
      ("part", "predicted (timed alone)   measured (in the loop)"),
      ("draft window T=2", _ms(row["draft_window_s"])),
      (f"draft steps {gamma - 1} x T=1", _ms((gamma - 1) * row["draft_step_s"])),
      ("draft, per round", f"{_ms(row['predicted_draft_s'])}   "
                           f"{_ms(row['measured_draft_s'])}"),
      (f"verify T={gamma + 1}", f"{_ms(row['predicted_verify_s'])}   "
                                f"{_ms(row['measured_verify_s'])}"),
      ("other, per round", f"{_ms(row['other_s'])}  (null loops)"),
      ("round", f"{_ms(row['predicted_round_s'])}   "
                f"{_ms(row['measured_round_s'])}"),
      ("loop rounds", f"{row['predicted_loop_rounds']:.1f}   "
                      f"{row['measured_loop_rounds']:.1f}"),
      ("AR step (T=1 + other)", f"{_ms(row['predicted_ar_round_s'])}   "
                                f"{_ms(row['measured_ar_round_s'])}"),
      ("prefills target / draft", f"{_ms(row['target_prefill_s'])} / "
                                  f"{_ms(row['draft_prefill_s'])}; AR "
                                  f"{_ms(row['ar_prefill_s'])}"),
      ("fixed cost per call", f"{_ms(row['call_s'])} (AR {_ms(row['ar_call_s'])})"),
      ("c = draft / target", f"{row['c']:.4f}"),
      (f"r = T={gamma + 1} / T=1", f"{row['r']:.3f}"),
      ("", ""),
      ("decode speedup", f"{row['decode_speedup']:.2f}x measured, "
                         f"{row['predicted_decode_speedup']:.2f}x predicted: "
                         f"efficiency {row['decode_efficiency']:.3f}"),
      ("end-to-end speedup", f"{row['speedup']:.2f}x measured, "
                             f"{row['predicted_speedup']:.2f}x predicted: "
                             f"efficiency {row['efficiency']:.3f}"),
      ("factors", factors + (f"; off: {row['off']}" if row["off"] else
                             "; every part within 10%")),
      ("", ""),
      ("copy bandwidth", f"{copy_bw / 1e9:.1f} GB/s read+write, best of numpy "
                         f"{bandwidth['numpy'] / 1e9:.1f} and XLA "
                         f"{bandwidth['XLA'] / 1e9:.1f} ({_COPY_MB.value} MB "
                         "arrays)"),
      ("target weight stream", f"{stream / 1e9:.1f} GB/s = "
                               f"{param_bytes / 1e6:.0f} MB x "
                               f"{1 / ar_step_s:.1f} AR steps/s: "
                               f"{stream / copy_bw:.0%} of read+write, "
                               f"{2 * stream / copy_bw:.0%} of bytes copied/s"),
      ("weight read bandwidth", f"{read_bw / 1e9:.1f} GB/s (XLA sum over the "
                                "target's params); the stream is "
                                f"{stream / read_bw:.0%} of it"),
      ("fraction of roofline", f"generate {fraction['generate']:.2f}, "
                               f"speculative {fraction['speculative']:.2f} "
                               f"(host: {roofline.cpu_model()}, read "
                               f"{host.bytes_per_s / 1e9:.1f} GB/s, matmul "
                               f"{host.flops_per_s / 1e9:.0f} GFLOP/s; "
                               "benchmarks.roofline has the whole report)"),
  ])


def scaling(target, draft, draft_desc, sampling, batches):
  """Speedup against batch size: a table, JSON and a figure.

  The files are rewritten after every batch size, so an interrupted run
  leaves what it measured.
  """
  memo: dict = {}
  rows = []
  load_before = os.getloadavg()[0]
  for batch in batches:
    row, _, _ = measure_batch(target, draft, batch, sampling, memo=memo,
                              split_round=False)
    rows.append(row)
    print(f"batch {batch:3d}: alpha {row['alpha_hat']:.3f}  c {row['c']:.4f}"
          f"  r {row['r']:.3f}  AR step {_ms(row['measured_ar_round_s'])}  "
          f"decode speedup {row['decode_speedup']:.2f}x (predicted "
          f"{row['predicted_decode_speedup']:.2f}x)  end to end "
          f"{row['speedup']:.2f}x (predicted {row['predicted_speedup']:.2f}x)",
          flush=True)
    _write_scaling(rows, target, draft_desc, sampling, load_before)


def _write_scaling(rows, target, draft_desc, sampling, load_before):
  path = os.path.join(_RESULTS_DIR.value, "batch_scaling.json")
  earlier = []
  if _MERGE.value and os.path.exists(path):
    with open(path) as fh:
      old = json.load(fh)
    new_sizes = {r["batch_size"] for r in rows}
    kept = [r for r in old["rows"] if r["batch_size"] not in new_sizes]
    rows = sorted(kept + rows, key=lambda r: r["batch_size"])
    earlier = old["metadata"].get("earlier_commands", []) + [
        old["metadata"]["command"]]
  b = [r["batch_size"] for r in rows]
  measured = sj.crossover_batch(b, [r["decode_speedup"] for r in rows])
  predicted = sj.crossover_batch(b, [r["predicted_decode_speedup"]
                                     for r in rows])
  say = lambda x: ("beyond the grid" if x is None else f"B = {x:.1f}")
  print(f"speculation stops paying (decode only, batches {b}): measured "
        f"{say(measured)}, predicted {say(predicted)}", flush=True)
  meta = {
      "target": _TARGET.value, "target_params": target.param_count(),
      "draft": draft_desc, "gamma": _GAMMA.value,
      "max_new_tokens": _MAX_NEW.value, "prompt_len": _PROMPT_LEN.value,
      "temperature": sampling.temperature, "repeats": _REPEATS.value,
      "loop_seconds": _LOOP_SECONDS.value,
      "device": f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs",
      "load_average": [load_before, os.getloadavg()[0]],
      "crossover_measured": measured, "crossover_predicted": predicted,
      "command": "python -m benchmarks.decode " + " ".join(sys.argv[1:]),
  }
  if earlier:  # --merge: the runs that measured the kept rows
    meta["earlier_commands"] = earlier
  os.makedirs(_RESULTS_DIR.value, exist_ok=True)
  with open(path, "w") as fh:
    json.dump({"metadata": meta, "rows": rows}, fh, indent=1)
  figures.plot_batch_scaling(
      rows, os.path.join(_RESULTS_DIR.value, "fig_batch_scaling"), meta)


def meshes(target, draft, draft_desc, sampling):
  """The per-mesh table (`--mesh`), printed by process 0."""
  rows = sharded.run(_MESH.value, target, draft, batch=_BATCH.value,
                     gamma=_GAMMA.value, max_new_tokens=_MAX_NEW.value,
                     prompt_len=_PROMPT_LEN.value, repeats=_REPEATS.value,
                     sampling=sampling, seed=_SEED.value)
  if not distributed.is_primary():
    return
  c = target.config
  print(f"{jax.device_count()} x {jax.devices()[0].device_kind} "
        f"({jax.process_count()} processes); target {_TARGET.value} "
        f"({target.param_count() / 1e6:.2f}M params, vocab {c.vocab_size}, "
        f"{c.dtype} compute / {c.param_dtype} params); draft {draft_desc}; "
        f"batch {_BATCH.value}, gamma {_GAMMA.value}, prompt "
        f"{_PROMPT_LEN.value}, {_MAX_NEW.value} new tokens, temperature "
        f"{sampling.temperature:g}; medians of {_REPEATS.value} calls")
  print(sharded.format_table(rows))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.initialize_from_flags()
  sampling = (sj.GREEDY if _TEMPERATURE.value == 0 else
              sj.SamplingConfig(temperature=_TEMPERATURE.value))
  target, draft, draft_desc = _models()
  if _MESH.value:
    if _BATCHES.value:
      raise app.UsageError("--mesh and --batches are separate modes.")
    meshes(target, draft, draft_desc, sampling)
  elif _BATCHES.value:
    batches = sorted({int(b) for b in _BATCHES.value})
    if batches[0] < 1:
      raise app.UsageError("--batches must be positive integers.")
    scaling(target, draft, draft_desc, sampling, batches)
  else:
    single(target, draft, draft_desc, sampling)


if __name__ == "__main__":
  app.run(main)
