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
import numpy as np

from specjax import _checks
from specjax import coupling
from specjax import sampling as sampling_lib
from specjax.decode import validation
from specjax.decode import verifiers as verifiers_lib
from specjax.decode.verifiers import base as verifier_base


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
  nonfinite: int32 `[B]`, scored positions (of the G+1) whose target logits
    were non-finite (see `nonfinite_rows`); the row's tokens are then not a
    sample of the target.
  hidden: None, or (when the loop asks for it, for a feature-level draft)
    the target's features `[B, G+1, D]` at the G+1 scored positions
    (`TransformerLM.forward_with_hidden`).
  bonus: static; False for a round without a bonus token (`_verify_step`
    with `bonus=False`): a row that kept all G drafts emits those G alone.
  """
  tokens: jax.Array
  num_accepted: jax.Array
  num_verified: jax.Array
  overlap: jax.Array
  cache: Any
  nonfinite: jax.Array
  hidden: Any = None
  bonus: bool = flax.struct.field(pytree_node=False, default=True)

  @property
  def num_emitted(self) -> jax.Array:
    # Without a bonus, min(accepted + 1, G), which is num_verified.
    return self.num_accepted + 1 if self.bonus else self.num_verified


# Where a row of logits is no distribution; lives with `probabilities`,
# which refuses such rows when called eagerly.
nonfinite_rows = sampling_lib.nonfinite_rows


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


def _draft_window(state, window):
  """`(tokens_BxW, cache, start_B)`: each row's last `window` committed
  tokens (from position 0 where it has fewer), and the draft's cache rolled
  back to where they start, so that a draft pass over them rewrites it from
  there. A draft with its own cache re-reads such a window each round
  (it may lag), and after off steps (`loop._catch_up`)."""
  start_B = jnp.maximum(state.lengths - window, 0)
  tokens_BxW = jnp.take_along_axis(
      state.tokens, start_B[:, None] + jnp.arange(window)[None, :], axis=1)
  return tokens_BxW, state.draft_cache.replace(lengths=start_B), start_B


def _feature_window(draft, state):
  """A feature-reading draft (`EagleDraft`) reads the target's features of
  the last verify pass (or the prompt), paired with the committed tokens
  from its cache's length on; the pair of the last committed token, at
  n - 1, predicts the first draft.

  Returns `(logits_BxV, cache)`: the draft's logits at n - 1, and its cache
  at length n holding the feature it predicted there.
  """
  n_B = state.lengths
  features_BxWxD = state.target_features
  width = features_BxWxD.shape[1]
  start_B = state.draft_cache.lengths
  window_BxW = jnp.take_along_axis(
      state.tokens, start_B[:, None] + jnp.arange(width)[None, :], axis=1)
  logits_BxWxV, predicted_BxWxD, cache = draft.from_features(
      features_BxWxD, window_BxW, state.draft_cache)
  select_Bx1x1 = jnp.clip(n_B - 1 - start_B, 0, width - 1)[:, None, None]
  logits_BxV = jnp.take_along_axis(logits_BxWxV, select_Bx1x1, axis=1)[:, 0]
  feature_BxD = jnp.take_along_axis(predicted_BxWxD, select_Bx1x1, axis=1)[:, 0]
  return logits_BxV, cache.replace(
      lengths=n_B, feature=feature_BxD.astype(cache.feature.dtype))


def _draft_sample(draft, cache, tokens_BxT, u_B, sampling, select_B=None,
                  mask=None):
  """`_draft_step` on a pre-drawn uniform per row (`u_B[b]` is what
  `_row_uniforms(keys_B, 1)` draws), so the decode loop can draw a whole
  round's uniforms in one vectorised call. `mask` (optional): a constraint's
  `Masker` for the position drawn."""
  logits_BxTxV, cache = draft(tokens_BxT, cache)
  if select_B is None:
    logits_BxV = logits_BxTxV[:, -1]
  else:
    logits_BxV = jnp.take_along_axis(
        logits_BxTxV, select_B[:, None, None], axis=1)[:, 0]
  token_B, q_BxV = _sample_masked(draft, logits_BxV, u_B, sampling, mask)
  return token_B, q_BxV, cache


class Masker:
  """A constraint's mask at given automaton states: `masker(logits_XxV)`
  puts -inf on the ids the states forbid (`specjax.constraint`).

  `draft_unmasked` is the negative control `Constraint.control` names:
  the draft draws from its unmasked law, which the verifier is told was
  masked."""

  def __init__(self, mask_fn, states_X, draft_unmasked=False):
    self._mask_fn = mask_fn
    self.states = states_X
    self.draft_unmasked = draft_unmasked

  def __call__(self, logits_XxV):
    return self._mask_fn(self.states, logits_XxV)


def _sample_masked(draft, logits_BxV, u_B, sampling, mask):
  """`_sample_logits` of the logits a constraint's `mask` leaves."""
  if mask is None:
    return _sample_logits(draft, logits_BxV, u_B, sampling)
  masked_BxV = mask(logits_BxV)
  token_B, q_BxV = _sample_logits(draft, masked_BxV, u_B, sampling)
  if mask.draft_unmasked:
    token_B, _ = _sample_logits(draft, logits_BxV, u_B, sampling)
  return token_B, q_BxV


