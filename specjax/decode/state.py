"""Typed pytrees carried by the decode loop and returned to the caller."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass(kw_only=True)
class RowStats:
  """Per-row counters accumulated over rounds; every field is `[B]` or `[B, G+1]`.

  A *verified* draft position is one the target actually judged: positions up
  to and including the first rejection. Drafts after a rejection are thrown
  away unjudged, so they count as proposed but not verified.

  Under a tree verifier (gamma = the tree's depth) the same fields count
  depths: `accepted` the kept path's depth, `verified` the depths at which
  a child was judged, `overlap_sum` sum_x min(p, q) at those nodes (a single
  draft's acceptance, so alpha_hat exceeds one_minus_tv there: that is the
  tree's gain), `draft_calls` draft passes (depth per round: one per level).
  """
  rounds: jax.Array          # int32 [B]: rounds in which the row was active
  target_calls: jax.Array    # int32 [B]: target forward passes after prefill
  draft_calls: jax.Array     # int32 [B]: draft forward passes after prefill
                             # that the row's batch ran while it was active:
                             # gamma per round at a fixed gamma; under a rule
                             # that stops rows, the batch's longest draft
                             # (the row's own length is in length_hist)
  verified: jax.Array        # int32 [B]: draft tokens judged by the target
  # int32 [B]: draft tokens the verifier kept, from its decision over the
  # whole round under every verifier, also where the budget or an EOS cut
  # the round's emission (so accepted / rounds is the full-round mean).
  accepted: jax.Array
  overlap_sum: jax.Array     # float32 [B]: sum over verified of sum_x min(p, q)
  accept_hist: jax.Array     # int32 [B, G+1]: rounds that kept n drafts
  # int32 [B, G+1]: rounds whose block could keep at most n drafts, so emit
  # at most n + 1 tokens: gamma every round at a fixed gamma, the row's own
  # length under a draft-length rule, and 0 for a round that emits one token
  # whatever it judges (a rule's off step, or its probe round: one draft
  # judged, no bonus). `summarize`'s formula reads it, so a rule's ragged
  # rounds are not priced as gamma_max ones.
  length_hist: jax.Array
  target_nonfinite: jax.Array  # int32 [B]: target positions scored from
                               # non-finite logits (NaN, +inf, all -inf)
  draft_nonfinite: jax.Array   # int32 [B]: draft proposals drawn from
                               # non-finite logits
  # The prompt, teacher-forced, where a draft-length rule reads it (a
  # `Goodput` rule's `prompt_prior`, when sampling; zeros otherwise): at
  # the prompt's last positions (the rule's `prompt_window`), the target's
  # and the draft's laws of the next prompt token, from their prefills.
  # Not drafts: not counted in `verified`.
  prompt_scored: jax.Array       # int32 [B]: prompt positions scored
  prompt_overlap_sum: jax.Array  # float32 [B]: sum over them of
                                 # sum_x min(p, q)

  @classmethod
  def zeros(cls, batch_size: int, gamma: int) -> "RowStats":
    z = jnp.zeros((batch_size,), jnp.int32)
    return cls(rounds=z, target_calls=z, draft_calls=z,
               verified=z, accepted=z,
               overlap_sum=jnp.zeros((batch_size,), jnp.float32),
               accept_hist=jnp.zeros((batch_size, gamma + 1), jnp.int32),
               length_hist=jnp.zeros((batch_size, gamma + 1), jnp.int32),
               target_nonfinite=z, draft_nonfinite=z, prompt_scored=z,
               prompt_overlap_sum=jnp.zeros((batch_size,), jnp.float32))


@flax.struct.dataclass(kw_only=True)
class DecodeState:
  """The while_loop carry. Token buffer holds prompt + generated text per row.

  Invariant between rounds, for row b with `n = lengths[b]` committed tokens:
  the target cache holds positions `< n - 1` (the last committed token is fed
  at the start of the next round), and `tokens[b, :n]` is the text so far.
  """
  tokens: jax.Array          # int32 [B, S]: prompt then generated tokens
  lengths: jax.Array         # int32 [B]: committed tokens (prompt included)
  prompt_lengths: jax.Array  # int32 [B]
  done: jax.Array            # bool [B]: EOS emitted or budget reached
  round: jax.Array           # int32 []: loop counter
  row_keys: jax.Array        # key [B]: one PRNG stream per row
  target_cache: Any
  draft_cache: Any
  stats: RowStats
  # Only for a draft with `reads_target_features` (None otherwise, so other
  # drafts' programs are unchanged): the target's features `[B, G+1, D]` of
  # the last verify pass (or the prompt), which the draft has not read yet.
  # Row b's first `lengths[b] - draft_cache.lengths[b]` of them pair with
  # the tokens at positions draft_cache.lengths[b], ... (see `EagleDraft`).
  target_features: Any = None
  # Only under a constraint (None otherwise): int32 [B], each row's
  # automaton state after its committed generated tokens.
  constraint_state: Any = None

  @property
  def generated(self) -> jax.Array:
    return self.lengths - self.prompt_lengths


@flax.struct.dataclass(kw_only=True)
class GenerationResult:
  """What `generate` and `speculative_generate` return.

  tokens: int32 `[B, max_new_tokens]`, generated tokens, right-padded with
    `pad_id` past `lengths` (the EOS token, when hit, is included).
  lengths: int32 `[B]`, generated tokens per row.
  stats: `RowStats` per row; `summary()` aggregates them.
  """
  tokens: jax.Array
  lengths: jax.Array
  stats: RowStats

  def summary(self) -> dict[str, Any]:
    """Aggregated statistics as Python numbers (`specjax.stats.summarize`).

    alpha_hat: accepted / verified drafts, the measured per-token acceptance;
      under the token verifier it estimates one_minus_tv. Block
      verification, trees and the lossy verifiers keep more drafts than
      sum min(p, q) predicts (their gain), so there it may sit above it.
    one_minus_tv: mean over verified positions of sum_x min(p(x), q(x)).
    tokens_per_target_call: generated tokens / target passes (block
      efficiency); compare with expected_tokens_per_target_call, the formula
      with each row's last round cut at its budget.
    target_nonfinite, draft_nonfinite: positions scored / proposals drawn
      from non-finite logits (0 in a healthy run).
    """
    # Imported here: specjax.stats reads RowStats generically, and the decode
    # package must not depend on the statistics layer at import time.
    from specjax import stats as stats_lib  # pylint: disable=g-import-not-at-top
    return stats_lib.summarize(self)
