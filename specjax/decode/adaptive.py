"""One round with an adaptive draft length (see `draft_length` for the rules).

A rule that can stop a row on the draft's outputs (`rule.stops_early`):
`propose` drafts until every active row has stopped (or gamma_max), under a
`lax.while_loop`, so a round whose rows all stop early runs fewer draft
passes; `verify` scores the W drafted positions in a target pass of static
width W + 1 chosen by `lax.switch` (one compiled branch per W in
1..gamma_max), so a short round also pays for a short verify pass. Buffers
keep the static shapes `[B, gamma_max]` and `[B, gamma_max, V]`.

A rule that only plans (`Goodput` without a threshold): the round's width W
is known before drafting, so `planned` runs the fixed gamma = W round's own
drafting and verify, and the loop (`loop._planned_loop`) runs loops of such
rounds, leaving W only when the rule stops keeping it (`Rule.keeps`: for
`Goodput`, when another width saves more time than `switch_cost` and
`hysteresis` allow). A planned round of length W then costs what the fixed
loop's round costs, where the while loop above costs more.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode import draft_length
from specjax.decode import steps


def propose(draft, state, rule, remaining_B, keys_BxG, sampling, first_draft):
  """Drafts with early stops.

  Args:
    draft: the draft model. state: the loop's `DecodeState`.
    rule: a `draft_length.Rule` (static).
    remaining_B: int32 `[B]`, tokens each row may still generate.
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
  budget_B = rule.plan(state.stats, active_B, remaining_B)
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


def width(rule, state, max_new_tokens):
  """int32 scalar: the width of the next round of a rule that only plans,
  the largest budget among the active rows (0: a probe round)."""
  active_B = ~state.done
  budget_B = rule.plan(state.stats, active_B, max_new_tokens - state.generated)
  return jnp.clip(draft_length.widest(budget_B, active_B), rule.min_width,
                  rule.gamma_max)


def planned(target, draft, state, rule, width, remaining_B, last_B, keys_BxG,
            verify_keys_B, sampling, coupling_rule, verifier, return_hidden,
            propose):
  """One round of static `width` for a rule that only plans (module doc):
  the fixed gamma = width round, each row keeping at most its budget.

  Width 0 is a probe round (`Goodput` with `probe`): one draft, judged by the
  target's pass on the last committed token alone, without a bonus
  (`steps._verify_step(bonus=False)`). It emits one token, as an
  autoregressive step does, and judges one draft, so the rule's acceptance
  estimate keeps learning while speculation does not pay.

  Args:
    width: static int in [0, gamma_max], the round's width (`width(...)`).
    remaining_B: int32 `[B]`, tokens each row may still generate.
    last_B: int32 `[B]`, each row's last committed token.
    keys_BxG, verify_keys_B: the round's draft and verify keys.
    return_hidden: static; the verify pass returns the target's features.
    propose: `keys_BxW -> (drafts_BxW, q_BxWxV, draft_cache)`, the loop's
      fixed-length drafting.
    Others as in `propose` and `verify`.

  Returns:
    `(out, draft_cache, width, block_B, draft_nonfinite_B)`: the verify
    output with tokens (and hidden) padded to `[B, gamma_max + 1, ...]` (its
    cache is the target's after the round; a cache-sharing draft's writes are
    in it), the draft's cache, the draft passes run, per row the most drafts
    it could keep (`RowStats.length_hist`: 0 in a probe round, which emits
    one token), and per row the drafts drawn from non-finite logits.
  """
  gamma_max, probe = rule.gamma_max, width == 0
  w = max(width, 1)
  num_drafts_B = None  # every row keeps up to all w drafts
  if not (probe or rule.plans_one_width):
    active_B = ~state.done
    budget_B = rule.plan(state.stats, active_B, remaining_B)
    # A row whose budget is the batch's planned width keeps all w drafts
    # (the loop may run another width than planned, see `Rule.keeps`); a row
    # with a smaller budget keeps at most it.
    budget_B = jnp.where(
        budget_B >= draft_length.widest(budget_B, active_B), w, budget_B)
    num_drafts_B = jnp.clip(budget_B, 1, w)
  drafts_BxW, q_BxWxV, draft_cache = propose(keys_BxG[:, :w])
  target_cache = state.target_cache
  if getattr(draft, "reads_target_cache", False):
    target_cache = draft.cache_to_target(target_cache, draft_cache)
    draft_cache = state.draft_cache
  out = steps._verify_step(target, target_cache, last_B, drafts_BxW, q_BxWxV,
                           verify_keys_B, sampling, coupling_rule, verifier,
                           num_drafts_B=num_drafts_B,
                           return_hidden=return_hidden, bonus=not probe)
  hidden = out.hidden
  if return_hidden:
    hidden = jnp.pad(hidden, ((0, 0), (0, gamma_max - w), (0, 0)))
  out = out.replace(tokens=jnp.pad(out.tokens, ((0, 0), (0, gamma_max - w))),
                    hidden=hidden)
  nonfinite_B = jnp.sum(jnp.isnan(q_BxWxV[..., 0]), axis=1, dtype=jnp.int32)
  block_B = (jnp.zeros_like(last_B) if probe
             else jnp.full_like(last_B, w) if num_drafts_B is None
             else num_drafts_B)
  return out, draft_cache, w, block_B, nonfinite_B
