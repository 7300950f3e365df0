r"""Sharded decoding: per-device memory, tokens/s and collectives, per mesh.

  python benchmarks/sharded.py --target=byte-85m-llama --draft=byte-3m-llama \
      --mesh=data:1,model:1 --mesh=data:2,model:4 --mesh=data:8,model:1 \
      --batch=8 --gamma=4 --max_new_tokens=128

For each `--mesh` (any number; default every device on `data`) one run:

* compiles the SAME decode program (`generate` and `speculative_generate`,
  one jit around a while_loop) with the models sharded by
  `specjax.sharding.RULES`, and reads its per-device memory from
  `compiled.memory_analysis()` (arguments, outputs, temporaries);
* reads the per-device parameter bytes from `addressable_shards`;
* counts the collectives in the compiled HLO of the whole program, and of
  the coupling alone on batch-sharded `[B, gamma+1, V]` probabilities with
  the vocabulary sharded on `model`;
* times whole calls (median of `--repeats`, after compilation) and reports
  tokens/s, and checks the tokens equal the first mesh's (same keys).

On CPU (8 fake devices: `XLA_FLAGS=--xla_force_host_platform_device_count=8`)
the numbers are for correctness only; run `benchmarks/gpu_run.sh` or this
script on a TPU or GPU host for real ones. `benchmarks/decode.py` can call
`run()` for its `--mesh`.
"""

from __future__ import annotations

import re
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

import specjax as sj
from specjax import coupling
from specjax import distributed
from specjax import sharding
from specjax.decode import loop as decode_loop

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "collective-permute")


def count_collectives(hlo_text: str) -> dict[str, int]:
  """Collective ops (async starts counted once) in compiled HLO text."""
  counts = {}
  for op in COLLECTIVES:
    pattern = re.compile(r"=\s*\S+\s+" + op + r"(-start)?\(")
    counts[op] = sum(1 for line in hlo_text.splitlines()
                     if pattern.search(line))
  return counts


def coupling_collectives(mesh, batch: int, gamma: int, vocab: int) -> dict:
  """Collectives XLA inserts for the coupling on sharded probabilities.

  p and q are float32 `[B, gamma, V]` with B on `data` and V on `model`
  (how the verify pass leaves them when the LM head is vocab-sharded).
  Returns op counts and the largest all-gathered shape.
  """
  def spec(*names):
    return NamedSharding(mesh, sharding.spec_for(
        (batch, gamma, vocab)[:len(names)], names, mesh))
  f = jax.jit(coupling._coupling,  # pylint: disable=protected-access
              in_shardings=(spec("batch", None), spec("batch", None),
                            spec("batch", None, "vocab"),
                            spec("batch", None, "vocab"),
                            spec("batch", None)))
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  text = f.lower(f32(batch, gamma), f32(batch, gamma),
                 f32(batch, gamma, vocab), f32(batch, gamma, vocab),
                 jax.ShapeDtypeStruct((batch, gamma), jnp.int32)
                 ).compile().as_text()
  gathered = re.findall(r"= (\S+) all-gather(?:-start)?\(", text)
  return {**count_collectives(text), "gathered": sorted(set(gathered))}


def _models(target_preset, draft_preset, dtype, param_dtype, max_positions,
            vocab_size=None):
  kw = dict(dtype=dtype, param_dtype=param_dtype, max_positions=max_positions)
  if vocab_size:
    kw["vocab_size"] = vocab_size
  target = sj.TransformerLM.create(
      sj.TransformerConfig.preset(target_preset, **kw), 0)
  draft = (None if draft_preset in (None, "none") else sj.TransformerLM.create(
      sj.TransformerConfig.preset(draft_preset, **kw), 1))
  return target, draft


