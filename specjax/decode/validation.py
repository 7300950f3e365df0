"""Argument checks for the decode API, run on the host before any tracing."""

from __future__ import annotations

import functools
from typing import Any
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import sampling as sampling_lib
from specjax.models import protocol


def check_model(name: str, model: Any) -> None:
  for attr in ("vocab_size", "init_cache"):
    if not hasattr(model, attr):
      raise TypeError(
          f"{name} must implement the specjax.models.CausalLM protocol "
          f"(vocab_size, max_positions, init_cache, __call__); "
          f"{type(model).__name__} has no {attr!r}.")
  if not callable(model):
    raise TypeError(f"{name} must be callable as {name}(tokens, cache).")


def check_pair(target: Any, draft: Any) -> None:
  """Both are models, of one vocabulary, and a draft that reads the target's
  cache or features can read this target's."""
  check_model("target", target)
  check_model("draft", draft)
  if draft.vocab_size != target.vocab_size:
    raise ValueError(f"draft.vocab_size ({draft.vocab_size}) != "
                     f"target.vocab_size ({target.vocab_size}); speculative "
                     "decoding needs one shared vocabulary.")
  if getattr(draft, "reads_target_cache", False):
    draft.check_target(target)  # its cache must be the draft's to read
  if getattr(draft, "reads_target_features", False):
    draft.check_target(target)  # the target must return features it reads


def check_sampling(sampling: Any, vocab_size: int) -> None:
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError("sampling must be a specjax.SamplingConfig, e.g. "
                    "SamplingConfig(temperature=0.7, top_k=50), got "
                    f"{type(sampling).__name__}.")
  sampling.check_vocab(vocab_size)


@functools.partial(jax.jit, static_argnums=1)
def _fold_in_rows(key, batch_size):
  # Jitted: an eager vmap dispatches op by op, host time on every generate
  # call.
  return jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(batch_size))


def row_keys(name: str, key: Any, batch_size: int) -> jax.Array:
  """One key per row: `fold_in(key, row)` for a single key, or keys `[B]`.

  Folding in the row index (not splitting by batch size) is what makes a
  row's randomness independent of the batch it sits in.
  """
  key = _checks.as_key(name, key)
  if key.shape == ():
    return _fold_in_rows(key, batch_size)
  if key.shape != (batch_size,):
    raise ValueError(f"{name} must be one PRNG key or {batch_size} keys (one "
                     f"per row), got key shape {tuple(key.shape)}.")
  return key


def check_prompts(prompts: Any, prompt_lengths: Any):
  """Returns host copies of prompts `[B, P]` (int64: an id past int32 must
  reach `_checks.check_token_range`, not wrap to a valid one) and lengths (int32
  `[B]`)."""
  prompts = _checks.check_array("prompts", prompts, rank=2, kind="i")
  prompt_lengths = _checks.check_array("prompt_lengths", prompt_lengths,
                                       rank=1, kind="i")
  if not _checks.is_concrete(prompts) or not _checks.is_concrete(prompt_lengths):
    raise TypeError("prompts and prompt_lengths must be concrete arrays: call "
                    "generate/speculative_generate outside jax.jit (it is "
                    "compiled internally).")
  b, p = prompts.shape
  if b == 0 or p == 0:
    raise ValueError(f"prompts must be non-empty [B, P], got shape {(b, p)}.")
  if prompt_lengths.shape[0] != b:
    raise ValueError(f"prompt_lengths has {prompt_lengths.shape[0]} rows but "
                     f"prompts has {b}; give one length per prompt row.")
  lengths = np.asarray(prompt_lengths).astype(np.int64)
  if lengths.min() < 1 or lengths.max() > p:
    raise ValueError(f"prompt_lengths must be in [1, {p}] (the padded prompt "
                     f"width), got min {lengths.min()} max {lengths.max()}.")
  return np.asarray(prompts).astype(np.int64), lengths.astype(np.int32)


ON_NONFINITE = ("raise", "warn")


class NonFiniteLogitsError(FloatingPointError):
  """A model produced NaN / +inf logits (or a row of -inf) during decoding."""


def check_on_nonfinite(on_nonfinite: Any) -> None:
  if on_nonfinite not in ON_NONFINITE:
    raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got "
                     f"{on_nonfinite!r}.")


def _rows_text(counts_B: np.ndarray, what: str) -> str:
  rows = np.flatnonzero(counts_B)
  shown = ", ".join(f"row {r}: {counts_B[r]}" for r in rows[:8])
  more = f", ... ({len(rows)} rows)" if len(rows) > 8 else ""
  return f"{what} in {len(rows)} row(s) ({shown}{more})"


