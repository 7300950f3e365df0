"""The sort-based sampling transform that `specjax.sampling.probabilities`
replaced: the oracle's definition its kept sets are tested against (and the
baseline the sampling benchmark times it beside).

Temperature, then top-k on the raw logits (`lax.top_k`, ties at the k-th
value kept), then top-p on the sorted probabilities (the shortest sorted
prefix whose mass before each token is < top_p, ties at the smallest kept
probability kept), then renormalise.
"""

import jax
import jax.numpy as jnp


def _order(x):
  """int32 with the order of the float32 values x, denormals included (XLA
  CPU flushes them to zero in float comparisons); -0 ties with +0."""
  i = jax.lax.bitcast_convert_type(x, jnp.int32)
  return jnp.where(i < 0, -(i & 0x7FFFFFFF), i)


def probabilities(logits_xV, config):
  logits_xV = jnp.asarray(logits_xV).astype(jnp.float32)
  if config.greedy:
    best = jnp.argmax(logits_xV, axis=-1)
    return jax.nn.one_hot(best, logits_xV.shape[-1], dtype=jnp.float32)
  if config.top_k:
    kth = jax.lax.top_k(logits_xV, config.top_k)[0][..., -1:]
    in_top_k_xV = _order(logits_xV) >= _order(kth)
  logits_xV = logits_xV - jnp.max(logits_xV, axis=-1, keepdims=True)
  logits_xV = logits_xV / config.temperature
  if config.top_k:
    logits_xV = jnp.where(in_top_k_xV, logits_xV, -jnp.inf)
  probs_xV = jax.nn.softmax(logits_xV, axis=-1)
  if config.top_p < 1.0:
    probs_xV = top_p_mask(probs_xV, config.top_p)
    probs_xV = probs_xV / jnp.sum(probs_xV, axis=-1, keepdims=True)
  return probs_xV


def top_p_mask(probs_xV, top_p):
  """probs with the tokens outside the sorted top-p prefix set to 0."""
  sorted_xV = -jnp.sort(-probs_xV, axis=-1)
  mass_before_xV = jnp.cumsum(sorted_xV, axis=-1) - sorted_xV
  kept_xV = mass_before_xV < top_p
  threshold = jnp.min(jnp.where(kept_xV, sorted_xV, jnp.inf), axis=-1,
                      keepdims=True)
  return jnp.where(probs_xV >= threshold, probs_xV, 0.0)


probabilities_jit = jax.jit(probabilities, static_argnames=("config",))