def _draft_law(draft, logits_xV, sampling):
  """float32 `[..., V]`: the law q a draft's proposal from `logits_xV` is
  drawn from. A `one_hot_q` draft proposes the argmax (which every sampling
  transform keeps), so q is exactly one_hot(argmax): a draft that declares
  one_hot_q but returns soft logits is still verified against the law its
  proposals really follow."""
  if getattr(draft, "one_hot_q", False):
    return jax.nn.one_hot(jnp.argmax(logits_xV, axis=-1), logits_xV.shape[-1],
                          dtype=jnp.float32)
  return sampling_lib.probabilities(logits_xV, sampling)


def _sample_logits(draft, logits_BxV, u_B, sampling):
  """`(token_B, q_BxV)`: the draft's proposal from its logits `[B, V]`."""
  q_BxV = _draft_law(draft, logits_BxV, sampling)
  if getattr(draft, "one_hot_q", False):
    # The argmax q was built from (the same op on the same logits: XLA
    # computes it once), not a second V-wide reduction over q.
    token_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  else:
    token_B = _sample(u_B, q_BxV, sampling)
  # A proposal drawn from non-finite logits gets q = NaN, so the loop (and a
  # caller of `draft_step`) can see it; see `nonfinite_rows`.
  q_BxV = jnp.where(nonfinite_rows(logits_BxV)[:, None], jnp.nan, q_BxV)
  return token_B, q_BxV


