"""The maximal coupling at the heart of speculative sampling.

Given a target distribution p and a draft distribution q over the same
vocabulary, and a draft token x ~ q, `coupling_sample` keeps x with
probability min(1, p(x)/q(x)) and otherwise emits one draw from the residual
(p - q)+ / sum (p - q)+. The emitted token is distributed exactly as p, and
x is kept with probability sum_x min(p(x), q(x)) = 1 - TV(p, q), the largest
any exact rule can achieve (speculative sampling is a maximal coupling of p
and q).

All functions are pure `jnp`, batched over any leading axes, and jit-able.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax import sampling


def check_laws(p_xV, q_xV, names=("p", "q")):
  """p and q as arrays of one float dtype (float32 at least: a bfloat16
  uniform or CDF would distort the coupling's law), of one vocabulary and
  broadcasting leading axes; concrete values must be distributions
  (`sampling.check_probs`). `names`: how errors name the two."""
  (a, p_xV), (b, q_xV) = ((name, sampling.check_probs(name, x, normalised=True))
                          for name, x in zip(names, (p_xV, q_xV)))
  if p_xV.shape[-1] != q_xV.shape[-1]:
    raise ValueError(
        f"{a} and {b} must share the vocabulary axis (last): {a} has "
        f"{p_xV.shape[-1]} tokens, {b} has {q_xV.shape[-1]}. Target and draft "
        "must use the same tokenizer.")
  try:
    jnp.broadcast_shapes(p_xV.shape, q_xV.shape)
  except ValueError:
    raise ValueError(f"{a} {tuple(p_xV.shape)} and {b} {tuple(q_xV.shape)} do "
                     "not broadcast against each other.") from None
  dtype = jnp.result_type(p_xV.dtype, q_xV.dtype)
  return jnp.asarray(p_xV, dtype), jnp.asarray(q_xV, dtype)


def residual(p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """The residual distribution (p - q)+ / sum (p - q)+, shape `[..., V]`.

  Where p == q (zero residual mass) no rejection can happen; the row returned
  there is p itself, so the result is always a distribution, never NaN.
  """
  p_xV, q_xV = check_laws(p_xV, q_xV)
  return _residual(p_xV, q_xV)


def _residual(p_xV, q_xV):
  unnormalised_xV = _unnormalised_residual(p_xV, q_xV)
  return unnormalised_xV / jnp.sum(unnormalised_xV, axis=-1, keepdims=True)


def _unnormalised_residual(p_xV, q_xV):
  """(p - q)+, or p itself where that has no mass: what the samplers draw
  from. `sample_from_probs` reads the total off its CDF, so nothing is
  divided by a sum over V (a sum whose rounding would depend on how a
  sharded vocabulary is split); whether the excess has mass is exact."""
  excess_xV = jnp.maximum(p_xV - q_xV, 0)
  has_mass_x1 = jnp.any(excess_xV > 0, axis=-1, keepdims=True)
  return jnp.where(has_mass_x1, excess_xV,
                   jnp.broadcast_to(p_xV, excess_xV.shape))


def acceptance_probability(p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """sum_x min(p(x), q(x)) = 1 - TV(p, q): the chance a draft token is kept."""
  p_xV, q_xV = check_laws(p_xV, q_xV)
  return jnp.sum(jnp.minimum(p_xV, q_xV), axis=-1)


def tv_distance(p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """Total variation distance 0.5 * sum_x |p(x) - q(x)|, shape `[...]`."""
  p_xV, q_xV = check_laws(p_xV, q_xV)
  return 0.5 * jnp.sum(jnp.abs(p_xV - q_xV), axis=-1)


def _gather(probs_xV, token_x):
  if probs_xV.ndim == 1:
    return probs_xV[token_x]
  return jnp.take_along_axis(probs_xV, token_x[..., None], axis=-1)[..., 0]


def coupling_sample(key: jax.Array, p_xV: jax.Array, q_xV: jax.Array,
                    draft_token_x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One speculative accept/reject step, batched.

  Args:
    key: a PRNG key, either one key (split over the batch) or an array of keys
      of shape `[...]` (one per element; the decode loop passes keys folded per
      row so that a row's randomness does not depend on the batch).
    p_xV: target probabilities `[..., V]`, or `[V]` shared by the whole batch.
    q_xV: draft probabilities, same shape rules as p.
    draft_token_x: int `[...]`, the token the caller drew from q.

  Returns:
    token: int32 `[...]`, distributed exactly as p (up to float rounding).
    accepted: bool `[...]`, whether the draft token was kept; its probability
      is sum min(p, q).

  Edge cases: if q(x) = 0 the draft is kept iff p(x) > 0; if the residual has
  zero mass (p == q) a rejection can only come from rounding and is resolved
  by drawing from p; zero entries of p are never emitted.
  """
  p_xV, q_xV = check_laws(p_xV, q_xV)
  draft_token_x = _checks.check_array("draft_token", draft_token_x, kind="i")
  if _checks.is_concrete(draft_token_x):
    # Else a gather wraps or clamps it, and keeps it as if it were drawn.
    _checks.check_token_range("draft_token", draft_token_x, p_xV.shape[-1])
  batch = tuple(draft_token_x.shape)
  for name, probs in (("p", p_xV), ("q", q_xV)):
    if probs.ndim != 1 and tuple(probs.shape[:-1]) != batch:
      raise ValueError(
          f"{name} has shape {tuple(probs.shape)}; it must be [V] or "
          f"draft_token.shape + [V] = {batch + (probs.shape[-1],)}.")
  key = _checks.as_key("key", key)
  if key.shape == ():
    u_x2 = jax.random.uniform(key, batch + (2,), dtype=p_xV.dtype)
  elif tuple(key.shape) == batch:
    flat = key.reshape(-1)
    u_x2 = jax.vmap(lambda k: jax.random.uniform(k, (2,), dtype=p_xV.dtype))(
        flat).reshape(batch + (2,))
  else:
    raise ValueError(f"key must be a single key or have the batch shape {batch}"
                     f", got key shape {tuple(key.shape)}.")
  return _coupling(u_x2[..., 0], u_x2[..., 1], p_xV, q_xV,
                   draft_token_x.astype(jnp.int32))


def _coupling(u_accept_x, u_residual_x, p_xV, q_xV, draft_token_x):
  """coupling_sample on pre-drawn uniforms (the decode loop's entry point)."""
  p_x = _gather(p_xV, draft_token_x)
  q_x = _gather(q_xV, draft_token_x)
  # u < p/q without dividing: exact for q = 0 and for one-hot (greedy) rows.
  accepted_x = u_accept_x * q_x < p_x
  fallback_x = sampling.sample_from_probs(u_residual_x,
                                          _unnormalised_residual(p_xV, q_xV))
  token_x = jnp.where(accepted_x, draft_token_x, fallback_x)
  return token_x.astype(jnp.int32), accepted_x


def _first_rejection(u_accept_BxG, u_residual_BxG, u_bonus_B, p_BxG1xV,
                     q_BxGxV, drafts_BxG):
  """The token-level rule of a whole round, drawing only the one token a row
  emits after its kept drafts.

  Applies `_coupling` left to right to the G drafts of each row: with the
  same uniforms it keeps the same drafts and emits the same final token as
  `_coupling` at every position followed by a bonus draw, but builds the
  residual (and its CDF) only at each row's first rejection, and merges it
  with the bonus draw into one `[B, V]` sample.

  Args:
    u_accept_BxG, u_residual_BxG: float32 uniforms of each position.
    u_bonus_B: float32 uniform of the bonus draw.
    p_BxG1xV: target probabilities at the G + 1 positions.
    q_BxGxV: draft probabilities at the G drafted positions.
    drafts_BxG: int32 draft tokens.

  Returns:
    num_accepted_B: int32 in [0, G], the kept prefix.
    last_B: int32, the residual draw at position num_accepted (< G) or the
      bonus draw from p at position G.
  """
  gamma = drafts_BxG.shape[1]
  p_BxGxV = p_BxG1xV[:, :gamma]
  p_BxG = _gather(p_BxGxV, drafts_BxG)
  q_BxG = _gather(q_BxGxV, drafts_BxG)
  accepted_BxG = u_accept_BxG * q_BxG < p_BxG  # as in `_coupling`
  num_accepted_B = jnp.where(jnp.all(accepted_BxG, axis=1), gamma,
                             jnp.argmax(~accepted_BxG, axis=1)).astype(jnp.int32)
  at_B1 = jnp.minimum(num_accepted_B, gamma - 1)[:, None]
  p_rej_BxV = jnp.take_along_axis(p_BxGxV, at_B1[..., None], axis=1)[:, 0]
  q_rej_BxV = jnp.take_along_axis(q_BxGxV, at_B1[..., None], axis=1)[:, 0]
  all_kept_B = num_accepted_B == gamma
  probs_BxV = jnp.where(all_kept_B[:, None], p_BxG1xV[:, gamma],
                        _unnormalised_residual(p_rej_BxV, q_rej_BxV))
  u_B = jnp.where(all_kept_B, u_bonus_B,
                  jnp.take_along_axis(u_residual_BxG, at_B1, axis=1)[:, 0])
  last_B = sampling.sample_from_probs(u_B, probs_BxV)
  return num_accepted_B, last_B.astype(jnp.int32)


def _first_rejection_one_hot_p(u_accept_BxG, target_token_BxG1, q_BxGxV,
                               drafts_BxG):
  """`_first_rejection` for a one-hot p (greedy): from p's hot tokens alone.

  For p one-hot on a, p(x) = [x == a], and (p - q)+ is (1 - q(a))+ at a and
  0 elsewhere, so the residual draw (or p itself, when that mass is 0) is a
  for any q and any uniform: no `[B, G+1, V]` p, residual or CDF is built.

  Returns num_accepted_B, last_B as `_first_rejection`, and the overlap
  sum_x min(p, q) = min(1, q(a)) of each position, float32 `[B, G]`.
  """
  gamma = drafts_BxG.shape[1]
  p_BxG = (drafts_BxG == target_token_BxG1[:, :gamma]).astype(jnp.float32)
  q_BxG = _gather(q_BxGxV, drafts_BxG)
  accepted_BxG = u_accept_BxG * q_BxG < p_BxG
  num_accepted_B = jnp.where(jnp.all(accepted_BxG, axis=1), gamma,
                             jnp.argmax(~accepted_BxG, axis=1)).astype(jnp.int32)
  last_B = jnp.take_along_axis(target_token_BxG1, num_accepted_B[:, None],
                               axis=1)[:, 0]
  overlap_BxG = jnp.minimum(
      1.0, _gather(q_BxGxV, target_token_BxG1[:, :gamma]))
  return num_accepted_B, last_B.astype(jnp.int32), overlap_BxG
