"""Wall-clock measurements the accounting formulas need: c, r and speedup.

  c = (one draft step) / (one target step)            both on T = 1 token
  r = (target pass on gamma + 1 tokens) / (target step on 1 token)

Step times come from a jitted `fori_loop` of `iters` forward passes on a
cache filled to a realistic context length (each pass depends on the last
through the cache, so XLA cannot overlap or drop them), divided by `iters`;
the median over `repeats` is reported. Everything is timed after a warm-up
call, so compilation is never counted.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks


def median_seconds(fn: Callable[[], Any], *, repeats: int = 5) -> float:
  """Median wall-clock seconds of `fn()` (blocked until ready) after a warm-up."""
  repeats = _checks.check_int("repeats", repeats, low=1)
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def forward_seconds(model, *, batch_size: int, context_len: int,
                    num_tokens: int, iters: int = 16, repeats: int = 5,
                    seed: int = 0) -> float:
  """Seconds per forward pass of `num_tokens` new tokens per row.

  The cache holds `context_len` positions of random tokens, and every pass
  scores its tokens at positions `context_len ...` (then the length is rolled
  back, as the decode loop does after a rejection).
  """
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  context_len = _checks.check_int("context_len", context_len, low=1)
  num_tokens = _checks.check_int("num_tokens", num_tokens, low=1)
  iters = _checks.check_int("iters", iters, low=1)
  capacity = context_len + num_tokens
  limit = getattr(model, "max_positions", None)
  if limit is not None and capacity > limit:
    raise ValueError(f"context_len + num_tokens = {capacity} exceeds the "
                     f"model's max_positions={limit}.")
  rng = np.random.default_rng(seed)
  context = jnp.asarray(rng.integers(0, model.vocab_size,
                                     (batch_size, context_len)), jnp.int32)
  tokens = jnp.asarray(rng.integers(0, model.vocab_size,
                                    (batch_size, num_tokens)), jnp.int32)
  _, cache = model(context, model.init_cache(batch_size, capacity))

  @jax.jit
  def passes(model, cache, tokens):
    def body(_, carry):
      cache, acc = carry
      logits, cache = model(tokens, cache)
      # Feeding a logit back into the next pass's tokens would change them;
      # accumulating one keeps the passes live without changing the work.
      return cache.replace(lengths=cache.lengths - num_tokens), acc + logits[0, 0, 0]
    return jax.lax.fori_loop(0, iters, body, (cache, jnp.float32(0)))[1]

  return median_seconds(lambda: passes(model, cache, tokens),
                        repeats=repeats) / iters


def step_costs(target, draft, *, gamma: int, context_len: int,
               batch_size: int = 1, iters: int = 16, repeats: int = 5
               ) -> dict[str, float]:
  """Measured per-pass times and the ratios c and r (see the module docstring).

  Returns a dict with `target_step_s`, `verify_step_s` (gamma + 1 tokens),
  `draft_step_s`, `c` and `r`.
  """
  gamma = _checks.check_int("gamma", gamma, low=1)
  kw = dict(batch_size=batch_size, context_len=context_len, iters=iters,
            repeats=repeats)
  return cost_ratios(forward_seconds(target, num_tokens=1, **kw),
                     forward_seconds(target, num_tokens=gamma + 1, **kw),
                     forward_seconds(draft, num_tokens=1, **kw))


def cost_ratios(target_step_s: float, verify_step_s: float,
                draft_step_s: float) -> dict[str, float]:
  """The three pass times and c, r derived from them (one dict)."""
  return {"target_step_s": target_step_s, "verify_step_s": verify_step_s,
          "draft_step_s": draft_step_s, "c": draft_step_s / target_step_s,
          "r": verify_step_s / target_step_s}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
  """`(fn(), seconds)` with the result blocked until ready."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start
