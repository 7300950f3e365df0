"""Wall-clock measurements the accounting formulas need: c, r and speedup.

  c = (one draft step) / (one target step)            both on T = 1 token
  r = (target pass on gamma + 1 tokens) / (target step on 1 token)

Step times come from jitted `fori_loop`s of n and 2n forward passes at a
realistic context length, each pass fed the argmax of the last (so XLA can
neither drop nor overlap them); their difference over n is one pass without a
call's fixed cost (dispatch, argument copies: about 1 ms, which would swamp a
small model's pass). Medians over interleaved repeats, after a warm-up call,
so compilation is never counted.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specjax import _checks


def median_times(fns: dict[str, Callable[[], Any]], repeats: int
                  ) -> dict[str, float]:
  """Median seconds per call; warm-up call first, then repeats interleaved."""
  for fn in fns.values():
    jax.block_until_ready(fn())
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def forward_loops(model, batch, tokens, cache_len, fill, seconds):
  """Two calls running n and 2n cached forward passes of `tokens` tokens/row.

  Their time difference / n is one pass without a call's fixed cost
  (dispatch, argument copies: ~1 ms, which would swamp a small model's pass).
  n is chosen so that n passes take about `seconds`. Each pass starts at
  `fill` committed positions (the lengths are reset after every pass, as a
  rolled-back round does), so all passes cost the same.
  """
  @jax.jit
  def run(model, cache, first_B, n):
    def body(_, carry):
      cache, token_B = carry
      logits_BxTxV, new_cache = model(
          jnp.broadcast_to(token_B[:, None], (batch, tokens)), cache)
      # Feeding the argmax back makes each pass depend on the last, as in
      # decoding, so XLA can neither drop nor hoist any of it.
      return (new_cache.replace(lengths=cache.lengths),
              jnp.argmax(logits_BxTxV[:, -1], axis=-1).astype(jnp.int32))
    return jax.lax.fori_loop(0, n, body, (cache, first_B))

  cache = model.init_cache(batch, cache_len).replace(
      lengths=jnp.full((batch,), fill, jnp.int32))
  first_B = jnp.zeros((batch,), jnp.int32)
  call = lambda n: run(model, cache, first_B, jnp.int32(n))
  n = 8
  for _ in range(2):  # the first estimate is inflated by the fixed cost
    per_pass = median_times({"": lambda: call(n)}, 3)[""] / n
    n = max(n, int(seconds / per_pass))
  return n, (lambda: call(n)), (lambda: call(2 * n))


def forward_seconds(model, *, batch_size: int, context_len: int,
                    num_tokens: int, seconds: float = 0.1,
                    repeats: int = 5) -> float:
  """Seconds per forward pass of `num_tokens` new tokens per row.

  The cache holds `context_len` committed positions; the pass time is the
  difference of loops of n and 2n passes over n (see `forward_loops`), so a
  call's fixed cost is not counted.
  """
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  context_len = _checks.check_int("context_len", context_len, low=0)
  num_tokens = _checks.check_int("num_tokens", num_tokens, low=1)
  capacity = context_len + num_tokens
  limit = getattr(model, "max_positions", None)
  if limit is not None and capacity > limit:
    raise ValueError(f"context_len + num_tokens = {capacity} exceeds the "
                     f"model's max_positions={limit}.")
  n, once, twice = forward_loops(model, batch_size, num_tokens, capacity,
                                 context_len, seconds)
  t = median_times({"n": once, "2n": twice}, repeats)
  return max(t["2n"] - t["n"], 0.0) / n


def step_costs(target, draft, *, gamma: int, context_len: int,
               batch_size: int = 1, seconds: float = 0.1, repeats: int = 5,
               memo: dict | None = None) -> dict[str, float]:
  """Measured per-pass times and the ratios c and r (see the module docstring).

  `memo`, if given, keeps each (model, tokens per pass) timing across calls,
  so a grid over drafts and gammas times every distinct pass once.

  Returns a dict with `target_step_s`, `verify_step_s` (gamma + 1 tokens),
  `draft_step_s`, `c` and `r`.
  """
  gamma = _checks.check_int("gamma", gamma, low=1)
  memo = {} if memo is None else memo

  def seconds_per_pass(model, num_tokens):
    if (id(model), num_tokens) not in memo:
      memo[id(model), num_tokens] = forward_seconds(
          model, batch_size=batch_size, context_len=context_len,
          num_tokens=num_tokens, seconds=seconds, repeats=repeats)
    return memo[id(model), num_tokens]

  return cost_ratios(seconds_per_pass(target, 1),
                     seconds_per_pass(target, gamma + 1),
                     seconds_per_pass(draft, 1))


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
