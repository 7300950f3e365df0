"""One round with an adaptive draft length (see `draft_length` for the rules).

`propose` drafts until every active row has stopped (or gamma_max), under a
`lax.while_loop`, so a round whose rows all stop early runs fewer draft
passes; `verify` scores the W drafted positions in a target pass of static
width W + 1 chosen by `lax.switch` (one compiled branch per W in
1..gamma_max), so a short round also pays for a short verify pass. Buffers
keep the static shapes `[B, gamma_max]` and `[B, gamma_max, V]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode import steps


def propose(draft, state, rule, keys_BxG, sampling, first_draft):
  """Drafts with early stops.

  Args:
    draft: the draft model. state: the loop's `DecodeState`.
    rule: a `draft_length.Rule` (static).
    keys_BxG: `[B, gamma_max]` keys, column i for the (i+1)-th draft (the
      fixed-gamma loop's keys, so a row's draws do not depend on the rule).
    sampling: the sampling config.
    first_draft: `keys_Bx1 -> (x_Bx1, q_Bx1xV, cache)`, the loop's own first
      draft step (it knows the draft's cache conventions).

  Returns:
    drafts_BxG int32 (columns >= W unused), q_BxGxV float32, the draft cache,
    lengths_B int32 in [1, W] (each row's draft length) and W (int32 scalar,
    draft passes run).
  """
  gamma_max = rule.gamma_max
  active_B = ~state.done
  budget_B = rule.plan(state.stats, active_B)
  u_BxG = jax.vmap(lambda k_B: steps._row_uniforms(k_B, 1)[:, 0],
                   in_axes=1, out_axes=1)(keys_BxG)
  x_Bx1, q_Bx1xV, cache = first_draft(keys_BxG[:, :1])
  x_B, q_BxV = x_Bx1[:, 0], q_Bx1xV[:, 0]
  batch, vocab = q_BxV.shape
  drafts_BxG = jnp.zeros((batch, gamma_max), jnp.int32).at[:, 0].set(x_B)
  q_BxGxV = jnp.zeros((batch, gamma_max, vocab), jnp.float32).at[:, 0].set(
      q_BxV)

  def decide(count, q_BxV, x_B, stopped_B, lengths_B):
    stop_B, keep_B = rule.stop(count, q_BxV, x_B)
    at_budget_B = budget_B <= count
    newly_B = ~stopped_B & (stop_B | at_budget_B)
    lengths_B = jnp.where(newly_B, jnp.where(stop_B, keep_B, count),
                          lengths_B)
    return stopped_B | newly_B, lengths_B

  stopped_B, lengths_B = decide(
      jnp.int32(1), q_BxV, x_B, ~active_B,
      jnp.full((batch,), gamma_max, jnp.int32))

  def cond(carry):
    count, _, _, _, _, stopped_B, _ = carry
    return (count < gamma_max) & jnp.any(~stopped_B)

  def body(carry):
    count, cache, x_B, drafts_BxG, q_BxGxV, stopped_B, lengths_B = carry
    u_B = jax.lax.dynamic_index_in_dim(u_BxG, count, axis=1, keepdims=False)
    x_B, q_BxV, cache = steps._draft_sample(draft, cache, x_B[:, None], u_B,
                                            sampling)
    drafts_BxG = jax.lax.dynamic_update_index_in_dim(drafts_BxG, x_B, count,
                                                     axis=1)
    q_BxGxV = jax.lax.dynamic_update_index_in_dim(q_BxGxV, q_BxV, count,
                                                  axis=1)
    count = count + 1
    stopped_B, lengths_B = decide(count, q_BxV, x_B, stopped_B, lengths_B)
    return count, cache, x_B, drafts_BxG, q_BxGxV, stopped_B, lengths_B

  width, cache, _, drafts_BxG, q_BxGxV, _, lengths_B = jax.lax.while_loop(
      cond, body, (jnp.int32(1), cache, x_B, drafts_BxG, q_BxGxV, stopped_B,
                   lengths_B))
  lengths_B = jnp.clip(lengths_B, 1, width)
  return drafts_BxG, q_BxGxV, cache, lengths_B, width


def verify(target, cache, last_B, drafts_BxG, q_BxGxV, lengths_B, width,
           keys_B, sampling, coupling_rule, verifier=None,
           return_hidden=False):
  """`steps._verify_step` on the first `width` drafts, each row keeping at
  most `lengths_B[b]` of them; tokens (and hidden features, when asked for)
  padded to `[B, gamma_max + 1, ...]`."""
  gamma_max = drafts_BxG.shape[1]

  def branch(w):
    def run(cache):
      out = steps._verify_step(target, cache, last_B, drafts_BxG[:, :w],
                               q_BxGxV[:, :w], keys_B, sampling,
                               coupling_rule, verifier,
                               num_drafts_B=jnp.minimum(lengths_B, w),
                               return_hidden=return_hidden)
      tokens_BxG1 = jnp.pad(out.tokens, ((0, 0), (0, gamma_max - w)))
      hidden = out.hidden
      if return_hidden:
        hidden = jnp.pad(hidden, ((0, 0), (0, gamma_max - w), (0, 0)))
      return out.replace(tokens=tokens_BxG1, hidden=hidden)
    return run

  return jax.lax.switch(width - 1, [branch(w) for w in
                                    range(1, gamma_max + 1)], cache)