def check_finite_logits(stats: Any, caller: str, on_nonfinite: str) -> None:
  """After the loop: raise (or warn) if `stats` counted non-finite logits.

  One host transfer of two `[B]` counters. The message names the rows and
  which model produced them; those rows' tokens are not samples of the target.
  """
  target_B, draft_B = jax.device_get((stats.target_nonfinite,
                                      stats.draft_nonfinite))
  target_B, draft_B = np.asarray(target_B), np.asarray(draft_B)
  if not target_B.any() and not draft_B.any():
    return
  parts = []
  if target_B.any():
    parts.append(_rows_text(target_B, "the target scored positions from "
                            "non-finite logits"))
  if draft_B.any():
    parts.append(_rows_text(draft_B, "the draft proposed tokens from "
                            "non-finite logits"))
  message = (f"{caller}: " + "; ".join(parts) + ". Logits were NaN, +inf, or "
             "-inf for every token, so the affected rows' tokens are NOT "
             "samples of the target. Check the model's parameters and dtype "
             "(e.g. overflow in float16/bfloat16) and the prompts. Pass "
             "on_nonfinite='warn' to get the result anyway.")
  if on_nonfinite == "warn":
    warnings.warn(message, RuntimeWarning, stacklevel=3)
  else:
    raise NonFiniteLogitsError(message)


# (id(model), batch, length) -> (weakref to the model, bytes): shaping a
# cache traces init_cache, which every timed call of a sweep would pay; a
# model's arrays cannot change in place.
_CACHE_BYTES: dict = {}


def _cache_bytes(model: Any, batch_size: int, buffer_len: int) -> int | None:
  """Bytes of `model.init_cache` for a generation's buffer (shapes only,
  nothing allocated); None when the model's cache cannot be shaped here
  (the call itself then reports why)."""
  key = (id(model), batch_size, buffer_len)
  ref, size = _CACHE_BYTES.get(key, (None, None))
  if ref is not None and ref() is model:
    return size
  size = _shaped_cache_bytes(model, batch_size, buffer_len)
  try:
    ref = weakref.ref(model)
  except TypeError:  # not weakly referable: shaped on every call
    return size
  if len(_CACHE_BYTES) >= 256:
    _CACHE_BYTES.clear()
  _CACHE_BYTES[key] = (ref, size)
  return size


def _shaped_cache_bytes(model: Any, batch_size: int,
                        buffer_len: int) -> int | None:
  length = protocol.cache_length(model, buffer_len)
  try:
    shapes = jax.eval_shape(lambda: model.init_cache(batch_size, length))
  except Exception:  # pylint: disable=broad-except
    return None
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(shapes))


def _host_available_bytes() -> int | None:
  """Linux's MemAvailable (memory a process can take without swapping)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def free_device_bytes(devices: Any) -> tuple[int, str] | None:
  """(bytes, where): the memory the caches of a generation on `devices` can
  take: on an accelerator the smallest of its devices' free memory (limit
  minus in use) times their number; on CPU, whose devices share the host's
  memory, the host's MemAvailable. None when the platform does not say."""
  devices = list(devices)
  if devices[0].platform == "cpu":
    free = _host_available_bytes()
    return None if free is None else (free, "this host (MemAvailable)")
  frees = []
  for device in devices:
    try:
      stats = device.memory_stats() or {}
    except Exception:  # pylint: disable=broad-except
      return None
    if "bytes_limit" not in stats:
      return None
    frees.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  return (min(frees) * len(frees),
          f"{len(frees)} {devices[0].platform} device(s)")


def check_cache_memory(caller: str, models: Any, batch_size: int,
                       buffer_len: int, mesh: Any = None) -> None:
  """Raises MemoryError, before anything is traced or allocated, when the
  KV caches a generation allocates cannot fit in the free memory.

  `models` are (name, model) pairs whose caches the loop holds. Each
  cache is shaped as the loop makes it (`protocol.cache_length`). Only the
  caches are counted,
  and on a mesh as if spread perfectly over its devices: a lower bound on
  what the call needs, so no call that fits is refused. The alternative is
  XLA's RESOURCE_EXHAUSTED error from inside the compiled call, or on CPU
  the kernel killing the process.
  """
  sizes = [(name, _cache_bytes(model, batch_size, buffer_len))
           for name, model in models]
  sizes = [(name, size) for name, size in sizes if size]
  if not sizes:
    return
  devices = jax.devices() if mesh is None else mesh.devices.flat
  free = free_device_bytes(devices if mesh is not None else devices[:1])
  need = sum(size for _, size in sizes)
  if free is None or need <= free[0]:
    return
  gib = lambda n: f"{n / 2**30:,.1f} GiB"
  parts = ", ".join(f"{name} {gib(size)}" for name, size in sizes)
  raise MemoryError(
      f"{caller}: the KV caches alone need {gib(need)} ({parts}; "
      f"{batch_size} rows x {buffer_len} positions), more than the "
      f"{gib(free[0])} free on {free[1]}. Decode fewer rows per call, lower "
      "max_new_tokens or shorten the prompts"
      # A CPU mesh's devices share the host's memory: no help there.
      + (", or spread the batch over a mesh (mesh=...)."
         if mesh is None and not free[1].startswith("this host") else "."))
