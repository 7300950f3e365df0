"""Whole generations as ONE compiled program: `speculative_generate`, `generate`.

A generation is a single `jax.jit` around a `lax.while_loop` over rounds. Each
round, every active row: drafts gamma tokens (`_draft_sample` under
`lax.scan`), has the target judge them in one pass (`_verify_step`), and
commits its own number of tokens. Rows are ragged: each keeps its own length,
finished rows (EOS or budget) are masked and never change, and both caches are
rolled back by resetting their per-row lengths.

`generate` is the same loop with gamma = 0: the target's "bonus" token is the
autoregressive sample, so baseline and speculative runs share every piece.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _moved
from specjax import coupling
from specjax import jit_memory
from specjax import sampling as sampling_lib
from specjax import sharding
from specjax.constraint import automaton as constraint_lib
from specjax.decode import adaptive
from specjax.decode import draft_length as draft_length_lib
from specjax.decode import state as state_lib
from specjax.decode import steps
from specjax.decode import tree_round
from specjax.decode import validation
from specjax.decode import verifiers as verifiers_lib
from specjax.models import protocol

# Prompts are padded to a power of two >= this, so prompts of similar length
# share one compiled program.
MIN_PROMPT_BUCKET = 16

# The token buffer, and so every cache, is rounded up to a multiple of this
# many positions (as paged KV caches allocate blocks of 16). The gammas of a
# sweep then share one cache shape: each pass of the cost model is compiled
# and timed once per sweep rather than once per gamma (`measure.loop_costs`),
# for at most 15 more masked slots of attention per pass.
CACHE_BLOCK = 16

# Fold-in tags that keep each random draw of a round independent.
_VERIFY_PURPOSE_OFFSET = 1 << 20


def prompt_bucket(length: int) -> int:
  """The padded prompt width used for a longest prompt of `length` tokens."""
  return max(MIN_PROMPT_BUCKET, 1 << (int(length) - 1).bit_length())


def _fold_rows(keys_B, data):
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_B, data)


def _round_keys(row_keys_B, round_, gamma):
  """This round's keys: `[B, gamma]` for the draft draws, `[B]` for verify.

  Key (b, i) is `fold_in(fold_in(row_keys[b], round), i)`, with the verify
  purpose `_VERIFY_PURPOSE_OFFSET`. All purposes are folded in one vectorised
  call: on CPU every threefry call is a small loop of its own, and one call
  per purpose made the RNG most of a round's non-model time.
  """
  keys_B = _fold_rows(row_keys_B, round_)
  purposes_P = jnp.append(jnp.arange(gamma, dtype=jnp.uint32),
                          jnp.uint32(_VERIFY_PURPOSE_OFFSET))
  keys_BxP = jax.vmap(lambda k: jax.vmap(
      lambda i: jax.random.fold_in(k, i))(purposes_P))(keys_B)
  return keys_BxP[:, :gamma], keys_BxP[:, gamma]


def _prefill(model, prompts_BxP, buffer_len, lengths_B, at_BxK=None):
  """The model's cache holding `lengths_B` positions of the prompts, and,
  given prompt positions `at_BxK` (int `[B, K]`), its logits there
  (float32 `[B, K, V]`, else None): computed there alone where the model
  can (`logits_at`: its last block's queries and MLP, final norm and LM
  head), else gathered from its logits; XLA compiles away the logits
  nobody reads."""
  # Validation guarantees every committed or scored position is below
  # max_positions, so a cache capped there loses nothing; prompt padding past
  # it is dropped.
  cache = model.init_cache(prompts_BxP.shape[0],
                           protocol.cache_length(model, buffer_len))
  logits_BxKxV = None
  if at_BxK is None:
    _, cache = model(prompts_BxP, cache)
  elif hasattr(model, "logits_at"):
    logits_BxKxV, cache = model.logits_at(prompts_BxP, cache, at_BxK)
  else:
    logits_BxPxV, cache = model(prompts_BxP, cache)
    logits_BxKxV = jnp.take_along_axis(logits_BxPxV, at_BxK[..., None],
                                       axis=1)
  return cache.replace(lengths=lengths_B), logits_BxKxV


def _prompt_window(prompt_lengths_B, width, window):
  """(positions int32 `[B, K]`, scored bool `[B, K]`): row b's last
  min(window, n_b - 1) prompt positions i <= n_b - 2 (each with its laws of
  token i + 1), K = min(window, width); positions before the prompt are
  clipped to 0 and not scored. A rule reading the prompt
  (`Goodput.prompt_prior`) is given both models' agreement there; their
  last blocks' queries and MLPs, final norms and LM heads run on these
  positions alone where the models can (`_prefill`), so a short window
  costs little at any prompt length or vocabulary size."""
  window = min(window, width)
  pos_BxK = (prompt_lengths_B[:, None] - 1 - window
             + jnp.arange(window)[None, :])
  return jnp.clip(pos_BxK, 0, width - 1), pos_BxK >= 0


def _prompt_overlap(p_logits_BxKxV, q_logits_BxKxV, scored_BxK, draft,
                    sampling):
  """(scored_B int32, overlap_sum_B float32): sum_x min(p, q) summed over
  each row's scored positions, p and q as a round builds them from the
  target's and the draft's logits; positions where either model's logits
  are not finite are left out."""
  scored_BxK &= ~(steps.nonfinite_rows(p_logits_BxKxV)
                  | steps.nonfinite_rows(q_logits_BxKxV))
  overlap_BxK = jnp.sum(jnp.minimum(
      sampling_lib.probabilities(p_logits_BxKxV, sampling),
      steps._draft_law(draft, q_logits_BxKxV, sampling)), axis=-1)
  return (jnp.sum(scored_BxK, axis=1, dtype=jnp.int32),
          jnp.sum(jnp.where(scored_BxK, overlap_BxK, 0.0), axis=1))


def _prefill_features(target, draft, prompts_BxP, buffer_len, lengths_B,
                      gamma):
  """`_prefill` of both models for a `reads_target_features` draft.

  The target's prefill also returns its features of the prompt, which seed
  the draft's cache; returns (target cache, draft cache, the draft's first
  window of unread features `[B, gamma + 1, D]`).
  """
  cache = target.init_cache(prompts_BxP.shape[0],
                            protocol.cache_length(target, buffer_len))
  _, hidden_BxPxD, cache = target.forward_with_hidden(prompts_BxP, cache)
  draft_cache = draft.init_cache(prompts_BxP.shape[0],
                                 protocol.cache_length(draft, buffer_len))
  draft_cache, features_BxWxD = draft.prefill(
      prompts_BxP, hidden_BxPxD, lengths_B, draft_cache, gamma + 1)
  return cache.replace(lengths=lengths_B - 1), draft_cache, features_BxWxD


def _masker(constraint, eos_id, states_X):
  """The `steps.Masker` of `constraint` at automaton states `states_X`
  (None without a constraint); EOS ids are allowed at final states."""
  if constraint is None:
    return None
  return steps.Masker(
      functools.partial(constraint_lib.mask_logits, constraint,
                        eos_ids=eos_id or ()),
      states_X, draft_unmasked=constraint.control == "draft_unmasked")


def _propose(draft, state, gamma, keys_BxG, sampling, constraint=None,
             eos_id=None):
  """gamma draft tokens per row, the q each was drawn from, the draft's
  cache, and under a constraint the automaton states `[B, gamma + 1]`
  before each draft and after the last (else None)."""
  n_B = state.lengths
  s_B = state.constraint_state
  mask = _masker(constraint, eos_id, s_B)
  # Draw i of row b uses uniform(keys_BxG[b, i], (1,)), drawn for all i at
  # once (unused, and so compiled away, when the draft's q is one-hot).
  u_BxG = jax.vmap(lambda k_B: steps._row_uniforms(k_B, 1)[:, 0],
                   in_axes=1, out_axes=1)(keys_BxG)
  if getattr(draft, "reads_target_features", False):
    # The target's features of the last verify pass (or the prompt), paired
    # with the committed tokens the draft has not read (see `EagleDraft`).
    logits_BxV, cache = steps._feature_window(draft, state)
    x_B, q_BxV = steps._sample_masked(draft, logits_BxV, u_BxG[:, 0],
                                      sampling, mask)
  elif getattr(draft, "reads_target_cache", False):
    # The draft's cache is a view of the target's, which holds every
    # committed position but the last token's: feed that one token.
    cache = draft.cache_from_target(state.target_cache)
    last_Bx1 = jnp.take_along_axis(state.tokens, (n_B - 1)[:, None], axis=1)
    x_B, q_BxV, cache = steps._draft_sample(draft, cache, last_Bx1,
                                            u_BxG[:, 0], sampling, mask=mask)
  else:
    # The draft may lag one token behind (it never saw x_gamma when all
    # drafts were kept), so it always re-reads the two tokens ending at the
    # last committed one (after off steps, `_catch_up` has read theirs);
    # `select` picks the logits of that last token.
    window_BxW, cache, start_B = steps._draft_window(state, 2)
    x_B, q_BxV, cache = steps._draft_sample(draft, cache, window_BxW,
                                            u_BxG[:, 0], sampling,
                                            select_B=n_B - 1 - start_B,
                                            mask=mask)
    cache = cache.replace(lengths=n_B)
  advance = lambda s_B, x_B: (None if constraint is None else
                              constraint_lib.advance(constraint, s_B, x_B))

  def one_more(carry, u_B):
    cache, token_B, s_B = carry
    s_B = advance(s_B, token_B)
    token_B, q_BxV, cache = steps._draft_sample(
        draft, cache, token_B[:, None], u_B, sampling,
        mask=_masker(constraint, eos_id, s_B))
    return (cache, token_B, s_B), (token_B, q_BxV, s_B)

  (cache, x_last_B, s_last_B), (xs_GxB, qs_GxBxV, ss_GxB) = jax.lax.scan(
      one_more, (cache, x_B, s_B), u_BxG[:, 1:].T)
  drafts_BxG = jnp.concatenate([x_B[:, None], xs_GxB.T], axis=1)
  q_BxGxV = jnp.concatenate([q_BxV[:, None], qs_GxBxV.transpose(1, 0, 2)],
                            axis=1)
  states_BxG1 = None
  if constraint is not None:
    states_BxG1 = jnp.concatenate(
        [s_B[:, None], ss_GxB.T, advance(s_last_B, x_last_B)[:, None]],
        axis=1)
  return drafts_BxG, q_BxGxV, cache, states_BxG1


def _round(state, *, target, draft, gamma, max_new_tokens, sampling, eos_id,
           coupling_rule, verifier=None, draft_length=None, width=None,
           constraint=None):
  """One speculative round for every row (gamma = 0: one autoregressive step).

  With a `draft_length` rule, gamma is its gamma_max and each row drafts
  (and keeps) at most its own number of tokens (see `adaptive`); a rule that
  only plans runs with a static `width`, the round's draft passes.
  `width=-1` is an off round:
  an autoregressive step that leaves the draft alone (`_planned_loop`). A
  `TreeVerifier` runs a tree round instead (`tree_round`, gamma = depth).
  A `constraint` masks every position both models score at the automaton
  state there (not with a draft-length rule)."""
  n_B = state.lengths
  batch = n_B.shape[0]
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    (out, draft_cache, draft_passes, draft_nonfinite_B,
     target_features) = tree_round.tree_round(
         target, draft, state, verifier, sampling,
         functools.partial(_masker, constraint, eos_id), constraint)
    return _commit(state, out, draft_cache, draft_passes, draft_passes,
                   draft_nonfinite_B,
                   max_new_tokens=max_new_tokens, eos_id=eos_id,
                   target_features=target_features, constraint=constraint)
  if width == -1:
    # The verify key alone (the one `_round_keys` gives): on CPU every
    # fold-in is a small loop of its own, and an off step draws nothing else.
    draft_keys_BxG, verify_keys_B = None, _fold_rows(
        _fold_rows(state.row_keys, state.round),
        jnp.uint32(_VERIFY_PURPOSE_OFFSET))
  else:
    draft_keys_BxG, verify_keys_B = _round_keys(state.row_keys, state.round,
                                                gamma)
  target_cache = state.target_cache
  draft_passes = gamma
  last_B = jnp.take_along_axis(state.tokens, (n_B - 1)[:, None], axis=1)[:, 0]
  features = getattr(draft, "reads_target_features", False) and gamma > 0
  remaining_B = max_new_tokens - state.generated
  if width == -1:
    out = steps._verify_step(
        target, target_cache, last_B, jnp.zeros((batch, 0), jnp.int32),
        jnp.zeros((batch, 0, target.vocab_size), jnp.float32), verify_keys_B,
        sampling, coupling_rule, verifier)
    # One token, committed unpadded as a `generate` step commits it: an off
    # step should cost what that step costs.
    return _commit(state, out, state.draft_cache, 0, 0,
                   jnp.zeros((batch,), jnp.int32),
                   max_new_tokens=max_new_tokens, eos_id=eos_id,
                   target_features=state.target_features)
  if width is not None:
    propose = lambda keys: _propose(draft, state, max(width, 1), keys,
                                    sampling)[:3]
    out, draft_cache, draft_passes, block_B, draft_nonfinite_B = (
        adaptive.planned(target, draft, state, draft_length, width,
                         remaining_B, last_B, draft_keys_BxG, verify_keys_B,
                         sampling, coupling_rule, verifier, features,
                         propose))
    return _finish(state, out, draft_cache, draft_passes, block_B,
                   draft_nonfinite_B, features,
                   max_new_tokens=max_new_tokens, eos_id=eos_id)
  if draft_length is not None:
    drafts_BxG, q_BxGxV, draft_cache, drafted_B, draft_passes = (
        adaptive.propose(draft, state, draft_length, remaining_B,
                         draft_keys_BxG, sampling,
                         lambda keys: _propose(draft, state, 1, keys,
                                               sampling)[:3]))
    if getattr(draft, "reads_target_cache", False):
      target_cache = draft.cache_to_target(target_cache, draft_cache)
      draft_cache = state.draft_cache
  elif gamma:
    drafts_BxG, q_BxGxV, draft_cache, states_BxG1 = _propose(
        draft, state, gamma, draft_keys_BxG, sampling, constraint, eos_id)
    if getattr(draft, "reads_target_cache", False):
      # The draft wrote its lookahead into the target's own layers; the
      # verify pass overwrites those positions before reading them.
      target_cache = draft.cache_to_target(target_cache, draft_cache)
      draft_cache = state.draft_cache
  else:
    drafts_BxG = jnp.zeros((batch, 0), jnp.int32)
    q_BxGxV = jnp.zeros((batch, 0, target.vocab_size), jnp.float32)
    draft_cache = state.draft_cache
    states_BxG1 = (None if constraint is None
                   else state.constraint_state[:, None])
  if draft_length is not None:
    out = adaptive.verify(target, target_cache, last_B, drafts_BxG, q_BxGxV,
                          drafted_B, draft_passes, verify_keys_B, sampling,
                          coupling_rule, verifier, return_hidden=features)
  else:
    out = steps._verify_step(target, target_cache, last_B, drafts_BxG,
                             q_BxGxV, verify_keys_B,
                             sampling, coupling_rule, verifier,
                             return_hidden=features,
                             mask=_masker(constraint, eos_id, states_BxG1))
  # `_draft_sample` marks a proposal drawn from non-finite logits by a NaN q
  # row (a one-hot or probability row never holds a NaN).
  draft_nonfinite_B = jnp.sum(jnp.isnan(q_BxGxV[..., 0]), axis=1,
                              dtype=jnp.int32)
  block_B = drafted_B if draft_length is not None else gamma
  return _finish(state, out, draft_cache, draft_passes, block_B,
                 draft_nonfinite_B, features,
                 max_new_tokens=max_new_tokens, eos_id=eos_id,
                 constraint=constraint)


def _finish(state, out, draft_cache, draft_passes, block_B,
            draft_nonfinite_B, features, *, max_new_tokens, eos_id,
            constraint=None):
  """Keeps the verify pass's features for a feature-reading draft, then
  commits the round."""
  target_features = state.target_features
  if features:
    # The scored positions n - 1 ... hold this round's features; the first
    # (emitted) of them pair with the committed tokens n ... next round, so
    # the head's cache rolls back to n, where that window starts. (A
    # finished row's state is never read again.)
    target_features = out.hidden
    draft_cache = draft_cache.replace(lengths=state.lengths)
  return _commit(state, out, draft_cache, draft_passes, block_B,
                 draft_nonfinite_B, max_new_tokens=max_new_tokens,
                 eos_id=eos_id, target_features=target_features,
                 constraint=constraint)


def _commit(state, out, draft_cache, draft_passes, block_B,
            draft_nonfinite_B, *, max_new_tokens, eos_id, target_features,
            constraint=None):
  """Commits a verified round (`out.tokens` `[B, G + 1]`: up to G drafts kept
  and the token after them) for every row. `block_B` (int or int32 `[B]`):
  the most drafts each row could keep (`RowStats.length_hist`). Under a
  `constraint`, each row's automaton advances over the tokens it commits,
  and a token into a stop state ends the row as an EOS does."""
  n_B = state.lengths
  batch = n_B.shape[0]
  active_B = ~state.done
  # Commit: accepted prefix + one, cut at the budget and just after an EOS.
  positions_G1 = jnp.arange(out.tokens.shape[1])
  budget_B = max_new_tokens - (n_B - state.prompt_lengths)
  emit_B = jnp.minimum(out.num_emitted, budget_B)
  hit_eos_B = jnp.zeros_like(active_B)
  stop_BxG1 = jnp.zeros(out.tokens.shape, bool)
  if eos_id is not None:
    # eos_id is a tuple of ids (see `_prepare`); any of them stops the row.
    stop_BxG1 = jnp.isin(out.tokens, jnp.asarray(eos_id, jnp.int32))
  if constraint is not None:
    # The automaton's states along the round's tokens: column j + 1 after
    # token j; a token into a stop state (final, nothing may follow) ends
    # the row as an EOS does.
    path_BxG2 = constraint_lib.advance_path(
        constraint, state.constraint_state, out.tokens)
    stop_BxG1 = stop_BxG1 | constraint.stop_S[path_BxG2[:, 1:]]
  if eos_id is not None or constraint is not None:
    stop_BxG1 = stop_BxG1 & (positions_G1 < emit_B[:, None])
    hit_eos_B = jnp.any(stop_BxG1, axis=1)
    emit_B = jnp.where(hit_eos_B, jnp.argmax(stop_BxG1, axis=1) + 1, emit_B)
  emit_B = jnp.where(active_B, emit_B, 0)
  constraint_state = state.constraint_state
  if constraint is not None:
    # The state after the committed tokens; the negative control advances
    # over the round's every token, kept or not.
    kept_B = (jnp.where(active_B, out.tokens.shape[1], 0)
              if constraint.control == "advance_rejected" else emit_B)
    constraint_state = jnp.take_along_axis(path_BxG2, kept_B[:, None],
                                           axis=1)[:, 0]
  buffer_len = state.tokens.shape[1]
  write_BxG1 = jnp.where(positions_G1 < emit_B[:, None],
                         n_B[:, None] + positions_G1, buffer_len)  # dropped
  tokens = state.tokens.at[jnp.arange(batch)[:, None], write_BxG1].set(
      out.tokens, mode="drop")
  new_n_B = n_B + emit_B
  done_B = (state.done | (hit_eos_B & active_B)
            | (new_n_B - state.prompt_lengths >= max_new_tokens))

  s = state.stats
  a_B = active_B.astype(jnp.int32)
  stats = s.replace(
      rounds=s.rounds + a_B,
      target_calls=s.target_calls + a_B,
      draft_calls=s.draft_calls + draft_passes * a_B,
      verified=s.verified + out.num_verified * a_B,
      accepted=s.accepted + out.num_accepted * a_B,
      overlap_sum=s.overlap_sum + jnp.where(active_B, out.overlap, 0.0),
      accept_hist=s.accept_hist.at[jnp.arange(batch), out.num_accepted].add(
          a_B),
      length_hist=s.length_hist.at[
          jnp.arange(batch), jnp.broadcast_to(block_B, (batch,))].add(a_B),
      target_nonfinite=s.target_nonfinite + out.nonfinite * a_B,
      draft_nonfinite=s.draft_nonfinite + draft_nonfinite_B * a_B)
  return state.replace(
      tokens=tokens, lengths=new_n_B, done=done_B, round=state.round + 1,
      target_cache=out.cache.replace(lengths=new_n_B - 1),
      draft_cache=draft_cache, target_features=target_features, stats=stats,
      constraint_state=constraint_state)


@functools.partial(
    jax.jit,
    static_argnames=("gamma", "max_new_tokens", "sampling", "eos_id", "pad_id",
                     "coupling_rule", "verifier", "draft_length"))
def _generate(target, draft, prompts_BxP, prompt_lengths_B, row_keys_B, *,
              gamma, max_new_tokens, sampling, eos_id, pad_id,
              coupling_rule=coupling._coupling, verifier=None,
              draft_length=None, draft_length_values=None, constraint=None):
  """The compiled generation. `coupling_rule(u_accept, u_residual, p, q, x)`
  is static so that tests can swap in deliberately wrong rules (negative
  controls) and watch the exactness test reject them; `verifier` (a static
  `Verifier`), when given, replaces token verification altogether.
  `draft_length` is a rule, or with `draft_length_values` the skeleton and
  traced values `draft_length.split` made of one. `constraint` (traced: a
  new one of the same table shapes reuses the program) masks both models'
  logits at each row's automaton state."""
  if draft_length_values is not None:
    draft_length = draft_length_lib.join(draft_length, draft_length_values)
  state = _start(target, draft, prompts_BxP, prompt_lengths_B, row_keys_B,
                 gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling,
                 verifier=verifier, draft_length=draft_length,
                 constraint=constraint)
  round_fn = functools.partial(_round, target=target, draft=draft, gamma=gamma,
                               max_new_tokens=max_new_tokens, sampling=sampling,
                               eos_id=eos_id, coupling_rule=coupling_rule,
                               verifier=verifier, draft_length=draft_length,
                               constraint=constraint)
  # Every active row commits >= 1 token a round, so max_new_tokens rounds
  # always suffice; the loop usually exits much earlier.
  going = lambda s: (s.round < max_new_tokens) & jnp.any(~s.done)
  if draft_length is not None and not draft_length.stops_early:
    state = _planned_loop(state, round_fn, going, draft_length,
                          max_new_tokens, draft)
  else:
    body = lambda s: sharding.constrain_decode_state(round_fn(s))
    state = jax.lax.while_loop(going, body, state)
  generated_B = state.generated
  cols_N = jnp.arange(max_new_tokens)
  out_BxN = jnp.take_along_axis(
      state.tokens, state.prompt_lengths[:, None] + cols_N[None, :], axis=1)
  out_BxN = jnp.where(cols_N < generated_B[:, None], out_BxN, pad_id)
  return sharding.constrain_replicated(state_lib.GenerationResult(
      tokens=out_BxN, lengths=generated_B, stats=state.stats))


