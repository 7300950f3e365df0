"""Sharded decoding per mesh: the table `python -m benchmarks.decode --mesh=...`
prints.

For each mesh spec and each program (`generate`, and `speculative_generate`
when there is a draft), one row:

* per-device memory of the compiled program (one jit around the
  while_loop), from `compiled.memory_analysis()`: arguments, outputs,
  temporaries;
* per-device parameter bytes (target + draft), from `addressable_shards`;
* the collectives in the compiled HLO (`specjax.sharding.collective_summary`:
  counts, bytes per device, the largest all-gather), each listed once even
  inside the loop body;
* tokens/s of whole calls of the compiled program (median of `repeats`;
  host-side validation and placement excluded), and whether the tokens
  equal the first mesh's (same keys).

On CPU (fake devices: `XLA_FLAGS=--xla_force_host_platform_device_count=8`)
the numbers are for correctness only; `bash benchmarks/gpu_run.sh` runs the
table on a GPU or TPU host. A library for `decode.py`, not an entry point.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

import specjax as sj
from specjax import sharding
from specjax.decode import loop as decode_loop


def _compiled(target, draft, prompts, lengths, key, mesh, *, gamma,
              max_new_tokens, sampling):
  """The program a `mesh=` call runs, compiled, and its placed arguments.

  The same `_prepare` and placement as `generate` / `speculative_generate`
  with `mesh=`; calling the executable on the arguments is the call minus
  its host-side validation (and compiles once, for the memory and HLO too).
  """
  padded, lens, keys, *_ = decode_loop._prepare(  # pylint: disable=protected-access
      target, prompts, lengths, key, max_new_tokens=max_new_tokens,
      lookahead=gamma, sampling=sampling, eos_id=None, pad_id=0,
      models=(("target", target), ("draft", draft)))
  (t, d), (padded, lens, keys) = sharding.place_decode_inputs(
      mesh, (target, draft), (padded, lens, keys))
  with sharding.using(mesh):
    compiled = decode_loop._generate.lower(  # pylint: disable=protected-access
        t, d, padded, lens, keys, gamma=gamma, max_new_tokens=max_new_tokens,
        sampling=sampling, eos_id=None, pad_id=0).compile()
  return compiled, (t, d, padded, lens, keys)


def _param_bytes(mesh, models) -> int:
  """The largest per-device parameter bytes of `models` placed on `mesh`."""
  total: dict = {}
  for model in models:
    if model is None or not hasattr(model, "state"):
      continue
    placed = sharding.shard_model(model, mesh)
    for device, n in sharding.per_device_bytes(placed.state).items():
      total[device] = total.get(device, 0) + n
  return max(total.values(), default=0)


def run(meshes, target, draft, *, batch: int, gamma: int, max_new_tokens: int,
        prompt_len: int, repeats: int, sampling: sj.SamplingConfig,
        seed: int = 0) -> list[dict]:
  """One row per (mesh spec, program); see the module docstring."""
  rng = np.random.default_rng(seed)
  prompts = rng.integers(0, target.vocab_size, (batch, prompt_len)).astype(
      np.int32)
  lengths = np.full(batch, prompt_len, np.int32)
  key = jax.random.key(seed)
  programs = {"generate": (None, 0)}
  if draft is not None:
    programs["speculative"] = (draft, gamma)
  rows, first = [], {}
  for spec in meshes:
    mesh = sharding.make_mesh(spec)
    for name, (d, g) in programs.items():
      compiled, args = _compiled(target, d, prompts, lengths, key, mesh,
                                 gamma=g, max_new_tokens=max_new_tokens,
                                 sampling=sampling)
      mem = compiled.memory_analysis()
      hlo = compiled.as_text()
      out = jax.block_until_ready(compiled(*args))
      times = []
      for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
      tokens = np.asarray(out.tokens)
      first.setdefault(name, tokens)
      seconds = statistics.median(times)
      mb = lambda field: getattr(mem, field, 0) / 2**20
      rows.append({
          "mesh": sharding.describe(mesh), "program": name,
          "param_MB_per_device": _param_bytes(mesh, (target, d)) / 2**20,
          "args_MB": mb("argument_size_in_bytes"),
          "temp_MB": mb("temp_size_in_bytes"),
          "out_MB": mb("output_size_in_bytes"),
          "tokens_per_s": int(np.asarray(out.lengths).sum()) / seconds,
          "seconds": seconds,
          "same_tokens": bool(np.array_equal(tokens, first[name])),
          "collectives": sharding.collective_summary(hlo),
      })
  return rows


def format_table(rows) -> str:
  """A markdown table of `run`'s rows."""
  lines = ["| mesh | program | params MB/device | args MB | temp MB | "
           "tokens/s | same tokens | collectives: count (KiB/device) | "
           "largest all-gather |",
           "|" + " --- |" * 9]
  for r in rows:
    c = r["collectives"]
    ops = ", ".join(f"{op} {s['count']} ({s['bytes'] / 1024:.1f})"
                    for op, s in c.items() if s["count"]) or "none"
    lines.append(
        f"| {r['mesh']} | {r['program']} | {r['param_MB_per_device']:.1f} | "
        f"{r['args_MB']:.1f} | {r['temp_MB']:.1f} | "
        f"{r['tokens_per_s']:,.0f} | {r['same_tokens']} | {ops} | "
        f"{c['all-gather']['largest']:,} B |")
  return "\n".join(lines)
