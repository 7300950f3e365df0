"""Input checks shared by the public API.

Every public function calls these before anything is traced, so a caller who
passes the wrong thing gets a Python error naming the argument and the fix,
never an XLA stack trace or a NaN. The checks read only static information
(shapes, dtypes, Python scalars), so they also work on tracers.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x: Any) -> bool:
  """True when `x` holds values we can read on the host (not a tracer)."""
  return not isinstance(x, jax.core.Tracer)


# jax.random.key keeps only the low 32 bits of a seed unless jax_enable_x64
# is set: 2**32 would silently repeat seed 0, and -1 seed 2**32 - 1.
MAX_SEED = 2**32 - 1


def check_int(name: str, value: Any, *, low: int | None = None,
              high: int | None = None) -> int:
  """Returns `value` as int, raising if it is not an integer in [low, high]
  (a Python or numpy int, or a concrete 0-d integer jax array)."""
  if (isinstance(value, jax.Array) and is_concrete(value) and value.ndim == 0
      and jnp.issubdtype(value.dtype, jnp.integer)):
    value = value.item()
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (numbers.Integral, np.integer)):
    raise TypeError(f"{name} must be a Python int, got {value!r} "
                    f"({type(value).__name__}).")
  value = int(value)
  if low is not None and value < low:
    raise ValueError(f"{name} must be >= {low}, got {value}.")
  if high is not None and value > high:
    raise ValueError(f"{name} must be <= {high}, got {value}.")
  return value


def check_hashable(what: str, value: Any) -> None:
  """Raises unless `value` hashes: it is a static argument of the compiled
  loop, where jit would refuse it with its own error. `what` names it."""
  try:
    hash(value)
  except TypeError:
    raise TypeError(f"{what} {value!r} must be hashable (a frozen dataclass): "
                    "it is a static argument of the compiled loop.") from None


def check_bool(name: str, value: Any) -> bool:
  """Returns `value` as bool, raising unless it is a Python or numpy bool (a
  string such as "False" would otherwise be truthy)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r} "
                    f"({type(value).__name__}).")
  return bool(value)


def check_float(name: str, value: Any) -> float:
  """Returns `value` as a finite float: a real number, or a 0-d numpy or jax
  array of one (e.g. `acceptance_probability(p, q)`); never a bool."""
  if (getattr(value, "shape", None) == () and is_concrete(value)
      and np.dtype(value.dtype).kind in "fiu"):
    value = np.asarray(value).item()
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (numbers.Real, np.floating, np.integer)):
    raise TypeError(f"{name} must be a real number, got {value!r}.")
  value = float(value)
  if not np.isfinite(value):
    raise ValueError(f"{name} must be finite, got {value}.")
  return value


def check_array(name: str, x: Any, *, min_rank: int = 0,
                rank: int | None = None, kind: str | None = None):
  """Checks rank and dtype kind ('f' float, 'i' integer) of an array-like."""
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    x = np.asarray(x)
  if rank is not None and x.ndim != rank:
    raise ValueError(f"{name} must have rank {rank}, got shape {tuple(x.shape)}.")
  if x.ndim < min_rank:
    raise ValueError(f"{name} must have rank >= {min_rank}, got shape "
                     f"{tuple(x.shape)}.")
  if kind == "f" and not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be a float array, got dtype {x.dtype}.")
  if kind == "i" and not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"{name} must be an integer array, got dtype {x.dtype}. "
                    "Cast it with .astype(jnp.int32).")
  return x


def as_key(name: str, key: Any) -> jax.Array:
  """Accepts a typed key (jax.random.key) or a raw uint32 key (PRNGKey)."""
  if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  arr = key if hasattr(key, "dtype") else np.asarray(key)
  if arr.dtype == jnp.uint32 and arr.ndim >= 1 and arr.shape[-1] == 2:
    return jax.random.wrap_key_data(arr)
  raise TypeError(f"{name} must be a JAX PRNG key (jax.random.key(seed) or "
                  f"jax.random.PRNGKey(seed)), got {type(key).__name__} with "
                  f"dtype {getattr(arr, 'dtype', None)}.")


def as_single_key(name: str, key: Any) -> jax.Array:
  """`as_key`, refusing a key array (one key per row): for functions that
  draw everything from one key, where jax.random raised from inside."""
  key = as_key(name, key)
  if key.shape:
    raise ValueError(f"{name} must be a single PRNG key (jax.random.key(seed)"
                     f"), got a key array of shape {tuple(key.shape)}.")
  return key


def dir_or_creatable(path: Any) -> bool:
  """True if `path` is a directory or one can be made there: the nearest
  existing ancestor is a writable directory (not a file). For output
  directories, checked before any work writes there."""
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    return False
  path = os.path.abspath(os.fspath(path))
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return os.path.isdir(path) and os.access(path, os.W_OK)


