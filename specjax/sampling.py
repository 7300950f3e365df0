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

import jax
import jax.numpy as jnp

from specjax import _checks


MIN_TEMPERATURE = 1e-4


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a next-token distribution. Hashable: a static jit arg.

  Attributes:
    temperature: 0 (greedy decoding: one-hot argmax) or >= MIN_TEMPERATURE.
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
  """
  _checks.check_array("logits", logits_xV, min_rank=1, kind="f")
  if not isinstance(config, SamplingConfig):
    raise TypeError("config must be a specjax.SamplingConfig, got "
                    f"{type(config).__name__}.")
  config.check_vocab(logits_xV.shape[-1])
  logits_xV = jnp.asarray(logits_xV).astype(jnp.float32)
  if config.greedy:
    best = jnp.argmax(logits_xV, axis=-1)  # first max: lowest id wins ties
    return jax.nn.one_hot(best, logits_xV.shape[-1], dtype=jnp.float32)
  if config.top_k:
    # Ranked on the raw logits: shifting and scaling can round distinct
    # logits together and let a token below the k-th largest tie into the set.
    kth = jax.lax.top_k(logits_xV, config.top_k)[0][..., -1:]
    in_top_k_xV = logits_xV >= kth
  # Shift before dividing: a tiny temperature then sends non-maximal logits
  # to -inf instead of overflowing every logit to inf (NaN after softmax).
  logits_xV = logits_xV - jnp.max(logits_xV, axis=-1, keepdims=True)
  logits_xV = logits_xV / config.temperature
  if config.top_k:
    logits_xV = jnp.where(in_top_k_xV, logits_xV, -jnp.inf)
  probs_xV = jax.nn.softmax(logits_xV, axis=-1)
  if config.top_p < 1.0:
    sorted_xV = -jnp.sort(-probs_xV, axis=-1)
    mass_before_xV = jnp.cumsum(sorted_xV, axis=-1) - sorted_xV
    # A sorted token is kept if the mass strictly above it is < top_p; the
    # smallest kept probability is the threshold, so ties are all kept.
    kept_xV = mass_before_xV < config.top_p
    threshold = jnp.min(jnp.where(kept_xV, sorted_xV, jnp.inf), axis=-1,
                        keepdims=True)
    probs_xV = jnp.where(probs_xV >= threshold, probs_xV, 0.0)
    probs_xV = probs_xV / jnp.sum(probs_xV, axis=-1, keepdims=True)
  return probs_xV


def sample_from_probs(uniform_x: jax.Array, probs_xV: jax.Array) -> jax.Array:
  """Inverse-CDF sample: one token per uniform in [0, 1). Returns int32 `[...]`.

  `probs_xV` is `[..., V]` or a single `[V]` shared by every uniform (then the
  CDF is computed once and searched, O(V + N log V)). The rows need not be
  normalised: the total mass is read off the CDF. Tokens of zero mass are
  never returned; a row of zero total mass returns token 0 (callers guard).
  """
  # XLA's cumsum adds in blocks, so it is not monotone to the last ulp and can
  # step up at a zero-mass token; holding the CDF flat there (cummax of the
  # sums at positive tokens) makes such tokens unreachable.
  cdf_xV = jax.lax.cummax(
      jnp.where(probs_xV > 0, jnp.cumsum(probs_xV, axis=-1), 0),
      axis=probs_xV.ndim - 1)
  total_x = cdf_xV[..., -1]
  target_x = uniform_x.astype(cdf_xV.dtype) * total_x
  if cdf_xV.ndim == 1:
    idx_x = jnp.searchsorted(cdf_xV, target_x, side="right")
  else:
    idx_x = jnp.sum(cdf_xV <= target_x[..., None], axis=-1)
  # u * total can round up to total; fall back to the last token with mass.
  vocab = probs_xV.shape[-1]
  last_positive_x = vocab - 1 - jnp.argmax(
      jnp.flip(probs_xV > 0, axis=-1), axis=-1)
  return jnp.minimum(idx_x, last_positive_x).astype(jnp.int32)


def sample(key: jax.Array, probs_xV: jax.Array) -> jax.Array:
  """Draws one token per row of `probs_xV` `[..., V]`; returns int32 `[...]`."""
  key = _checks.as_key("key", key)
  _checks.check_array("probs", probs_xV, min_rank=1, kind="f")
  # Draw the uniform at the probabilities' precision (float64 under x64).
  u = jax.random.uniform(key, probs_xV.shape[:-1], dtype=probs_xV.dtype)
  return sample_from_probs(u, probs_xV)