def _verify_step(target, cache, last_B, drafts_BxG, q_BxGxV, keys_B, sampling,
                 coupling_rule=coupling._coupling, verifier=None,
                 num_drafts_B=None, return_hidden=False, bonus=True,
                 mask=None):
  """`verifier` (a `Verifier`, static) decides what to keep; None is token
  verification with `coupling_rule` (kept for tests' negative controls).

  `bonus=False` (static): the target scores only `[last, x_1..x_{G-1}]`, the
  G positions that judge the drafts, and a row that keeps all G emits them
  without a bonus token (the next round draws that position from p, as the
  bonus would have been). G = 1 is the Goodput rule's probe round: the cost
  of an autoregressive step plus a draft pass, one token, and one judged
  draft for the acceptance estimate. The logits of the unscored bonus
  position are a copy of the last scored ones; nothing drawn from them is
  emitted. Not with `num_drafts_B`.

  `return_hidden` (static): also return the target's features at the G+1
  scored positions in `VerifyOutput.hidden` (the target must have
  `forward_with_hidden`); the decision is the same either way.

  `num_drafts_B` (int32 `[B]`, optional): row b stopped drafting after
  num_drafts_B[b] <= G tokens (an adaptive draft length) and keeps at most
  those; only for verifiers with `supports_draft_length`.

  `mask` (optional): a constraint's `Masker` at the automaton states of the
  G + 1 scored positions (`[B, G + 1]`: before the first draft, ..., after
  the last), applied to the target's logits as the draft's were.
  """
  gamma = drafts_BxG.shape[1]
  batch = last_B.shape[0]
  if not bonus and (gamma == 0 or num_drafts_B is not None):
    raise ValueError("a round without a bonus needs G >= 1 drafts and no "
                     "num_drafts_B.")
  tokens_BxG1 = jnp.concatenate([last_B[:, None], drafts_BxG], axis=1)
  scored_BxT = tokens_BxG1 if bonus else tokens_BxG1[:, :gamma]
  hidden_BxG1xD = None
  if return_hidden:
    logits_BxG1xV, hidden_BxG1xD, cache = target.forward_with_hidden(
        scored_BxT, cache)
  else:
    logits_BxG1xV, cache = target(scored_BxT, cache)
  if mask is not None:
    logits_BxG1xV = mask(logits_BxG1xV)
  nonfinite_B = jnp.sum(nonfinite_rows(logits_BxG1xV), axis=1,
                        dtype=jnp.int32)
  if not bonus:
    # The unscored bonus position: a placeholder nothing emitted is drawn
    # from (`num_emitted` stops at G).
    logits_BxG1xV = jnp.concatenate([logits_BxG1xV, logits_BxG1xV[:, -1:]],
                                    axis=1)
    if return_hidden:
      hidden_BxG1xD = jnp.pad(hidden_BxG1xD, ((0, 0), (0, 1), (0, 0)))
  if verifier is None:
    verifier = verifiers_lib.TokenVerifier(coupling_rule=coupling_rule)
  positions_G1 = jnp.arange(gamma + 1)
  if sampling.greedy and (gamma == 0 or verifier.exact):
    # p is one-hot on the argmax a, so an exact verifier keeps the drafts
    # that equal a and emits a: no [B, G+1, V] p, residual or CDF is built.
    target_token_BxG1 = sampling_lib._greedy_token(logits_BxG1xV)
    if gamma == 0:
      num_accepted_B = jnp.zeros((batch,), jnp.int32)
      last_token_B = target_token_BxG1[:, 0]
      overlap_BxG = jnp.zeros((batch, 0), jnp.float32)
    else:
      # With p(x) in {0, 1} and q(x) <= 1, u * q(x) < p(x) holds for every u
      # in [0, 1) exactly when p(x) = 1, so u = 0 decides the same and no
      # uniforms need drawing.
      num_accepted_B, last_token_B, overlap_BxG = (
          coupling._first_rejection_one_hot_p(
              jnp.zeros(drafts_BxG.shape, jnp.float32), target_token_BxG1,
              q_BxGxV, drafts_BxG))
    emitted_BxG1 = verifier_base.emit(drafts_BxG, num_accepted_B,
                                      last_token_B)
  elif gamma == 0:  # plain autoregressive step: the "bonus" is the sample.
    p_BxV = sampling_lib.probabilities(logits_BxG1xV[:, 0], sampling)
    emitted_BxG1 = sampling_lib.sample_from_probs(
        _row_uniforms(keys_B, 1)[:, 0], p_BxV)[:, None]
    num_accepted_B = jnp.zeros((batch,), jnp.int32)
    overlap_BxG = jnp.zeros((batch, 0), jnp.float32)
  else:
    p_BxG1xV = sampling_lib.probabilities(logits_BxG1xV, sampling)
    u_BxN = _row_uniforms(keys_B, verifier.num_uniforms(gamma))
    emitted_BxG1, num_accepted_B = verifier.verify(
        u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG,
        lambda u_x, probs_xV: _sample(u_x, probs_xV, sampling))
    overlap_BxG = jnp.sum(jnp.minimum(p_BxG1xV[:, :gamma], q_BxGxV), axis=-1)
  drafted_B = gamma
  if num_drafts_B is not None:
    # Row b keeps at most its num_drafts_B[b] = d drafts. When the verifier
    # kept more, x_{d+1} was kept too, and `emitted[d]` already holds it: the
    # coupled output at position d + 1, an exact sample from p there, since
    # that draft was drawn from q independently of the decision to stop.
    drafted_B = num_drafts_B
    num_accepted_B = jnp.minimum(num_accepted_B, num_drafts_B)
  num_verified_B = jnp.minimum(num_accepted_B + 1, drafted_B)
  judged_BxG = positions_G1[:gamma] < num_verified_B[:, None]
  return VerifyOutput(
      tokens=emitted_BxG1.astype(jnp.int32),
      num_accepted=num_accepted_B.astype(jnp.int32),
      num_verified=num_verified_B.astype(jnp.int32),
      overlap=jnp.sum(jnp.where(judged_BxG, overlap_BxG, 0.0), axis=1),
      cache=cache, nonfinite=nonfinite_B, hidden=hidden_BxG1xD, bonus=bonus)