def run(meshes, *, target_preset="byte-3m-llama", draft_preset="none",
        batch=8, gamma=4, max_new_tokens=64, prompt_len=32, repeats=3,
        temperature=0.0, dtype="float32", param_dtype="float32",
        vocab_size=None) -> list[dict]:
  """One row per mesh spec; see the module docstring."""
  max_positions = prompt_len + max_new_tokens + gamma + 16
  max_positions = max(decode_loop.prompt_bucket(prompt_len) + max_new_tokens
                      + gamma + 1, max_positions)
  target, draft = _models(target_preset, draft_preset, dtype, param_dtype,
                          max_positions, vocab_size)
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, target.vocab_size, (batch, prompt_len)).astype(
      np.int32)
  lengths = np.full(batch, prompt_len, np.int32)
  sampling = sj.SamplingConfig(temperature=temperature)
  rows, first_tokens = [], None
  for spec in meshes:
    mesh = sharding.make_mesh(spec)
    kwargs = dict(max_new_tokens=max_new_tokens, sampling=sampling, mesh=mesh)
    if draft is None:
      call = lambda kw=kwargs: sj.generate(target, prompts, lengths,
                                           jax.random.key(0), **kw)
    else:
      call = lambda kw=kwargs: sj.speculative_generate(
          target, draft, prompts, lengths, jax.random.key(0), gamma=gamma,
          **kw)
    # The compiled program the call runs, for its memory and HLO.
    padded, lens, keys, *_ = decode_loop._prepare(  # pylint: disable=protected-access
        target, prompts, lengths, jax.random.key(0),
        max_new_tokens=max_new_tokens, lookahead=gamma if draft else 0,
        sampling=sampling, eos_id=None, pad_id=0, models=())
    (t, d), (padded, lens, keys) = sharding.place_decode_inputs(
        mesh, (target, draft), (padded, lens, keys))
    with sharding.using(mesh):
      compiled = decode_loop._generate.lower(  # pylint: disable=protected-access
          t, d, padded, lens, keys, gamma=gamma if draft else 0,
          max_new_tokens=max_new_tokens, sampling=sampling, eos_id=None,
          pad_id=0).compile()
    mem = compiled.memory_analysis()
    out = call()
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      out = call()
      jax.block_until_ready(out)
      times.append(time.perf_counter() - start)
    tokens = np.asarray(out.tokens)
    first_tokens = tokens if first_tokens is None else first_tokens
    params = sharding.per_device_bytes(t.state) if hasattr(t, "state") else {}
    seconds = statistics.median(times)
    rows.append({
        "mesh": sharding.describe(mesh),
        "param_MB_per_device": max(params.values()) / 2**20 if params else 0,
        "args_MB": getattr(mem, "argument_size_in_bytes", 0) / 2**20,
        "temp_MB": getattr(mem, "temp_size_in_bytes", 0) / 2**20,
        "out_MB": getattr(mem, "output_size_in_bytes", 0) / 2**20,
        "tokens_per_s": int(np.asarray(out.lengths).sum()) / seconds,
        "seconds": seconds,
        "same_tokens": bool(np.array_equal(tokens, first_tokens)),
        "program_collectives": count_collectives(compiled.as_text()),
        "program_gathered": sorted(set(re.findall(
            r"= (\S+) all-gather(?:-start)?\(", compiled.as_text()))),
        "coupling_collectives": coupling_collectives(
            mesh, batch, max(gamma, 1), target.vocab_size),
    })
  return rows


def format_table(rows) -> str:
  head = ("| mesh | params MB/device | args MB | temp MB | tokens/s | "
          "same tokens | collectives (program) | coupling: gathers / "
          "reduces / permutes |")
  lines = [head, "|" + " --- |" * 8]
  for r in rows:
    pc, cc = r["program_collectives"], r["coupling_collectives"]
    lines.append(
        f"| {r['mesh']} | {r['param_MB_per_device']:.1f} | {r['args_MB']:.1f}"
        f" | {r['temp_MB']:.1f} | {r['tokens_per_s']:,.0f} | "
        f"{r['same_tokens']} | "
        + ", ".join(f"{k} {v}" for k, v in pc.items() if v) + " | "
        f"{cc['all-gather']} / {cc['all-reduce']} / "
        f"{cc['collective-permute']} {' '.join(cc['gathered'])} |")
  return "\n".join(lines)


_TARGET = flags.DEFINE_string("target", "byte-3m-llama",
                              "TransformerConfig preset of the target.")
_DRAFT = flags.DEFINE_string("draft", "none", "Preset of the draft, or none "
                             "(times generate).")
_MESH = flags.DEFINE_multi_string("mesh", None, "Mesh spec(s), e.g. "
                                  "data:2,model:4 (repeat the flag).")
_BATCH = flags.DEFINE_integer("batch", 8, "Rows.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per row.")
_PROMPT = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per mesh.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
_VOCAB = flags.DEFINE_integer("vocab_size", None, "Override the presets' "
                              "vocabulary (e.g. 256, so it divides `model`).")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Compute dtype.")
_PARAM_DTYPE = flags.DEFINE_string("param_dtype", "float32",
                                   "Parameter dtype.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.initialize_from_flags()
  meshes = _MESH.value or [f"data:{jax.device_count()},model:1"]
  rows = run(meshes, target_preset=_TARGET.value, draft_preset=_DRAFT.value,
             batch=_BATCH.value, gamma=_GAMMA.value,
             max_new_tokens=_NEW.value, prompt_len=_PROMPT.value,
             repeats=_REPEATS.value, temperature=_TEMP.value,
             dtype=_DTYPE.value, param_dtype=_PARAM_DTYPE.value,
             vocab_size=_VOCAB.value)
  if distributed.is_primary():
    print(f"{jax.device_count()} x {jax.devices()[0].device_kind}, target "
          f"{_TARGET.value}, draft {_DRAFT.value}, batch {_BATCH.value}, "
          f"gamma {_GAMMA.value}, {_NEW.value} new tokens, {_DTYPE.value}/"
          f"{_PARAM_DTYPE.value}")
    print(format_table(rows))
    for r in rows:
      print(f"{r['mesh']}: program all-gathers {r['program_gathered']}")


if __name__ == "__main__":
  # --mesh is this script's own (repeatable) flag; only the multi-process
  # flags come from specjax.distributed.
  if "distributed" not in flags.FLAGS:
    flags.DEFINE_bool("distributed", False, "Join a multi-process JAX job.")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
    flags.DEFINE_integer("num_processes", None, "Number of processes.")
    flags.DEFINE_integer("process_id", None, "This process's id.")
  app.run(main)
