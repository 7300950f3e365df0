"""The sampling transform: logits -> probabilities under one sampling config.

Speculative sampling is exact for the distribution that the target's logits
are turned into. The SAME transform (`probabilities`) is therefore applied to
target and draft logits before the coupling, and the autoregressive baseline
samples from the very same function. Change it here and all three change.

Order of operations (as in Hugging Face's logits processors): temperature,
then top-k, then top-p, then renormalise. Temperature 0 means greedy: a
one-hot vector on the argmax, ties broken towards the lowest token id.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks


MIN_TEMPERATURE = 1e-4
# At this temperature every distribution is uniform over its unmasked tokens
# in all but name (real logits span tens). Above it, the finite masks of the
# library (`vocab.MASKED_LOGIT`, -1e30, on padding ids; prompt lookup's
# -1e9 off its proposal) would stop underflowing to exactly 0: softmax would
# then put mass on padding ids at T >= 1e29, which the loop would emit. Below
# it |mask| / T >= 1000, and exp(-1000) is 0 in float32. (Near 1e30, XLA's
# 1 / T is also a flushed denormal, and -inf * 0 NaN.)
MAX_TEMPERATURE = 1e6


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a next-token distribution. Hashable: a static jit arg.

  Attributes:
    temperature: 0 (greedy decoding: one-hot argmax) or in [MIN_TEMPERATURE,
      MAX_TEMPERATURE].
    top_k: keep the k most likely tokens; 0 disables. Tokens tied with the
      k-th largest logit are kept too, so the rule is deterministic.
    top_p: nucleus sampling: keep the smallest set of most likely tokens whose
      mass reaches top_p (ties at the boundary kept); 1.0 disables.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    t = _checks.check_float("temperature", self.temperature)
    if t < 0:
      raise ValueError(f"temperature must be >= 0 (0 = greedy), got {t}.")
    if 0 < t < MIN_TEMPERATURE:
      # Below this, float32 logits / t overflow (and XLA flushes denormal
      # temperatures to 0); such a temperature is greedy in all but name.
      raise ValueError(f"temperature {t:g} is below {MIN_TEMPERATURE:g}; use "
                       "temperature=0 for greedy decoding.")
    if t > MAX_TEMPERATURE:
      raise ValueError(f"temperature {t:g} is above {MAX_TEMPERATURE:g} (NaN "
                       "where a token is masked); at such a temperature "
                       "every unmasked token is equally likely.")
    k = _checks.check_int("top_k", self.top_k, low=0)
    p = _checks.check_float("top_p", self.top_p)
    if not 0.0 < p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {p}; use 1.0 to disable.")
    object.__setattr__(self, "temperature", t)
    object.__setattr__(self, "top_k", k)
    object.__setattr__(self, "top_p", p)

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def check_vocab(self, vocab_size: int) -> None:
    """Raises if top_k does not fit a vocabulary of `vocab_size` tokens."""
    if self.top_k > vocab_size:
      raise ValueError(f"top_k={self.top_k} exceeds the vocabulary size "
                       f"{vocab_size}; use top_k <= {vocab_size} (0 disables).")


GREEDY = SamplingConfig(temperature=0.0)


def probabilities(logits_xV: jax.Array, config: SamplingConfig) -> jax.Array:
  """Turns logits `[..., V]` into probabilities `[..., V]` (float32).

  Guarantees: every row is non-negative, sums to 1 up to float rounding, and
  has at least one positive entry (the argmax). Masked tokens (top-k / top-p)
  have probability exactly 0. Deterministic: no randomness is used.
  -inf logits are masked tokens; a NaN or +inf logit, or a row that is all
  -inf, has no distribution: called with concrete logits this raises
  ValueError naming the row; inside a trace (the decode loop, which counts
  non-finite logits in `RowStats`) such a row comes out non-finite.

  The kept sets are defined as by a full sort (top-k: the k largest raw
  logits, ties at the k-th value kept; top-p: the shortest prefix of the
  probabilities sorted in decreasing order whose mass before each token is
  < top_p, ties at the smallest kept probability kept) but found without one:
  see `_kth_largest` and `_top_p_threshold`. The one place the result can
  differ from summing a sorted prefix is a top-p boundary whose prefix mass
  lies within float32 summation rounding of top_p (see `_top_p_threshold`).
  """
  logits_xV = _checks.check_array("logits", logits_xV, min_rank=1, kind="f")
  if logits_xV.shape[-1] < 1:
    raise ValueError(f"logits has an empty vocabulary axis: shape "
                     f"{tuple(logits_xV.shape)}.")
  if not isinstance(config, SamplingConfig):
    raise TypeError("config must be a specjax.SamplingConfig, got "
                    f"{type(config).__name__}.")
  config.check_vocab(logits_xV.shape[-1])
  if not _checks.is_concrete(logits_xV):
    return _probabilities(logits_xV, config)
  probs_xV, bad_x = _checked_probabilities(jnp.asarray(logits_xV), config)
  bad_x = np.asarray(bad_x)
  if bad_x.any():
    row = tuple(int(i) for i in np.argwhere(bad_x)[0])
    raise ValueError(
        f"logits has no distribution at row {row} (of {int(bad_x.sum())} "
        f"such rows, shape {tuple(logits_xV.shape)}): a NaN or +inf logit, "
        "or every logit -inf. Check the model's output; -inf is for masked "
        "tokens only.")
  return probs_xV


def nonfinite_rows(logits_xV: jax.Array) -> jax.Array:
  """bool `[...]`: rows of `logits_xV` `[..., V]` that are no distribution.

  A row is non-finite if it holds a NaN or a +inf, or if every entry is -inf.
  A -inf entry alone is a legal zero probability (n-gram drafts, masked
  vocabularies). Sampling such a row would silently yield an arbitrary token
  (V-1, the byte vocabulary's PAD, for a NaN row), so the decode loop counts
  them and `probabilities`, called eagerly, refuses them.
  """
  return ~(jnp.all(logits_xV < jnp.inf, axis=-1)
           & jnp.any(logits_xV > -jnp.inf, axis=-1))


@functools.partial(jax.jit, static_argnames="config")
def _checked_probabilities(logits_xV: jax.Array, config: SamplingConfig
                           ) -> tuple[jax.Array, jax.Array]:
  """`_probabilities` and `nonfinite_rows`, in the same program (one
  compile, one sync)."""
  return _probabilities(logits_xV, config), nonfinite_rows(logits_xV)


# One compiled program per (shape, dtype, config): called eagerly, the
# transform would otherwise dispatch (and compile) its ~30 operations one by
# one; inside a trace it inlines as any nested jit does.
@functools.partial(jax.jit, static_argnames="config")
def _probabilities(logits_xV: jax.Array, config: SamplingConfig) -> jax.Array:
  logits_xV = logits_xV.astype(jnp.float32)
  if config.greedy:
    return jax.nn.one_hot(_greedy_token(logits_xV), logits_xV.shape[-1],
                          dtype=jnp.float32)
  if config.top_k and config.top_k < logits_xV.shape[-1]:
    # Ranked on the raw logits: shifting and scaling can round distinct
    # logits together and let a token below the k-th largest tie into the set.
    kth_x1 = _kth_largest(logits_xV, config.top_k)[..., None]
    # Compared as ordered keys: XLA CPU flushes denormals to zero in float
    # comparisons, which would tie every logit in [0, 1.2e-38) with the
    # k-th when it is a denormal, and keep them all.
    in_top_k_xV = _ordered_key(logits_xV) >= _ordered_key(kth_x1)
  else:  # top_k = 0 or V: every token is in the top k.
    in_top_k_xV = None
  # Shift before dividing: a tiny temperature then sends non-maximal logits
  # to -inf instead of overflowing every logit to inf (NaN after softmax).
  logits_xV = logits_xV - jnp.max(logits_xV, axis=-1, keepdims=True)
  logits_xV = logits_xV / config.temperature
  if in_top_k_xV is not None:
    logits_xV = jnp.where(in_top_k_xV, logits_xV, -jnp.inf)
  probs_xV = jax.nn.softmax(logits_xV, axis=-1)
  if config.top_p < 1.0:
    threshold_x1 = _top_p_threshold(probs_xV, config.top_p)[..., None]
    probs_xV = jnp.where(probs_xV >= threshold_x1, probs_xV, 0.0)
    probs_xV = probs_xV / jnp.sum(probs_xV, axis=-1, keepdims=True)
  return probs_xV


def _greedy_token(logits_xV: jax.Array) -> jax.Array:
  """The greedy token of each row: int32 `[...]`, the argmax of `logits_xV`
  `[..., V]`, ties broken towards the lowest token id. `probabilities` under
  temperature 0 is exactly the one-hot vector of this index.

  Ranked on the integer key of the float bits: XLA CPU flushes denormals to
  zero in float comparisons, which would tie a logit of 8e-39 with 0.0.
  """
  return jnp.argmax(_ordered_key(logits_xV), axis=-1).astype(jnp.int32)


# --- Selection without a sort -------------------------------------------------
#
# Both top-k and top-p ask for a threshold: the smallest value v such that the
# weight of the entries strictly above v is below a limit (top-k: a count of
# entries < k; top-p: a probability mass < top_p). Entries >= v are kept, so
# ties at v are kept. Such a v is always one of the row's values (the weight
# above v only changes at the values). It is found digit by digit on an
# integer key that orders float32 values as the floats order: for counts,
# three rounds of an 11/11/10-bit radix histogram (each a scatter-add over V)
# or 32 rounds of a masked count over V (bisection), whichever is faster
# for the backend and shape (`_default_method`); for masses, bisection with an
# early stop (`_bisect_masses`). Each is O(V) per row and exact for counts;
# masses are float32 sums, so only a boundary within summation rounding of
# top_p can come out differently from a sorted cumulative sum.

_INT32_MIN = -2**31
_RADIX_BITS = (11, 11, 10)  # high to low; they sum to 32
_MIN_RADIX_VOCAB = 2**12
_RADIX_CHUNK_ENTRIES = 2**18
_BISECT_CHUNK_ENTRIES = 2**20
# lax.top_k (a partial sort on CPU, O(V log k)) beats the radix select for
# small k; above this it loses.
_TOP_K_PARTIAL_SORT_MAX = 64


def _ordered_key(x_xV):
  """float32 -> uint32 with the floats' order (and -0 == +0); NaN aside."""
  i_xV = jax.lax.bitcast_convert_type(x_xV, jnp.int32)
  # Negative floats order backwards in their bits; flipping the magnitude
  # bits and adding 1 also sends -0 (0x80000000) to the key of +0.
  s_xV = jnp.where(i_xV < 0, (i_xV ^ 0x7FFFFFFF) + 1, i_xV)
  return jax.lax.bitcast_convert_type(s_xV ^ _INT32_MIN, jnp.uint32)


def _key_to_float(key_x):
  s_x = jax.lax.bitcast_convert_type(key_x, jnp.int32) ^ _INT32_MIN
  i_x = jnp.where(s_x < 0, (s_x - 1) ^ 0x7FFFFFFF, s_x)
  return jax.lax.bitcast_convert_type(i_x, jnp.float32)


def _min_key_with_weight_above_below(key_xV, weight_xV, limit, method=None):
  """Smallest uint32 key t per row with sum(weight[key > t]) < limit: `[...]`.

  `weight_xV` is non-negative (int32 counts or float32 masses) and `limit` is
  positive, so t exists (the largest key has nothing above it). float32
  masses are their own keys: `key_xV` is their bit pattern. `method` is
  "radix" (scatter-add histograms; counts only) or "bisect" (at most 32
  masked sums, no scatter); None picks the faster for the backend and
  shape (`_default_method`).
  """
  vocab = key_xV.shape[-1]
  batch = key_xV.shape[:-1]
  key_RxV = key_xV.reshape(-1, vocab)
  weight_RxV = weight_xV.reshape(-1, vocab)
  rows = key_RxV.shape[0]
  if method is None:
    method = _default_method(vocab, weight_xV.dtype)
  if method == "bisect":
    select = functools.partial(_bisect_select, limit=limit)
  elif method == "radix":
    if jnp.issubdtype(weight_xV.dtype, jnp.floating):
      # A float32 scatter-add sums a bucket sequentially: over ~10^4 similar
      # probabilities that drifts by ~1e-5, enough to move a boundary.
      raise ValueError("method='radix' selects on counts only; masses use "
                       "'bisect'.")
    select = functools.partial(_radix_select, limit=limit)
  else:
    raise ValueError(f"method must be 'radix' or 'bisect', got {method!r}.")
  # Both methods pass over the rows many times: at a large vocabulary, rows
  # go in chunks, one chunk after another, so that a chunk stays in cache
  # across its passes. The radix's scatters take smaller chunks than the
  # bisection's passes, which reduce several rows in parallel and so gain
  # from larger ones (rather than from rows one at a time). Small rows (the
  # toy models) stay in one batch.
  chunk = max(1, (_RADIX_CHUNK_ENTRIES if method == "radix"
                  else _BISECT_CHUNK_ENTRIES) // vocab)
  if rows <= chunk or vocab < _MIN_RADIX_VOCAB:
    return select(key_RxV, weight_RxV).reshape(batch)
  pad = -rows % chunk
  key_CxRxV = jnp.pad(key_RxV, ((0, pad), (0, 0))).reshape(-1, chunk, vocab)
  weight_CxRxV = jnp.pad(weight_RxV, ((0, pad), (0, 0))).reshape(
      -1, chunk, vocab)
  # Padded rows (all weight 0) have an answer too; it is dropped.
  t_CxR = jax.lax.map(lambda kw: select(*kw), (key_CxRxV, weight_CxRxV))
  return t_CxR.reshape(-1)[:rows].reshape(batch)


def _default_method(vocab, weight_dtype):
  """The select method for rows of `vocab` weights: the faster on this
  backend for counts or masses at that vocabulary."""
  if (jax.default_backend() == "cpu" and vocab >= _MIN_RADIX_VOCAB
      and not jnp.issubdtype(weight_dtype, jnp.floating)):
    # Counts (top-k with k > 64) at a large vocabulary: histograms by
    # scatter-add beat 32 masked passes on CPU.
    return "radix"
  # Masses (top-p) always bisect: with its early stop it beats a radix
  # select with exact integer bucket masses. For a small
  # vocabulary (the toy models, millions of rows in the exactness tests) a
  # histogram row of 2**11 buckets is far more memory and work than the
  # passes. Off CPU, scatters are not worth it either.
  return "bisect"


def _bisect_select(key_RxV, weight_RxV, limit):
  """The bisect method of `_min_key_with_weight_above_below` on `[R, V]`."""
  if weight_RxV.dtype == jnp.float32:
    return _bisect_masses(weight_RxV, limit)
  # Counts: the answer is in [lo, hi]; hi starts at the row's largest key.
  lo_R = jnp.zeros(key_RxV.shape[:1], jnp.uint32)
  hi_R = jnp.max(key_RxV, axis=-1)

  def halve(_, lo_hi):
    lo_R, hi_R = lo_hi
    mid_R = lo_R + (hi_R - lo_R) // 2
    above_R = jnp.sum(jnp.where(key_RxV > mid_R[:, None], weight_RxV, 0),
                      axis=-1)
    ok_R = above_R < limit
    return jnp.where(ok_R, lo_R, mid_R + 1), jnp.where(ok_R, mid_R, hi_R)

  lo_R, _ = jax.lax.fori_loop(0, 32, halve, (lo_R, hi_R))
  return lo_R


# Masses bisect this many times before the first check for a bracket that
# holds one distinct value, then check after every _SNAP_EVERY more (each
# check is a pass: checking early or often wastes passes, late wastes
# halvings).
_SNAP_AFTER = 12
_SNAP_EVERY = 2


def _bisect_masses(probs_RxV, limit):
  """`_bisect_select` for float32 masses `[R, V]`, which are their own keys.

  Bisection on the bit pattern, with three savings over 32 plain halvings:
  - hi starts at the row's largest mass, and lo at a bound the answer must
    exceed;
  - the masses are compared as floats, so that a pass reads them alone;
  - a row whose bracket [lo, hi] (lo >= 1) holds a single distinct value v
    is done: the answer is one of the row's keys (the mass above t only
    changes at them), so it is v. That ends a row after about log2(V)
    halvings instead of the ~28 that narrow the bracket to one key.
  """
  vocab = probs_RxV.shape[-1]

  def as_float(key_R):
    return jax.lax.bitcast_convert_type(key_R, jnp.float32)[:, None]

  # A float max is a fast library reduction where a uint32 max is not.
  hi_R = jax.lax.bitcast_convert_type(jnp.max(probs_RxV, axis=-1),
                                      jnp.uint32)
  # The mass above x is at least total - V * x (at most V entries lie at or
  # below x), so it stays >= limit up to x = (total - limit) / V. Half of
  # that bound clears the float32 sums' rounding by a wide margin when
  # total - limit >= 1e-3; otherwise lo stays 0.
  gap_R = jnp.sum(probs_RxV, axis=-1) - limit
  floor_R = jnp.where(gap_R >= 1e-3, 0.5 * gap_R / vocab, 0.0)
  lo_R = jnp.minimum(jax.lax.bitcast_convert_type(floor_R, jnp.uint32), hi_R)

  def halve(lo_R, hi_R):
    mid_R = lo_R + (hi_R - lo_R) // 2
    # Where denormals flush to zero in comparisons (XLA CPU), a denormal
    # `mid` acts as 0, as it does in the caller's final `probs >= t`.
    above_R = jnp.sum(jnp.where(probs_RxV > as_float(mid_R), probs_RxV, 0.0),
                      axis=-1)
    ok_R = above_R < limit
    return jnp.where(ok_R, lo_R, mid_R + 1), jnp.where(ok_R, mid_R, hi_R)

  def snap(lo_R, hi_R):
    inside_RxV = (probs_RxV >= as_float(lo_R)) & (probs_RxV <= as_float(hi_R))
    top_R = jnp.max(jnp.where(inside_RxV, probs_RxV, -1.0), axis=-1)
    bottom_R = jnp.min(jnp.where(inside_RxV, probs_RxV, 2.0), axis=-1)
    top_key_R = jax.lax.bitcast_convert_type(top_R, jnp.uint32)
    # lo >= 1 rules out the answer 0 (keep everything); the key check keeps
    # a value that flushing moved out of the bracket from being taken.
    one_R = ((top_R == bottom_R) & (lo_R >= 1) & (top_key_R >= lo_R)
             & (top_key_R <= hi_R))
    return (jnp.where(one_R, top_key_R, lo_R),
            jnp.where(one_R, top_key_R, hi_R))

  for _ in range(_SNAP_AFTER):
    lo_R, hi_R = halve(lo_R, hi_R)

  def check_then_halve(lo_hi):
    lo_R, hi_R = snap(*lo_hi)
    for _ in range(_SNAP_EVERY):
      lo_R, hi_R = halve(lo_R, hi_R)
    return lo_R, hi_R

  # A row with lo == hi is done; halving it again leaves it as it is.
  lo_R, _ = jax.lax.while_loop(lambda lo_hi: jnp.any(lo_hi[0] < lo_hi[1]),
                               check_then_halve, (lo_R, hi_R))
  return lo_R


def _radix_select(key_RxV, count_RxV, limit):
  """The radix method of `_min_key_with_weight_above_below` on `[R, V]`
  int32 counts."""
  rows = key_RxV.shape[0]
  row_Rx1 = jnp.arange(rows)[:, None]
  prefix_R = jnp.zeros((rows,), jnp.uint32)  # the digits found so far
  base_R = jnp.zeros((rows,), jnp.int32)  # count above the prefix
  shift = 32
  for level, bits in enumerate(_RADIX_BITS):
    shift -= bits
    digit_RxV = ((key_RxV >> shift) & ((1 << bits) - 1)).astype(jnp.int32)
    if level:
      active_RxV = (key_RxV >> (shift + bits)) == prefix_R[:, None]
      count_RxV = jnp.where(active_RxV, count_RxV, 0)
    hist_RxD = jnp.zeros((rows, 1 << bits), jnp.int32).at[
        row_Rx1, digit_RxV].add(count_RxV)
    # above_RxD[r, d]: count of the keys above digit d (the prefix's base
    # plus the higher digits' buckets). The last digit has base alone, which
    # is below the limit, so the first digit below it exists.
    suffix_RxD = jnp.cumsum(hist_RxD[:, ::-1], axis=-1)[:, ::-1]
    above_RxD = base_R[:, None] + jnp.concatenate(
        [suffix_RxD[:, 1:], jnp.zeros((rows, 1), jnp.int32)], axis=-1)
    digit_R = jnp.argmax(above_RxD < limit, axis=-1).astype(jnp.int32)
    base_R = jnp.take_along_axis(above_RxD, digit_R[:, None], axis=-1)[:, 0]
    prefix_R = (prefix_R << bits) | digit_R.astype(jnp.uint32)
  return prefix_R


def _kth_largest(x_xV, k, method=None):
  """The k-th largest entry of each row (counted with multiplicity): `[...]`.

  Equal to `lax.top_k(x_xV, k)[0][..., -1]` (same total order as XLA's
  top-k, up to the sign of zero), for 1 <= k <= V.
  """
  if method is None and k <= _TOP_K_PARTIAL_SORT_MAX:
    method = "top_k"
  if method == "top_k":
    # min, not [..., -1]: XLA CPU rewrites a slice of top_k's values into a
    # full sort (far slower), but keeps its fast TopK for a reduce.
    # The min runs on ordered keys: a float min flushes a denormal to 0.
    return _key_to_float(jnp.min(_ordered_key(jax.lax.top_k(x_xV, k)[0]),
                                 axis=-1))
  # The k-th largest is the smallest t with fewer than k entries above it.
  key_xV = _ordered_key(x_xV)
  ones_xV = jnp.ones(x_xV.shape, jnp.int32)
  return _key_to_float(
      _min_key_with_weight_above_below(key_xV, ones_xV, k, method))


def _top_p_threshold(probs_xV, top_p, method=None):
  """The smallest kept probability of each row under top-p: float32 `[...]`.

  Keeping `probs >= threshold` keeps exactly the tokens of the shortest
  sorted prefix whose mass before each token is < top_p, with all ties of
  the last one. The mass above a candidate is a float32 masked sum over the
  row, not a cumulative sum along a sorted row, so where that mass is
  within float32 rounding of top_p the boundary token can fall on the other
  side than a sort-based implementation puts it. Such a token is kept iff
  this function's own float32 estimate of the mass above it is
  < float32(top_p).
  """
  # Probabilities are >= +0, whose bit patterns already order as the floats.
  key_xV = jax.lax.bitcast_convert_type(probs_xV, jnp.uint32)
  limit = jnp.asarray(top_p, jnp.float32)
  return jax.lax.bitcast_convert_type(
      _min_key_with_weight_above_below(key_xV, probs_xV, limit, method),
      jnp.float32)


# The batched inverse CDF runs in two levels over a fixed split of the
# vocabulary into `cdf_chunks(V)` equal chunks (see `sample_from_probs`).
_MAX_CDF_CHUNKS = 64


def cdf_chunks(vocab: int) -> int:
  """How many equal chunks the batched inverse CDF splits `vocab` into.

  The largest power of two C <= 64 that divides V with C * C <= V (so a chunk
  is at least as wide as the chunk count): 16 for 256 (and 259 -> 1, 32000
  -> 64). A function of V alone, never of the device mesh, so that every
  mesh runs the same additions in the same order.
  """
  vocab = _checks.check_int("vocab", vocab, low=1)
  chunks = 1
  while (chunks * 2 <= _MAX_CDF_CHUNKS and vocab % (chunks * 2) == 0
         and (chunks * 2) ** 2 <= vocab):
    chunks *= 2
  return chunks


def _monotone_cdf(probs_xN):
  """Inclusive CDF along the last axis, held flat at zero-mass entries.

  XLA's cumsum adds in blocks, so it is not monotone to the last ulp and can
  step up at a zero-mass entry; holding the CDF flat there (cummax of the
  sums at positive entries) makes such entries unreachable.
  """
  return jax.lax.cummax(
      jnp.where(probs_xN > 0, jnp.cumsum(probs_xN, axis=-1), 0),
      axis=probs_xN.ndim - 1)


def _last_positive(probs_xN):
  """Index of the last entry with mass along the last axis; -1 if none.

  A max over positions (not a flip and argmax), so a sharded axis costs one
  all-reduce of a scalar per row.
  """
  index_N = jnp.arange(probs_xN.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(probs_xN > 0, index_N, -1), axis=-1)


def sample_from_probs(uniform_x: jax.Array, probs_xV: jax.Array) -> jax.Array:
  """Inverse-CDF sample: one token per uniform in [0, 1). Returns int32 `[...]`.

  `probs_xV` is `[..., V]` or a single `[V]` shared by every uniform (then the
  CDF is computed once and searched, O(V + N log V)). The rows need not be
  normalised: the total mass is read off the CDF. Tokens of zero mass are
  never returned; a row of zero total mass returns token 0 (callers guard).

  Batched rows are sampled in two levels over the C = `cdf_chunks(V)` equal
  chunks of the vocabulary: each chunk's CDF (cumsum within the chunk), the
  CDF of the C chunk masses, a chunk picked with u * total, and the index
  within it found on the chunk's own CDF at u * total minus the mass before
  the chunk. The law is the inverse CDF's (token t has probability
  p_t / total, up to float32 rounding of the sums). A vocabulary sharded on
  a mesh axis splits into whole chunks, so each device scans its own; only
  the `[..., C]` chunk masses and per-row scalars cross devices, where a
  single CDF would all-gather each `[..., V]` row. The additions depend on V
  alone, so a row draws the same token for the same probabilities and
  uniform on every mesh.
  """
  vocab = probs_xV.shape[-1]
  if probs_xV.ndim == 1:
    cdf_V = _monotone_cdf(probs_xV)
    idx_x = jnp.searchsorted(cdf_V, uniform_x.astype(cdf_V.dtype) * cdf_V[-1],
                             side="right")
    # u * total can round up to total; fall back to the last token with mass.
    idx_x = jnp.minimum(idx_x, _last_positive(probs_xV))
    return jnp.maximum(idx_x, 0).astype(jnp.int32)
  chunks = cdf_chunks(vocab)
  width = vocab // chunks
  probs_xCxW = probs_xV.reshape(probs_xV.shape[:-1] + (chunks, width))
  cdf_xCxW = _monotone_cdf(probs_xCxW)
  mass_xC = cdf_xCxW[..., -1]
  cdf_xC = _monotone_cdf(mass_xC)
  target_x = uniform_x.astype(cdf_xC.dtype) * cdf_xC[..., -1]
  # The first chunk whose CDF passes the target (it has mass); u * total can
  # round up to total: then the last chunk with mass.
  chunk_x = jnp.maximum(jnp.minimum(
      jnp.sum(cdf_xC <= target_x[..., None], axis=-1),
      _last_positive(mass_xC)), 0)
  before_x = jnp.where(chunk_x > 0, jnp.take_along_axis(
      cdf_xC, jnp.maximum(chunk_x - 1, 0)[..., None], axis=-1)[..., 0], 0)
  # >= 0 exactly: the chosen chunk's predecessor's CDF is <= target.
  within_target_x = target_x - before_x
  chosen_xC = jnp.arange(chunks, dtype=jnp.int32) == chunk_x[..., None]
  # Per chunk: the within-chunk index at the target, clipped to the chunk's
  # last token with mass (the subtraction can round the target up to the
  # chunk's total); only the chosen chunk's counts (one scalar per row).
  within_xC = jnp.minimum(
      jnp.sum(cdf_xCxW <= within_target_x[..., None, None], axis=-1),
      _last_positive(probs_xCxW))
  within_x = jnp.sum(jnp.where(chosen_xC, within_xC, 0), axis=-1)
  return jnp.maximum(chunk_x * width + within_x, 0).astype(jnp.int32)


def sample(key: jax.Array, probs_xV: jax.Array) -> jax.Array:
  """Draws one token per row of `probs_xV` `[..., V]`; returns int32 `[...]`.

  Rows are non-negative finite weights with positive mass; token t is drawn
  with probability probs[t] / sum(probs) (rows need not sum to 1). Uniforms
  and CDFs are float32 at least (float64 under x64): a bfloat16 uniform takes
  128 values, which would distort the law.
  """
  key = _checks.as_key("key", key)
  if key.shape:
    raise ValueError(f"key must be a single PRNG key; got a key array of "
                     f"shape {key.shape}. sample draws every row from one "
                     "key (for a key per row, jax.vmap over the rows).")
  probs_xV = check_probs("probs", probs_xV, normalised=False)
  u = jax.random.uniform(key, probs_xV.shape[:-1], dtype=probs_xV.dtype)
  return sample_from_probs(u, probs_xV)


def check_probs(name: str, probs_xV: Any, *, normalised: bool) -> jax.Array:
  """`probs_xV` as a float `[..., V >= 1]` array of at least float32.

  Concrete values (outside jit) must be finite and non-negative, and each
  row must sum to 1 (`normalised`; within the input dtype's epsilon, at
  least 1e-4) or else have positive mass: a NaN, a negative entry, logits
  or an all-zero row would otherwise give a token silently. Traced values
  are checked for shape and dtype only.
  """
  probs_xV = _checks.check_array(name, probs_xV, min_rank=1, kind="f")
  if probs_xV.shape[-1] < 1:
    raise ValueError(f"{name} has an empty vocabulary axis: shape "
                     f"{tuple(probs_xV.shape)}.")
  eps = float(jnp.finfo(probs_xV.dtype).eps)
  if _checks.is_concrete(probs_xV):
    # On the values as given, before the cast to float32: 1e300 read as
    # "NaN or inf", and 1e-300 as "a row is all zeros".
    host = np.asarray(probs_xV, np.float64)
    if host.size and np.isfinite(host).all() and (
        np.abs(host).max() > np.finfo(np.float32).max):
      raise ValueError(f"{name} holds {np.abs(host).max():g}, past float32's "
                       "range: rescale the rows (e.g. divide each by its "
                       "max).")
    check_law_values(name, host, normalised=normalised,
                     tol=max(SUM_TOLERANCE, eps))
  probs_xV = jnp.asarray(probs_xV)  # float64 only under x64
  if jnp.finfo(probs_xV.dtype).bits < 32:
    probs_xV = probs_xV.astype(jnp.float32)
  return probs_xV


# Slack on a row's sum: a float32 softmax row sums to 1 within ~1e-6; this
# also admits rows renormalised in lower precision (specjax.testing's too).
SUM_TOLERANCE = 1e-4


def check_law_values(name: str, x: np.ndarray, *, normalised: bool,
                     tol: float = SUM_TOLERANCE) -> None:
  """Raises unless the float64 `x` `[..., V]` holds finite, non-negative rows
  that each sum to 1 within `tol` (`normalised`) or else have positive
  mass (`check_probs`'s value checks, on host arrays)."""
  if not x.size:
    return
  if not np.isfinite(x).all():
    raise ValueError(f"{name} holds NaN or inf; pass probabilities (e.g. "
                     "specjax.probabilities(logits, sampling)).")
  if (x < 0).any():
    raise ValueError(f"{name} has negative entries (min {x.min():g}); pass "
                     "probabilities, not logits.")
  total = x.sum(axis=-1)
  if normalised:
    worst = float(np.abs(total - 1).max())
    if worst > tol:
      raise ValueError(
          f"every row of {name} must sum to 1 (within {tol:g}); one is off "
          f"by {worst:g}. Pass probabilities (e.g. "
          "specjax.probabilities(logits, sampling)).")
  elif (total <= 0).any():
    raise ValueError(f"every row of {name} needs positive mass; a row is all "
                     "zeros.")
  elif total.min() < np.finfo(np.float32).tiny:
    # XLA on CPU flushes float32 denormals to 0: the CDF of such a row is
    # all zeros, and every draw would be token 0.
    raise ValueError(f"a row of {name} has total mass {total.min():g}, below "
                     "float32's smallest normal number "
                     f"({np.finfo(np.float32).tiny:g}): rescale the rows "
                     "(e.g. divide each by its max).")
  elif total.max() > np.finfo(np.float32).max:
    # The float32 CDF's total would be inf, and every draw the last token.
    raise ValueError(f"a row of {name} has total mass {total.max():g}, past "
                     "float32's range: rescale the rows (e.g. divide each by "
                     "its max).")
