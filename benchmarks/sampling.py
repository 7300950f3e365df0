r"""The sampling transform at real vocabulary sizes: sort-free vs sort-based.

  python -m benchmarks.sampling                 # the whole report
  python -m benchmarks.sampling --vocabs=50257 --rows=5 --parts=table

Three parts, each timing the current code (`new`) and the sort-based
definition it replaced (`old`, specjax/lab/sampling_reference.py: `jnp.sort` for
top-p, a `lax.top_k` whose k-th value is sliced out for top-k, a residual
and its CDF at every verified position) side by side in one run, the two
interleaved so that a loaded machine slows them alike. Every number is the
median of `--repeats` timed calls after compilation, in milliseconds, but
for the old transform's (`--old_repeats`, interleaved with the new one's
first calls) and `generate`'s (two alternating blocks of `--repeats` // 2
calls per variant, as the table's header says).

* table: jitted `specjax.sampling.probabilities` on logits `[1, rows, V]`
  for each sampling config x V x rows, beside one forward pass of a
  GPT-2-124M-shaped `TransformerLM` (random weights, that V) on `[1, rows]`
  tokens at cache length `--cache_len`: the model the transform serves.
* generate: `specjax.generate` tokens/s at GPT-2-124M shapes (V = 50,257),
  batch 1, greedy vs T = 1, top_p = 0.9 (new and old transform).
* round: the sampling + coupling share of one speculative round (batch 1,
  gamma = `--gamma`): the target's forward on gamma + 1 tokens, the verify
  step's work after the logits (transform, accept/reject, residual or bonus
  draw), and the draft side's gamma transforms + draws on `[1, V]` (the
  draft's own forward is left out: it depends on the draft).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import specjax as sj
from specjax import coupling
from specjax import sampling as sampling_lib
from specjax.decode import loop as decode_loop
from specjax.decode import steps
from specjax.lab import sampling_reference as reference  # the old definition
from specjax.models import TransformerConfig
from specjax.models import TransformerLM

_VOCABS = flags.DEFINE_list("vocabs", ["259", "50257", "152064"],
                            "Vocabulary sizes of the table and the round.")
_ROWS = flags.DEFINE_list("rows", ["1", "5", "40"],
                          "Rows of logits (positions scored) in the table.")
_PARTS = flags.DEFINE_list("parts", ["table", "generate", "round"],
                           "Which parts to run.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed calls per measurement.")
_OLD_REPEATS = flags.DEFINE_integer(
    "old_repeats", 3, "Timed calls of the old (slow) transform.")
_CACHE_LEN = flags.DEFINE_integer("cache_len", 128,
                                  "KV cache length of the timed forwards.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 32,
                                   "Tokens per `generate` call.")

CONFIGS = {
    "greedy": sj.SamplingConfig(temperature=0.0),
    "T=1": sj.SamplingConfig(temperature=1.0),
    "T=0.8 top_p=0.9": sj.SamplingConfig(temperature=0.8, top_p=0.9),
    "T=0.8 top_k=50": sj.SamplingConfig(temperature=0.8, top_k=50),
}


def _time_ms(fns: dict[str, tuple[Callable[[], Any], int]]) -> dict[str, float]:
  """Median wall time (ms) of each no-argument call, interleaved."""
  for fn, _ in fns.values():
    jax.block_until_ready(fn())  # compile
  times = {name: [] for name in fns}
  for i in range(max(n for _, n in fns.values())):
    for name, (fn, n) in fns.items():
      if i < n:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times[name].append(time.perf_counter() - start)
  return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


@functools.lru_cache(maxsize=None)
def _model(vocab: int) -> TransformerLM:
  return TransformerLM.create(
      TransformerConfig.preset("gpt2-124m", vocab_size=vocab), 0)


def _forward_fn(vocab: int, rows: int) -> Callable[[], Any]:
  model = _model(vocab)
  cache = model.init_cache(1, _CACHE_LEN.value + rows)
  cache = cache.replace(lengths=jnp.full((1,), _CACHE_LEN.value, jnp.int32))
  tokens = jnp.arange(rows, dtype=jnp.int32)[None] % vocab
  fwd = jax.jit(lambda m, t, c: m(t, c)[0])
  return lambda: fwd(model, tokens, cache)


def _logits(vocab: int, rows: int, seed: int = 0) -> jax.Array:
  # Logits of a trained-looking spread (std 3): a nucleus of a few percent.
  return 3.0 * jax.random.normal(jax.random.key(seed), (1, rows, vocab))


def table() -> None:
  print("\n## The transform: ms per jitted `probabilities` on [1, rows, V] "
        "(median), vs one forward pass\n")
  print("| config | V | rows | new ms | old ms | old / new | forward ms | "
        "new / forward |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  new_fn = jax.jit(sampling_lib.probabilities, static_argnames=("config",))
  for vocab in map(int, _VOCABS.value):
    for rows in map(int, _ROWS.value):
      logits = _logits(vocab, rows)
      # Timed on its own: a call right after a multi-threaded forward pass
      # is slowed by it, which would bias whichever transform came next.
      forward_ms = _time_ms({"f": (_forward_fn(vocab, rows),
                                   _REPEATS.value)})["f"]
      fns = {}
      for name, config in CONFIGS.items():
        fns[f"new {name}"] = (functools.partial(new_fn, logits, config=config),
                              _REPEATS.value)
        fns[f"old {name}"] = (functools.partial(
            reference.probabilities_jit, logits, config=config),
                              _OLD_REPEATS.value)
      ms = _time_ms(fns)
      for name in CONFIGS:
        new, old = ms[f"new {name}"], ms[f"old {name}"]
        print(f"| {name} | {vocab} | {rows} | {new:.3f} | {old:.3f} | "
              f"{old / new:.1f}x | {forward_ms:.2f} | "
              f"{100 * new / forward_ms:.1f}% |", flush=True)


def _with_old_transform(fn: Callable[[], Any]) -> Callable[[], Any]:
  """Traces `fn` (on its first call) with the sort-based transform."""
  def traced_old():
    saved = sampling_lib.probabilities
    sampling_lib.probabilities = reference.probabilities
    try:
      return fn()
    finally:
      sampling_lib.probabilities = saved
  return traced_old


def generate() -> None:
  per_block = max(1, _REPEATS.value // 2)
  print("\n## `generate` at GPT-2-124M shapes (V = 50257), batch 1, "
        f"{_NEW_TOKENS.value} new tokens, prompt 16 (median of "
        f"{2 * per_block}: two blocks of {per_block} per variant, "
        "alternating)\n")
  model = _model(50257)
  prompts = jnp.arange(16, dtype=jnp.int32)[None] * 97 % 50257
  lengths = jnp.array([16])

  def run(config, old=False):
    # A distinct jit per variant: clear `_generate`'s cache so that the old
    # variant is traced with the old transform (and the new one again after).
    def call():
      return sj.generate(model, prompts, lengths, jax.random.key(0),
                         max_new_tokens=_NEW_TOKENS.value, sampling=config)
    decode_loop._generate.clear_cache()
    call = _with_old_transform(call) if old else call
    jax.block_until_ready(call())
    return call

  top_p = sj.SamplingConfig(temperature=1.0, top_p=0.9)
  variants = {"greedy": (sj.SamplingConfig(temperature=0.0), False),
              "T=1 top_p=0.9 (new)": (top_p, False),
              "T=1 top_p=0.9 (old)": (top_p, True)}
  # `_generate` has one jit cache, so each variant is timed in its own block
  # of interleaved rounds after a fresh trace; the blocks alternate twice.
  times = {name: [] for name in variants}
  for _ in range(2):
    for name, (config, old) in variants.items():
      call = run(config, old)
      for _ in range(per_block):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times[name].append(time.perf_counter() - start)
  decode_loop._generate.clear_cache()
  greedy = _NEW_TOKENS.value / np.median(times["greedy"])
  print("| sampling | tokens/s | vs greedy |")
  print("| --- | --- | --- |")
  for name, t in times.items():
    rate = _NEW_TOKENS.value / np.median(t)
    print(f"| {name} | {rate:.1f} | {100 * (rate / greedy - 1):+.1f}% |")


def _old_post(logits, q, drafts, keys, config):
  """The verify step's post-logits work as before: the old transform, a
  residual and its CDF at every position, a separate bonus draw."""
  gamma = drafts.shape[1]
  u = steps._row_uniforms(keys, 2 * gamma + 1)
  p = reference.probabilities(logits, config)
  if config.greedy:
    bonus = jnp.argmax(p[:, gamma], axis=-1)
  else:
    bonus = sampling_lib.sample_from_probs(u[:, 2 * gamma], p[:, gamma])
  coupled, accepted = coupling._coupling(u[:, :gamma], u[:, gamma:2 * gamma],
                                         p[:, :gamma], q, drafts)
  overlap = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  return coupled, accepted, bonus, overlap


def _new_post(logits, q, drafts, keys, config):
  """The loop's own verify step on a stub target that returns `logits`."""
  stub_target = lambda tokens, cache: (logits, cache)
  last = jnp.zeros((drafts.shape[0],), jnp.int32)
  out = steps._verify_step(stub_target, None, last, drafts, q, keys, config)
  return out.tokens, out.num_accepted, out.overlap