def _start(target, draft, prompts_BxP, prompt_lengths_B, row_keys_B, *,
           gamma, max_new_tokens, sampling, verifier, draft_length,
           constraint):
  """The loop's state before its first round: the prompts in the token
  buffer and both models prefilled (`_generate`'s arguments)."""
  batch, width = prompts_BxP.shape
  buffer_len = _buffer_len(width, max_new_tokens, gamma, verifier)
  tokens_BxS = jnp.zeros((batch, buffer_len), jnp.int32).at[:, :width].set(
      prompts_BxP)
  target_features = None
  stats = state_lib.RowStats.zeros(batch, gamma)
  if getattr(draft, "reads_target_features", False):
    target_cache, draft_cache, target_features = _prefill_features(
        target, draft, prompts_BxP, buffer_len, prompt_lengths_B, gamma)
  else:
    # Drafts that share the target's cache or read its features have no
    # prefill logits of their own: their rows start from the rule's prior.
    # So do greedy rows: greedy text is not like its prompt (it repeats),
    # and a prompt understated its acceptance (`Goodput.prompt_prior`).
    own_cache = (draft is not None
                 and not getattr(draft, "reads_target_cache", False))
    at_BxK = scored_BxK = None
    window = getattr(draft_length, "prompt_window", 0)  # 0: reads no prompt
    if own_cache and window and not sampling.greedy:
      at_BxK, scored_BxK = _prompt_window(prompt_lengths_B, width, window)
    target_cache, p_logits = _prefill(target, prompts_BxP, buffer_len,
                                      prompt_lengths_B - 1, at_BxK)
    draft_cache = None
    if own_cache:
      draft_cache, q_logits = _prefill(
          draft, prompts_BxP, buffer_len, jnp.maximum(prompt_lengths_B - 2, 0),
          at_BxK)
    if at_BxK is not None:
      scored_B, overlap_B = _prompt_overlap(p_logits, q_logits, scored_BxK,
                                            draft, sampling)
      stats = stats.replace(prompt_scored=scored_B,
                            prompt_overlap_sum=overlap_B)
  state = state_lib.DecodeState(
      tokens=tokens_BxS, lengths=prompt_lengths_B,
      prompt_lengths=prompt_lengths_B,
      done=jnp.zeros((batch,), bool), round=jnp.zeros((), jnp.int32),
      row_keys=row_keys_B, target_cache=target_cache, draft_cache=draft_cache,
      target_features=target_features, stats=stats,
      constraint_state=(None if constraint is None else jnp.broadcast_to(
          constraint.initial, (batch,))))
  # Under a mesh (`mesh=`), the carry is pinned to the rules' shardings
  # (batch on `data`, kv heads on `model`); without one these are no-ops.
  return sharding.constrain_decode_state(state)


