"""The two halves of a speculative round: `draft_step` and `verify_step`.

Both are pure functions of (model, cache, tokens, keys). The public versions
validate their arguments and run under `jax.jit`; the decode loop calls the
private `_draft_step` / `_verify_step` directly inside its own jit.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specjax import _checks
from specjax import coupling
from specjax import sampling as sampling_lib
from specjax.decode import validation


@flax.struct.dataclass(kw_only=True)
class VerifyOutput:
  """Result of verifying gamma drafts for a batch of B rows.

  tokens: int32 `[B, G+1]`; the first `num_emitted[b]` entries are what row b
    emits: its kept drafts, then the residual draw or the bonus token.
  num_accepted: int32 `[B]` in [0, G], drafts kept (a prefix).
  num_verified: int32 `[B]` in [0, G], drafts the target judged
    (num_accepted + 1, capped at G).
  overlap: float32 `[B]`, sum over judged positions of sum_x min(p, q): the
    expected number of acceptances at those positions.
  cache: the target cache after scoring all G+1 tokens (the caller rolls it
    back to the committed length).
  """
  tokens: jax.Array
  num_accepted: jax.Array
  num_verified: jax.Array
  overlap: jax.Array
  cache: Any

  @property
  def num_emitted(self) -> jax.Array:
    return self.num_accepted + 1


def _row_uniforms(keys_B: jax.Array, n: int) -> jax.Array:
  """`[B, n]` float32 uniforms, row b drawn from keys_B[b] alone."""
  return jax.vmap(lambda k: jax.random.uniform(k, (n,)))(keys_B)


def _sample(u_x, probs_xV, sampling):
  """`sample_from_probs(u_x, probs_xV)`, short-cut to an argmax when greedy.

  Greedy `probabilities` are exactly one-hot, and for a one-hot row
  `sample_from_probs` returns the hot index for every u in [0, 1), so the
  result is the same without the CDF.
  """
  if sampling.greedy:
    return jnp.argmax(probs_xV, axis=-1).astype(jnp.int32)
  return sampling_lib.sample_from_probs(u_x, probs_xV)


def _draft_step(draft, cache, tokens_BxT, keys_B, sampling, select_B=None):
  u_B = None
  if not getattr(draft, "one_hot_q", False):
    u_B = _row_uniforms(keys_B, 1)[:, 0]
  return _draft_sample(draft, cache, tokens_BxT, u_B, sampling, select_B)


def _draft_sample(draft, cache, tokens_BxT, u_B, sampling, select_B=None):
  """`_draft_step` on a pre-drawn uniform per row (`u_B[b]` is what
  `_row_uniforms(keys_B, 1)` draws), so the decode loop can draw a whole
  round's uniforms in one vectorised call."""
  logits_BxTxV, cache = draft(tokens_BxT, cache)
  if select_B is None:
    logits_BxV = logits_BxTxV[:, -1]
  else:
    logits_BxV = jnp.take_along_axis(
        logits_BxTxV, select_B[:, None, None], axis=1)[:, 0]
  q_BxV = sampling_lib.probabilities(logits_BxV, sampling)
  if getattr(draft, "one_hot_q", False):
    token_B = jnp.argmax(q_BxV, axis=-1).astype(jnp.int32)
  else:
    token_B = _sample(u_B, q_BxV, sampling)
  return token_B, q_BxV, cache


def _verify_step(target, cache, last_B, drafts_BxG, q_BxGxV, keys_B, sampling,
                 coupling_rule=coupling._coupling, num_drafts_B=None):
  gamma = drafts_BxG.shape[1]
  tokens_BxG1 = jnp.concatenate([last_B[:, None], drafts_BxG], axis=1)
  logits_BxG1xV, cache = target(tokens_BxG1, cache)
  p_BxG1xV = sampling_lib.probabilities(logits_BxG1xV, sampling)
  u_BxN = _row_uniforms(keys_B, 2 * gamma + 1)
  bonus_B = _sample(u_BxN[:, 2 * gamma], p_BxG1xV[:, gamma], sampling)
  if gamma == 0:  # plain autoregressive step: the "bonus" is the sample.
    zeros_B = jnp.zeros_like(last_B)
    return VerifyOutput(tokens=bonus_B[:, None], num_accepted=zeros_B,
                        num_verified=zeros_B,
                        overlap=jnp.zeros(last_B.shape, jnp.float32),
                        cache=cache)
  p_BxGxV = p_BxG1xV[:, :gamma]
  # Every position gets its own coupling draw; only those up to the first
  # rejection are used, which is what judging left to right would produce.
  coupled_BxG, accepted_BxG = coupling_rule(
      u_BxN[:, :gamma], u_BxN[:, gamma:2 * gamma], p_BxGxV, q_BxGxV,
      drafts_BxG)
  # Length of the accepted prefix: index of the first rejection, else G.
  num_accepted_B = jnp.where(jnp.all(accepted_BxG, axis=1), gamma,
                             jnp.argmax(~accepted_BxG, axis=1)).astype(jnp.int32)
  drafted_B = gamma
  if num_drafts_B is not None:
    # Row b stopped drafting after num_drafts_B[b] <= G tokens (an adaptive
    # draft length): it keeps at most those. When it keeps them all, its last
    # token is the coupled output at the next position (the next draft kept,
    # or the residual draw), an exact sample from p there: that draft was
    # drawn from q independently of the decision to stop.
    drafted_B = num_drafts_B
    num_accepted_B = jnp.minimum(num_accepted_B, num_drafts_B)
  positions_G1 = jnp.arange(gamma + 1)
  rejected_token_B = jnp.take_along_axis(
      coupled_BxG, jnp.minimum(num_accepted_B, gamma - 1)[:, None], axis=1)[:, 0]
  last_token_B = jnp.where(num_accepted_B < gamma, rejected_token_B, bonus_B)
  emitted_BxG1 = jnp.concatenate([drafts_BxG, bonus_B[:, None]], axis=1)
  emitted_BxG1 = jnp.where(positions_G1 == num_accepted_B[:, None],
                           last_token_B[:, None], emitted_BxG1)
  num_verified_B = jnp.minimum(num_accepted_B + 1, drafted_B)
  overlap_BxG = jnp.sum(jnp.minimum(p_BxGxV, q_BxGxV), axis=-1)
  judged_BxG = positions_G1[:gamma] < num_verified_B[:, None]
  return VerifyOutput(
      tokens=emitted_BxG1.astype(jnp.int32), num_accepted=num_accepted_B,
      num_verified=num_verified_B,
      overlap=jnp.sum(jnp.where(judged_BxG, overlap_BxG, 0.0), axis=1),
      cache=cache)