def _draft_side(logits_GxV, u_G, config, transform):
  """gamma draft-side transforms and draws on [1, V] (a scan, as the loop)."""
  def one(_, lu):
    logits_V, u = lu
    q = transform(logits_V[None], config)
    tok = (jnp.argmax(q, -1) if config.greedy
           else sampling_lib.sample_from_probs(u[None], q))
    return None, (tok, q)
  return jax.lax.scan(one, None, (logits_GxV, u_G))[1]


def round_share() -> None:
  gamma = _GAMMA.value
  print(f"\n## One speculative round, batch 1, gamma = {gamma}: ms (median)\n")
  print("| config | V | target forward [1, gamma+1] | verify post-logits "
        "new / old | draft side new / old | sampling share new / old |")
  print("| --- | --- | --- | --- | --- | --- |")
  for vocab in map(int, _VOCABS.value):
    if vocab < 50000:
      continue
    forward = _forward_fn(vocab, gamma + 1)
    logits = _logits(vocab, gamma + 1, seed=1)
    draft_logits = _logits(vocab, gamma, seed=2)[0]
    u = jax.random.uniform(jax.random.key(3), (1, 2 * gamma + 1))
    keys = jax.random.split(jax.random.key(5), 1)
    for name, config in CONFIGS.items():
      q = reference.probabilities_jit(draft_logits[None], config=config)
      drafts = (jnp.argmax(q, -1) if config.greedy else
                jax.random.categorical(jax.random.key(4), jnp.log(q)))
      drafts = drafts.astype(jnp.int32)
      new_post = jax.jit(functools.partial(_new_post, config=config))
      old_post = jax.jit(functools.partial(_old_post, config=config))
      new_draft = jax.jit(functools.partial(
          _draft_side, config=config, transform=sampling_lib.probabilities))
      old_draft = jax.jit(functools.partial(
          _draft_side, config=config, transform=reference.probabilities))
      ms = _time_ms({"forward": (forward, _REPEATS.value)})
      ms |= _time_ms({
          "new post": (lambda: new_post(logits, q, drafts, keys),
                       _REPEATS.value),
          "old post": (lambda: old_post(logits, q, drafts, keys),
                       _OLD_REPEATS.value),
          "new draft": (lambda: new_draft(draft_logits, u[0, :gamma]),
                        _REPEATS.value),
          "old draft": (lambda: old_draft(draft_logits, u[0, :gamma]),
                        _OLD_REPEATS.value),
      })
      share = {v: (ms[f"{v} post"] + ms[f"{v} draft"]) /
               (ms["forward"] + ms[f"{v} post"] + ms[f"{v} draft"])
               for v in ("new", "old")}
      print(f"| {name} | {vocab} | {ms['forward']:.2f} | "
            f"{ms['new post']:.3f} / {ms['old post']:.3f} | "
            f"{ms['new draft']:.3f} / {ms['old draft']:.3f} | "
            f"{100 * share['new']:.1f}% / {100 * share['old']:.1f}% |",
            flush=True)


def main(argv):
  del argv
  print(f"# benchmarks/sampling.py on {jax.devices()[0].device_kind} "
        f"({os.cpu_count()} CPUs), jax {jax.__version__}")
  parts = {"table": table, "generate": generate, "round": round_share}
  for part in _PARTS.value:
    if part not in parts:
      raise app.UsageError(f"--parts: unknown {part!r}; choose from "
                           f"{sorted(parts)}.")
    parts[part]()


if __name__ == "__main__":
  app.run(main)