def _planned_loop(state, round_fn, going, rule, max_new_tokens, draft):
  """The rounds of a rule that fixes each round's width before drafting.

  Each sweep of the outer loop runs, for each W of the rule's
  `planned_widths` in turn (min_width..gamma_max unless it restricts them), a
  loop of fixed-width rounds of width W, entered when the rule plans W and
  run while it keeps W (`rule.keeps`): the rounds are the fixed gamma = W
  loop's own program. A loop whose width is not planned runs no round, so a
  sweep runs the same rounds, in the same order, as picking the planned
  width's loop with a `lax.switch` would, without the switch's copies: XLA
  copies the whole carry, both KV caches among them, into the branch a
  switch enters and again in the outer loop (two copies per change of
  width). Loops in sequence hand the carry on in place.

  W = 0 (a rule with `min_width` 0) is an off stretch: a probe round
  (`adaptive.planned`), then, if the rule still keeps 0, up to
  `rule.probe_every - 1` autoregressive steps that leave the draft alone
  (decided once, after the probe: the steps judge no drafts, so they leave
  a rule's acceptance estimate as it was), repeated while the rule plans 0.
  A draft with its own cache then re-reads the steps' tokens in one pass
  (`_catch_up`), so every round starts from the usual two-token window. A
  draft reading the target's features cannot (the steps' features are not
  kept), so it probes every round of an off stretch.
  """
  width = lambda s: adaptive.width(rule, s, max_new_tokens)
  every = getattr(rule, "probe_every", 1)
  if getattr(draft, "reads_target_features", False):
    every = 1
  keeps = lambda w, s: rule.keeps(w, s.stats, ~s.done,
                                  max_new_tokens - s.generated)
  step = sharding.constrain_decode_state

  def stretch(s, w):
    def cond(c):
      s, started = c
      return going(s) & jnp.where(started, keeps(w, s), width(s) == w)
    return jax.lax.while_loop(
        cond, lambda c: (step(round_fn(c[0], width=w)), jnp.bool_(True)),
        (s, jnp.bool_(False)))[0]

  def off_stretch(s):
    s = step(round_fn(s, width=0))  # the probe round
    n_off = jnp.where(keeps(0, s), every - 1, 0)
    off = lambda c: (step(round_fn(c[0], width=-1)), c[1] + 1)
    s, ran = jax.lax.while_loop(lambda c: going(c[0]) & (c[1] < n_off), off,
                                (s, jnp.int32(0)))
    if every == 1 or getattr(draft, "reads_target_cache", False):
      return s  # nothing to catch up on
    # A loop of at most one trip: a conditional would copy the carry.
    return jax.lax.while_loop(
        lambda c: c[1] > 0,
        lambda c: (step(_catch_up(draft, c[0], every)), jnp.int32(0)),
        (s, ran))[0]

  def sweep(s):
    for w in rule.planned_widths:
      if w:
        s = stretch(s, w)
      else:
        s = jax.lax.while_loop(lambda s: going(s) & (width(s) == 0),
                               off_stretch, s)
    return s

  return jax.lax.while_loop(going, sweep, state)