_draft_step_jit = jax.jit(_draft_step, static_argnames=("sampling",))
_verify_step_jit = jax.jit(_verify_step, static_argnames=("sampling",))


def draft_step(draft, cache, tokens_BxT, keys_B, sampling, select_B=None):
  """The draft proposes one token per row.

  Args:
    draft: a `CausalLM` pytree.
    cache: the draft's cache; token t of row b goes to position
      `cache.lengths[b] + t`.
    tokens_BxT: int `[B, T]` tokens to feed (T >= 1).
    keys_B: PRNG keys `[B]`, one per row.
    sampling: the `SamplingConfig` shared with the target.
    select_B: optional int `[B]`: which of the T positions predicts the next
      token (default: the last).

  Returns:
    token_B: int32 `[B]` drawn from q; q_BxV: float32 `[B, V]` the draft
    distribution (after the sampling transform); the advanced cache.
  """
  tokens_BxT = _checks.check_array("tokens", tokens_BxT, rank=2, kind="i")
  validation.check_model("draft", draft)
  validation.check_sampling(sampling, draft.vocab_size)
  keys_B = validation.row_keys("keys", keys_B, tokens_BxT.shape[0])
  return _draft_step_jit(draft, cache, jnp.asarray(tokens_BxT, jnp.int32),
                         keys_B, sampling, select_B)


def verify_step(target, cache, last_B, drafts_BxG, q_BxGxV, keys_B,
                sampling) -> VerifyOutput:
  """The target judges G drafts per row in one forward pass.

  Feeds `[last, x_1, ..., x_G]` (G+1 tokens) at positions
  `cache.lengths[b] ...`, turns the logits into p with `sampling`, keeps
  drafts left to right with probability min(1, p/q), draws the residual at the
  first rejection, or a bonus token from p at position G+1 if all are kept.
  The emitted tokens are distributed exactly as sampling from the target.

  Args:
    target: a `CausalLM` pytree. cache: its cache.
    last_B: int `[B]`, the last committed token of each row.
    drafts_BxG: int `[B, G]`, the draft tokens (G >= 0; G = 0 is a plain
      autoregressive step).
    q_BxGxV: float `[B, G, V]`, the distributions the drafts were drawn from.
    keys_B: PRNG keys `[B]`.
    sampling: the `SamplingConfig` used for the draft.
  """
  validation.check_model("target", target)
  last_B = _checks.check_array("last", last_B, rank=1, kind="i")
  drafts_BxG = _checks.check_array("drafts", drafts_BxG, rank=2, kind="i")
  q_BxGxV = _checks.check_array("q", q_BxGxV, rank=3, kind="f")
  b = last_B.shape[0]
  if drafts_BxG.shape[0] != b or q_BxGxV.shape[:2] != drafts_BxG.shape:
    raise ValueError(f"drafts {tuple(drafts_BxG.shape)} and q "
                     f"{tuple(q_BxGxV.shape)} must be [B, G] and [B, G, V] "
                     f"with B = len(last) = {b}.")
  if q_BxGxV.shape[2] != target.vocab_size:
    raise ValueError(f"q has vocabulary {q_BxGxV.shape[2]} but the target has "
                     f"{target.vocab_size}; draft and target must share it.")
  validation.check_sampling(sampling, target.vocab_size)
  keys_B = validation.row_keys("keys", keys_B, b)
  return _verify_step_jit(target, cache, jnp.asarray(last_B, jnp.int32),
                          jnp.asarray(drafts_BxG, jnp.int32),
                          jnp.asarray(q_BxGxV, jnp.float32), keys_B, sampling)
