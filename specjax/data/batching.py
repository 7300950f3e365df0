"""Deterministic training batches and held-out prompts from a token array.

Batch k is a pure function of (tokens, batch_size, seq_len, seed, k): its
window starts are drawn from a numpy Generator seeded by (seed, k) alone, not
from a stream that earlier batches advanced. A run resumed at step k
therefore sees exactly the batches an uninterrupted run would have seen, and
no iterator state needs to be checkpointed.

Windows are sampled uniformly (with replacement) over all start positions, so
they may straddle document boundaries (`... EOS BOS ...`); the model learns
the boundary like any other token.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from specjax import _checks

# Distinct first words of the seed so batches and prompts never share a
# random stream, whatever the seed and step.
_BATCH_STREAM = 0
_PROMPT_STREAM = 1


def _check_tokens(tokens_N, window: int, what: str) -> np.ndarray:
  tokens_N = _checks.check_array("tokens", tokens_N, rank=1, kind="i")
  if tokens_N.shape[0] < window:
    raise ValueError(f"tokens has {tokens_N.shape[0]} tokens, fewer than one "
                     f"{what} window of {window}; use a shorter window or a "
                     "larger corpus.")
  return np.asarray(tokens_N)


def batch_at(tokens_N, batch_size: int, seq_len: int, seed: int,
             step: int) -> np.ndarray:
  """Training batch number `step`: int32 `[batch_size, seq_len + 1]`.

  Row b is `tokens[s_b : s_b + seq_len + 1]` (inputs are `[:, :-1]`, targets
  `[:, 1:]`) with `s_b` uniform over the valid starts, drawn from
  `np.random.default_rng([0, seed, step])`.
  """
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  seq_len = _checks.check_int("seq_len", seq_len, low=1)
  seed = _checks.check_int("seed", seed, low=0)
  step = _checks.check_int("step", step, low=0)
  tokens_N = _check_tokens(tokens_N, seq_len + 1, "training")
  return _windows(tokens_N, batch_size, seq_len + 1,
                  np.random.default_rng([_BATCH_STREAM, seed, step]))


def batches(tokens_N, batch_size: int, seq_len: int, seed: int, *,
            start_step: int = 0) -> Iterator[np.ndarray]:
  """Yields `batch_at(..., step)` for step = start_step, start_step + 1, ...

  Infinite; resume a run by passing the step it stopped at as `start_step`.
  """
  start_step = _checks.check_int("start_step", start_step, low=0)
  # Validate eagerly: a generator would defer errors to the first next().
  batch_at(tokens_N, batch_size, seq_len, seed, start_step)

  def gen():
    step = start_step
    while True:
      yield batch_at(tokens_N, batch_size, seq_len, seed, step)
      step += 1

  return gen()


def prompts(tokens_N, n: int, prompt_len: int, seed: int) -> np.ndarray:
  """`n` prompts of `prompt_len` tokens cut from `tokens` (e.g. held-out).

  Returns int32 `[n, prompt_len]`, a pure function of the arguments; the
  starts are distinct when the array has at least `n` of them, so no two
  prompts are identical windows. Prompts do not depend on any batch stream.
  """
  n = _checks.check_int("n", n, low=1)
  prompt_len = _checks.check_int("prompt_len", prompt_len, low=1)
  seed = _checks.check_int("seed", seed, low=0)
  tokens_N = _check_tokens(tokens_N, prompt_len, "prompt")
  rng = np.random.default_rng([_PROMPT_STREAM, seed])
  num_starts = tokens_N.shape[0] - prompt_len + 1
  if num_starts >= n:
    starts_n = np.sort(rng.choice(num_starts, size=n, replace=False))
  else:
    starts_n = rng.integers(0, num_starts, size=n)
  return _gather(tokens_N, starts_n, prompt_len)


def _windows(tokens_N, count, width, rng):
  starts_B = rng.integers(0, tokens_N.shape[0] - width + 1, size=count)
  return _gather(tokens_N, starts_B, width)


def _gather(tokens_N, starts_B, width):
  at_BxW = starts_B[:, None] + np.arange(width)[None, :]
  windows_BxW = tokens_N[at_BxW]
  # Checked per window, not per corpus (a step would rescan every token):
  # the int32 cast would wrap a wider id, and a negative id is no token.
  bad = (windows_BxW < 0) | (windows_BxW > np.iinfo(np.int32).max)
  if bad.any():
    i = int(at_BxW[bad][0])
    raise ValueError(f"tokens[{i}] = {tokens_N[i]} is not a token id: ids "
                     "must lie in [0, 2**31) (the batches are int32).")
  return windows_BxW.astype(np.int32)