def _catch_up(draft, state, window):
  """The draft's cache after it reads the last `window` committed tokens of
  each row (after off steps, which leave the draft alone): it then lags as
  a round leaves it, and the next round re-reads the usual two tokens. A
  pass that drafts nothing; `stats` does not count it."""
  window_BxW, cache, _ = steps._draft_window(state, window)
  _, cache = draft(window_BxW, cache)
  return state.replace(draft_cache=cache.replace(lengths=state.lengths))


def _lookahead(gamma, verifier):
  """Cache slots a round writes past the root: gamma, or a tree's nodes."""
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    return verifier.topology.num_nodes
  return gamma


def _buffer_len(width, max_new_tokens, gamma, verifier=None):
  """Positions of a generation's token buffer: room for the prompt, the
  budget, and the lookahead plus one that a final round scores past the
  last committed token (a tree: its root and every node; `generate`:
  gamma 0), rounded up to a multiple of `CACHE_BLOCK`."""
  needed = width + max_new_tokens + _lookahead(gamma, verifier) + 1
  return -(-needed // CACHE_BLOCK) * CACHE_BLOCK


def _check_decode_mesh(caller, mesh, models, batch_size, buffer_len):
  """The entry points' checks of where a generation runs, before anything
  is timed or traced: the mesh's axes, and the room for the caches the loop
  holds (a draft that reads the target's cache holds none)."""
  sharding.check_mesh_axes(mesh)
  validation.check_cache_memory(
      caller, [(name, model) for name, model in models
               if not getattr(model, "reads_target_cache", False)],
      batch_size, buffer_len, mesh)


def _prepare(target, prompts, prompt_lengths, key, *, max_new_tokens,
             lookahead, sampling, eos_id, pad_id, models):
  """Host-side validation and bucketing shared by both entry points."""
  prompts_np, lengths_np = validation.check_prompts(prompts, prompt_lengths)
  max_new_tokens = _checks.check_int("max_new_tokens", max_new_tokens, low=1)
  vocab = target.vocab_size
  validation.check_sampling(sampling, vocab)
  # Ids a prompt or EOS may hold: a head padded past the tokenizer
  # (`PaddedVocabLM`) scores ids that are no token, which a model may not
  # even embed (NaN).
  real, whose = vocab, "the "
  for _, model in models:
    num_real = getattr(model, "num_real", None)
    if num_real is not None and num_real < real:
      real, whose = num_real, "the tokenizer's (PaddedVocabLM.num_real) "
  if eos_id is not None:
    # One id or several (Llama 3 stops on any of a few); held as a sorted
    # tuple so it stays a hashable static argument of the compiled loop.
    ids = (eos_id,) if np.ndim(eos_id) == 0 else tuple(eos_id)
    # No ids (a tokenizer's eos_ids where its config sets none): no EOS.
    eos_id = tuple(sorted({
        _checks.check_int("eos_id", i, low=0, high=real - 1)
        for i in ids})) or None
  # The output is int32: a wider pad_id would fail inside the compiled call.
  pad_id = _checks.check_int("pad_id", pad_id, low=-2**31, high=2**31 - 1)
  _checks.check_token_range("prompts", prompts_np, real,
                            lengths_B=lengths_np, whose=whose)
  longest = int(lengths_np.max())
  # The last scored position is (longest - 1) + (max_new_tokens - 1) + lookahead.
  needed = longest + max_new_tokens + lookahead - 1
  if needed >= 2**31:
    # Positions are int32; a model without max_positions (an n-gram, prompt
    # lookup) bounds nothing below, and jit would fail parsing the value.
    raise ValueError(f"max_new_tokens={max_new_tokens} with a prompt of "
                     f"{longest} tokens needs {needed} positions, past int32; "
                     "lower max_new_tokens.")
  for name, model in models:
    limit = getattr(model, "max_positions", None)
    if limit is not None and needed > limit:
      raise ValueError(
          f"max_new_tokens={max_new_tokens} does not fit the {name}'s context: "
          f"the longest prompt ({longest}) + max_new_tokens + lookahead "
          f"({lookahead}) needs {needed} positions, but {name}.max_positions "
          f"is {limit}. Shorten the prompt or lower max_new_tokens"
          + (", or the lookahead: gamma, or a tree's node count (a "
             "round scores every node)." if lookahead > 1 else "."))
  width = prompt_bucket(longest)
  padded = np.zeros((prompts_np.shape[0], width), np.int32)
  keep = min(width, prompts_np.shape[1])
  padded[:, :keep] = prompts_np[:, :keep]
  padded[np.arange(width)[None, :] >= lengths_np[:, None]] = 0
  keys = validation.row_keys("key", key, prompts_np.shape[0])
  return (jnp.asarray(padded), jnp.asarray(lengths_np), keys, max_new_tokens,
          eos_id, pad_id)


def speculative_generate(target, draft, prompts, prompt_lengths, key, *,
                         gamma: int | draft_length_lib.Rule | None = None,
                         max_new_tokens: int,
                         sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
                         eos_id: int | None = None, pad_id: int = 0,
                         verifier: str | verifiers_lib.Verifier = "token",
                         on_nonfinite: str = "raise", mesh=None,
                         constraint: constraint_lib.Constraint | None = None
                         ) -> state_lib.GenerationResult:
  """Samples continuations from `target`, speculating with `draft`.

  The output is distributed exactly as `generate(target, ...)` with the same
  `sampling` (token for token equal when greedy); the draft changes only the
  speed.

  Args:
    target, draft: `CausalLM` pytrees with the same vocabulary.
    prompts: int `[B, P]`, right-padded; prompt_lengths: int `[B]` in [1, P].
    key: one PRNG key (row b uses fold_in(key, b)) or keys `[B]`, one per row;
      at a fixed gamma (a tree included) a row's output depends only on its
      prompt and its key. Under a draft-length rule every row is still an
      exact sample, but which one depends on the batch: a round verifies
      every row at the batch's widest draft (the uniforms a row draws are
      shaped by it), and `Goodput` ("auto") plans one width for the batch.
    gamma: draft tokens proposed per round (>= 1); or a draft-length rule
      (`specjax.Confidence`, `specjax.Goodput`) under which each row stops
      drafting early, up to the rule's gamma_max. The call only runs the
      rule it is given; a `Goodput` rule priced on this machine ("auto") is
      a step before it, `specjax.harness.autotune.auto_rule(target, draft,
      prompts, prompt_lengths, max_new_tokens=...)`. With a tree verifier
      gamma is the tree's depth: None (implied) or that int.
    max_new_tokens: generation budget per row (>= 1).
    sampling: the transform applied to target and draft logits alike.
    eos_id: a row stops after emitting this token (it is included); a
      sequence of ids stops it at the first of any of them (an empty one,
      like None, never).
    pad_id: fills `tokens` past each row's length.
    verifier: how the target judges the drafts, a registry string or a
      `Verifier` (`specjax.decode.verifiers`): "token" (default), "block"
      (exact, keeps at least as many drafts); "lenient:l" and
      "typical:eps,delta" are LOSSY baselines whose output is not the
      target's (`Verifier.exact` is False); "tree:3,2,1,1" (children i.i.d.,
      SpecInfer) and "tree-wor:3,2,1,1" (without replacement, RSD) draft a
      static tree and keep one path (exact; draft and target need
      `tree_decode`, or a feature draft `tree_from_features`, see
      `specjax.models.protocol.supports_trees`). A static choice: one
      compile each.
    on_nonfinite: "raise" (default) or "warn". If either model produced
      non-finite logits (NaN, +inf, or a row of -inf) for an active row, the
      tokens of that row are not a sample of the target: after the loop this
      raises `NonFiniteLogitsError` naming the rows and the model, or with
      "warn" issues a `RuntimeWarning` and returns the result (the counts are
      in `stats.target_nonfinite` / `stats.draft_nonfinite`).
    mesh: a `jax.sharding.Mesh` or a spec like "data:2,model:4" to run the
      same compiled loop sharded (see `specjax.sharding`); None uses the mesh
      of an enclosing `jax.set_mesh`, or one device. A row's output for a
      given key does not depend on the mesh.
    constraint: a `specjax.constraint.Constraint`
      (`specjax.constraint.regex(pattern, tokenizer)`, `json_schema(...)`):
      every row's text stays in its language. Both models' logits are
      masked at each row's automaton state, at every position drafted or
      scored (chains, block, trees), before the sampling transform; EOS
      ids are allowed at final states only, and a row whose text admits
      no continuation stops there as at EOS. The output is an exact
      sample of the constrained target (p restricted to the allowed tokens
      and renormalised at each position), as `generate(...,
      constraint=...)` gives it. Not with a draft-length rule.

  Returns:
    `GenerationResult(tokens [B, max_new_tokens], lengths [B], stats)`
    (replicated on every device of the mesh).
  """
  verifier = verifiers_lib.get_verifier(verifier)
  if verifier.control:
    # Registered so the harness and sweeps can name them; never a decoder.
    warnings.warn(
        f"verifier={verifier.spec!r} is a negative control of the exactness "
        "tests, wrong on purpose: its output is NOT distributed as the "
        "target's. Decode with 'token', 'block' or a tree.", UserWarning,
        stacklevel=2)
  validation.check_pair(target, draft)
  validation.check_on_nonfinite(on_nonfinite)
  rule = None
  if isinstance(gamma, str):
    raise ValueError(
        f"gamma={gamma!r}: speculative_generate runs the rule it is given "
        "and never times itself. Price a Goodput rule first, then pass it: "
        "rule = specjax.harness.autotune.auto_rule(target, draft, prompts, "
        "prompt_lengths, max_new_tokens=..., sampling=...); "
        "speculative_generate(..., gamma=rule). Or pass an int gamma.")
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    gamma = _check_tree(verifier, gamma, target, draft)
  elif gamma is None:
    raise ValueError("gamma is required (draft tokens per round, e.g. "
                     "gamma=4); only a tree verifier implies it (its depth).")
  if isinstance(gamma, draft_length_lib.Rule):
    rule = draft_length_lib.check_rule(gamma)
    gamma = rule.gamma_max
  constraint = constraint_lib.check(constraint, target.vocab_size)
  if constraint is not None and rule is not None:
    raise ValueError(
        "constraint= runs with an int gamma or a tree verifier; a "
        "draft-length rule's probe and off rounds do not carry the "
        "automaton. Pass an int gamma.")
  else:
    gamma = _checks.check_int("gamma", gamma, low=1)
  if rule is not None and not verifier.supports_draft_length:
    raise ValueError(
        f"verifier={verifier.spec!r} judges a draft block as a whole and "
        "cannot run with an adaptive draft length (a draft-length rule); "
        "use an int gamma, or verifier='token'.")
  if (getattr(rule, "estimator", None) == "overlap"
      and not verifier.keeps_with_overlap):
    raise ValueError(
        f"verifier={verifier.spec!r} keeps a draft with another probability "
        "than sum_x min(p, q), which the rule's estimator='overlap' counts; "
        "pass dataclasses.replace(rule, estimator='accepted').")
  models = (("target", target), ("draft", draft))
  prompts, lengths, keys, max_new_tokens, eos_id, pad_id = _prepare(
      target, prompts, prompt_lengths, key, max_new_tokens=max_new_tokens,
      lookahead=_lookahead(gamma, verifier), sampling=sampling, eos_id=eos_id,
      pad_id=pad_id, models=models)
  # Before anything here compiles: frees compiled programs if they near the
  # kernel's memory-map limit (specjax.jit_memory).
  jit_memory.relieve_if_needed("speculative_generate")
  mesh = sharding.as_mesh(mesh)
  _check_decode_mesh(
      "speculative_generate", mesh, models, prompts.shape[0],
      _buffer_len(prompts.shape[1], max_new_tokens, gamma, verifier))
  (target, draft), (prompts, lengths, keys) = sharding.place_decode_inputs(
      mesh, (target, draft), (prompts, lengths, keys))
  # The rule's numbers are traced: a warm-started prior or new measured
  # costs reuse the compiled loop.
  skeleton, values = (None, None) if rule is None else draft_length_lib.split(
      rule)
  with sharding.using(mesh):
    result = _generate(target, draft, prompts, lengths, keys, gamma=gamma,
                       max_new_tokens=max_new_tokens, sampling=sampling,
                       eos_id=eos_id, pad_id=pad_id, verifier=verifier,
                       draft_length=skeleton, draft_length_values=values,
                       constraint=constraint)
  validation.check_finite_logits(result.stats, "speculative_generate",
                                 on_nonfinite)
  return result


def _check_tree(verifier, gamma, target, draft) -> int:
  """gamma for a tree verifier (its depth); refuses models without trees."""
  depth = verifier.depth
  if gamma is not None and (isinstance(gamma, (str, draft_length_lib.Rule))
                            or _checks.check_int("gamma", gamma) != depth):
    raise ValueError(f"verifier={verifier.spec!r} drafts a tree of depth "
                     f"{depth}, so gamma is {depth}; got gamma={gamma!r}. "
                     f"Pass gamma=None (implied) or gamma={depth}; adaptive "
                     "draft lengths do not apply to trees.")
  for name, model in (("target", target), ("draft", draft)):
    if not protocol.supports_trees(model):
      raise ValueError(
          f"verifier={verifier.spec!r} needs a {name} that scores a tree in "
          f"one pass (a `tree_decode` method over a movable cache, see "
          f"specjax.models.protocol.supports_trees); {type(model).__name__} "
          "has none. Use TransformerLM, NGramLM, SelfDraft or EagleDraft "
          "models, or a chain verifier such as 'token'.")
  if verifier.mode in ("wor", "greedy") and verifier.topology.max_children > (
      target.vocab_size):
    raise ValueError(f"verifier={verifier.spec!r} draws up to "
                     f"{verifier.topology.max_children} distinct children per "
                     f"node, more than the vocabulary ({target.vocab_size}).")
  verifier.check_vocab(target.vocab_size)
  return depth


def generate(model, prompts, prompt_lengths, key, *, max_new_tokens: int,
             sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
             eos_id: int | None = None, pad_id: int = 0,
             on_nonfinite: str = "raise", mesh=None,
             constraint: constraint_lib.Constraint | None = None
             ) -> state_lib.GenerationResult:
  """Autoregressive sampling from `model`: the baseline, one token per pass.

  Same arguments and result as `speculative_generate`, without a draft (a
  non-finite row is reported as the target's). With a `constraint`, each
  token is drawn from the model's law restricted to the tokens the row's
  automaton allows, renormalised.
  """
  validation.check_model("model", model)
  constraint = constraint_lib.check(constraint, model.vocab_size)
  validation.check_on_nonfinite(on_nonfinite)
  prompts, lengths, keys, max_new_tokens, eos_id, pad_id = _prepare(
      model, prompts, prompt_lengths, key, max_new_tokens=max_new_tokens,
      lookahead=0, sampling=sampling, eos_id=eos_id, pad_id=pad_id,
      models=(("model", model),))
  jit_memory.relieve_if_needed("generate")
  mesh = sharding.as_mesh(mesh)
  _check_decode_mesh("generate", mesh, (("model", model),), prompts.shape[0],
                     _buffer_len(prompts.shape[1], max_new_tokens, 0))
  (model,), (prompts, lengths, keys) = sharding.place_decode_inputs(
      mesh, (model,), (prompts, lengths, keys))
  with sharding.using(mesh):
    result = _generate(model, None, prompts, lengths, keys, gamma=0,
                       max_new_tokens=max_new_tokens, sampling=sampling,
                       eos_id=eos_id, pad_id=pad_id, constraint=constraint)
  validation.check_finite_logits(result.stats, "generate", on_nonfinite)
  return result


# Moved names raise an error naming their new home.
__getattr__ = _moved.module_getattr(__name__, {
    "AUTO_GAMMA_MAX": "specjax.harness.autotune.AUTO_GAMMA_MAX",
})