def check_token_range(name: str, ids: Any, vocab_size: int, *,
                      lengths_B: Any = None, whose: str = "the ") -> None:
  """Raises unless the (concrete) ids lie in [0, vocab_size), naming the
  first that does not: all of them, of any shape, or with `lengths_B` each
  row's first `lengths_B[b]` of `[B, T]` ids (the padding past them may hold
  anything, e.g. a pad_id). An id off the vocabulary would be wrapped or
  clamped into it by a gather, or embed as NaN."""
  ids = np.asarray(ids)
  bad = (ids < 0) | (ids >= vocab_size)
  if lengths_B is not None:
    bad &= np.arange(ids.shape[1])[None, :] < np.asarray(lengths_B)[:, None]
  if bad.any():
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"[{', '.join(map(str, at))}]" if at else ""
    raise ValueError(f"{name}{where} = {ids[at]} is outside {whose}"
                     f"vocabulary [0, {vocab_size}).")


def check_texts(prompts_BxP: Any, prompt_lengths_B: Any, tokens_BxN: Any,
                lengths_B: Any, models: dict[str, Any], extra: int = 0):
  """Checks a batch of generations and joins each row's prompt and output.

  Args:
    prompts_BxP: int `[B, P]` right-padded prompts; prompt_lengths_B: int
      `[B]` in [1, P].
    tokens_BxN: int `[B, N]` generated tokens; lengths_B: int `[B]` in
      [0, N]. Tokens past a row's length (the decode's pad_id) are ignored.
    models: {name: model} that will read the joined texts; each must see
      P + N + `extra` positions (its `max_positions`, if it has one), and
      every prompt and generated token must lie in [0, vocab_size) of each
      (its `vocab_size`, if it has one).

  Returns:
    (seq_BxT int32 numpy `[B, P + N]`: row b's prompt_lengths_B[b] prompt
    tokens, then its lengths_B[b] generated tokens, then zeros; p_len, n_len:
    int64 numpy `[B]`).
  """
  prompts = np.asarray(check_array("prompts_BxP", prompts_BxP, rank=2,
                                   kind="i"))
  tokens = np.asarray(check_array("tokens_BxN", tokens_BxN, rank=2, kind="i"))
  # Integer dtypes: astype(int64) would truncate a length of 2.7 to 2.
  p_len = np.asarray(check_array("prompt_lengths_B", prompt_lengths_B,
                                 kind="i")).reshape(-1).astype(np.int64)
  n_len = np.asarray(check_array("lengths_B", lengths_B,
                                 kind="i")).reshape(-1).astype(np.int64)
  rows, width = prompts.shape
  if tokens.shape[0] != rows or p_len.size != rows or n_len.size != rows:
    raise ValueError(f"prompts_BxP {prompts.shape}, prompt_lengths_B "
                     f"{p_len.shape}, tokens_BxN {tokens.shape} and lengths_B "
                     f"{n_len.shape} must share their row count.")
  if (p_len < 1).any() or (p_len > width).any() or (n_len < 0).any() or (
      n_len > tokens.shape[1]).any():
    raise ValueError("prompt_lengths_B must lie in [1, P] and lengths_B in "
                     f"[0, N]; got {p_len.tolist()} and {n_len.tolist()}.")
  total = width + tokens.shape[1]
  for name, model in models.items():
    limit = getattr(model, "max_positions", None)
    if limit is not None and total + extra > limit:
      raise ValueError(
          f"{name} sees at most {limit} positions; prompt + generation"
          f"{' + ' + str(extra) if extra else ''} is {total + extra}: use "
          "shorter texts.")
  # A model's embedding lookup clamps an id outside its vocabulary instead
  # of failing, so a wrong id would read as the last token: refuse it here.
  for name, model in models.items():
    vocab = getattr(model, "vocab_size", None)
    if vocab is None:
      continue
    check_token_range("prompts_BxP", prompts, vocab, lengths_B=p_len,
                      whose=f"{name}'s ")
    check_token_range("tokens_BxN", tokens, vocab, lengths_B=n_len,
                      whose=f"{name}'s ")
  seq_BxT = np.zeros((rows, total), np.int32)
  for b in range(rows):
    seq_BxT[b, :p_len[b]] = prompts[b, :p_len[b]]
    # Only the generated tokens: the padding past them may be any pad_id,
    # and no position the callers read looks past a row's length.
    seq_BxT[b, p_len[b]:p_len[b] + n_len[b]] = tokens[b, :n_len[b]]
  return seq_BxT, p_len, n_len