_draft_step_jit = jax.jit(_draft_step, static_argnames=("sampling",))
_verify_step_jit = jax.jit(_verify_step,
                           static_argnames=("sampling", "verifier"))


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
    distribution (after the sampling transform; exactly one_hot(token) for a
    `one_hot_q` draft; all NaN in a row whose logits were non-finite, see
    `nonfinite_rows`); the advanced cache.
  """
  tokens_BxT = _checks.check_array("tokens", tokens_BxT, rank=2, kind="i")
  validation.check_model("draft", draft)
  validation.check_sampling(sampling, draft.vocab_size)
  b, t = tokens_BxT.shape
  if t < 1:
    raise ValueError(f"tokens must hold at least one token per row, got "
                     f"shape {(b, t)}.")
  _check_step_tokens(draft, cache, (("tokens", tokens_BxT),), t)
  if select_B is not None:
    select_B = _checks.check_array("select", select_B, rank=1, kind="i")
    if select_B.shape[0] != b:
      raise ValueError(f"select has {select_B.shape[0]} rows; tokens has {b}.")
    if _checks.is_concrete(select_B) and b and (
        np.min(select_B) < 0 or np.max(select_B) >= t):
      raise ValueError(f"select must index the T={t} fed tokens ([0, {t})), "
                       f"got {np.asarray(select_B).tolist()}.")
  keys_B = validation.row_keys("keys", keys_B, b)
  return _draft_step_jit(draft, cache, jnp.asarray(tokens_BxT, jnp.int32),
                         keys_B, sampling, select_B)


def _check_step_tokens(model, cache, named_tokens, fed):
  """Where values are concrete (outside jit): every token in [0, V), and
  room in `cache` (`lengths + fed <= max_len`, and the model's
  max_positions) for the `fed` tokens: writes past the end are dropped,
  silently."""
  for name, tokens in named_tokens:
    if _checks.is_concrete(tokens):
      _checks.check_token_range(name, tokens, model.vocab_size)
  # Every cache of the protocol carries per-row lengths; anything else would
  # fail inside jit's argument handling or the model's trace.
  lengths = getattr(cache, "lengths", None)
  if not hasattr(lengths, "shape"):
    raise TypeError("cache must be the model's cache, from "
                    f"model.init_cache(batch, max_len), got "
                    f"{type(cache).__name__}.")
  batch = np.shape(named_tokens[0][1])[0]
  if tuple(lengths.shape) != (batch,):
    raise ValueError(f"cache.lengths has shape {tuple(lengths.shape)}; the "
                     f"step feeds {batch} rows: one length per row.")
  if not jnp.issubdtype(lengths.dtype, jnp.integer):
    # Else flax failed deep in the trace ("Input type must be an integer").
    raise TypeError(f"cache.lengths must be integer positions, got dtype "
                    f"{lengths.dtype}; build the cache with "
                    "model.init_cache(batch, max_len).")
  if not _checks.is_concrete(lengths) or not np.size(lengths):
    return
  if np.min(np.asarray(lengths)) < 0:
    raise ValueError(f"cache.lengths must be >= 0 (positions already held), "
                     f"got {np.asarray(lengths).tolist()}.")
  limits = [("cache.max_len", getattr(cache, "max_len", None)),
            ("max_positions", getattr(model, "max_positions", None))]
  longest = int(np.max(np.asarray(lengths)))
  for name, limit in limits:
    if limit is not None and longest + fed > limit:
      raise ValueError(f"the cache holds {longest} positions in its longest "
                       f"row and {fed} more would exceed {name}={limit}; "
                       "make the cache longer (init_cache(batch, max_len)).")


def verify_step(target, cache, last_B, drafts_BxG, q_BxGxV, keys_B,
                sampling, verifier="token") -> VerifyOutput:
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
    verifier: the rule that judges the drafts, a registry string or a
      `Verifier` (see `specjax.decode.verifiers`): "token" (default, the rule
      above), "block" (exact, keeps at least as many), or a lossy baseline
      ("lenient:l", "typical:eps,delta"), whose output is NOT the target's.
  """
  verifier = verifiers_lib.get_verifier(verifier)
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    raise ValueError(f"verifier={verifier.spec!r} judges a draft tree, which "
                     "verify_step (a chain of drafts) cannot hold; run trees "
                     "through speculative_generate(..., verifier=...).")
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
  _check_step_tokens(target, cache, (("last", last_B), ("drafts", drafts_BxG)),
                     drafts_BxG.shape[1] + 1)
  q_BxGxV = sampling_lib.check_probs("q", q_BxGxV, normalised=True)
  if _checks.is_concrete(q_BxGxV) and _checks.is_concrete(drafts_BxG):
    # A draft q cannot propose means q is not the law it was drawn from:
    # the coupling would judge it against the wrong law (and may keep it).
    q_at_BxG = np.take_along_axis(np.asarray(q_BxGxV),
                                  np.asarray(drafts_BxG)[..., None], -1)[..., 0]
    if (q_at_BxG <= 0).any():
      at = tuple(int(i) for i in np.argwhere(q_at_BxG <= 0)[0])
      raise ValueError(f"drafts{list(at)} = {int(np.asarray(drafts_BxG)[at])} "
                       "has probability 0 under q; pass the q each draft was "
                       "drawn from (draft_step returns it).")
  keys_B = validation.row_keys("keys", keys_B, b)
  return _verify_step_jit(target, cache, jnp.asarray(last_B, jnp.int32),
                          jnp.asarray(drafts_BxG, jnp.int32),
                          jnp.asarray(q_BxGxV, jnp.float32), keys_B, sampling,
                          verifier=verifier)
