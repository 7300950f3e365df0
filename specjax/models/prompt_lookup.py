"""Prompt lookup decoding (Saxena, 2023) as a `CausalLM` draft.

The draft keeps each row's token history (prompt and text so far). At every
position it takes the trailing n-gram (the last n tokens up to and including
the current one), finds its most recent earlier occurrence in that row's
history, and proposes the token that followed it. n runs from `max_ngram`
down to `min_ngram`; the longest n that matches wins. Called autoregressively,
the draft thus copies a whole continuation: once it has proposed `c` after
`a b`, the history ends in `a b c` and the same earlier occurrence proposes
what came after `c`.

Proposal semantics (what the decode loop may rely on):

* A match gives a one-hot distribution: logit 0 on the proposed token and
  `-1e9` elsewhere. The value is finite so that no sampling transform
  (temperature, top-k, top-p) ever produces NaN; softmax puts exactly zero
  mass off the proposal in float32.
* No match, `fallback=None`: the one-hot proposal repeats the current token
  (a cheap guess that is right on runs of spaces, brackets, ...). Every
  output is then one-hot and `one_hot_q` is True.
* No match, `fallback` given (any `CausalLM`, e.g. a bigram `NGramLM`): the
  fallback's logits at that position. Outputs are then not always one-hot
  and `one_hot_q` is False, so the loop samples the draft normally.

Either way the decode loop stays exact: it verifies whatever q the draft
returns.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax import _checks

NO_MATCH_LOGIT = -1e9
# Longest n-gram a draft may try. The lookup is unrolled once per n, so
# compile time grows with max_ngram, and a max_ngram in the thousands
# does not finish compiling. Prompt lookup decoding itself uses 3
# (Saxena, 2023) and Hugging Face's `max_matching_ngram_size` defaults to
# 2, so 64 loses nothing.
MAX_NGRAM = 64
# Upper bound on the elements of one [B, chunk, max_len] comparison tensor.
_LOOKUP_ELEMENTS = 1 << 24


class PromptLookupCache(struct.PyTreeNode):
  """Token history of each row plus the fallback model's cache.

  Attributes:
    history: int32 `[B, max_len]`; entries at positions >= `lengths[b]` are
      stale and overwritten by the next call.
    lengths: int32 `[B]` (protocol field). Rolling back is
      `cache.replace(lengths=...)`: the fallback cache's own lengths are
      re-synchronised from this field on every call, so it rolls back too.
    fallback_cache: the fallback's cache, or None without a fallback.
  """
  history: jax.Array
  lengths: jax.Array
  fallback_cache: Any = None

  @property
  def max_len(self) -> int:
    return self.history.shape[1]


class PromptLookupDraft(struct.PyTreeNode):
  """A prompt-lookup draft (`CausalLM`) over `vocab_size` tokens.

  Attributes:
    vocab_size: V (static).
    max_ngram: longest n-gram tried (static, in [min_ngram, MAX_NGRAM];
      the lookup is unrolled per n, so a larger one would take minutes to
      compile).
    min_ngram: shortest n-gram tried (static, >= 1).
    fallback: a `CausalLM` with the same vocabulary used where no n-gram
      matches, or None to repeat the current token there (see module doc).
    max_positions: None, or the fallback's limit.
  """
  vocab_size: int = struct.field(pytree_node=False)
  max_ngram: int = struct.field(pytree_node=False, default=3)
  min_ngram: int = struct.field(pytree_node=False, default=1)
  fallback: Any = None

  def __post_init__(self):
    _checks.check_int("vocab_size", self.vocab_size, low=1)
    low = _checks.check_int("min_ngram", self.min_ngram, low=1)
    _checks.check_int("max_ngram", self.max_ngram, low=low)
    # Unrolled per n: compile time grows with max_ngram (see MAX_NGRAM).
    if self.max_ngram > MAX_NGRAM:
      raise ValueError(
          f"max_ngram must be <= MAX_NGRAM={MAX_NGRAM}, got {self.max_ngram}: "
          "the lookup is unrolled once per n-gram size, so compiling it "
          "would take minutes; prompt lookup decoding uses 3 to 5.")
    if self.fallback is not None and not (
        callable(self.fallback) and hasattr(self.fallback, "init_cache")
        and hasattr(self.fallback, "vocab_size")):
      raise TypeError("fallback must be None or a CausalLM (vocab_size, "
                      "init_cache, __call__), e.g. NGramLM.fit(...), got "
                      f"{type(self.fallback).__name__}.")
    fallback_vocab = getattr(self.fallback, "vocab_size", self.vocab_size)
    if fallback_vocab != self.vocab_size:
      raise ValueError(f"fallback has vocab_size {fallback_vocab} but the draft "
                       f"has {self.vocab_size}; they must share the tokenizer.")

  @property
  def one_hot_q(self) -> bool:
    """True exactly when every output is one-hot: no fallback configured."""
    return self.fallback is None

  @property
  def max_positions(self) -> int | None:
    return None if self.fallback is None else self.fallback.max_positions

  def init_cache(self, batch_size: int, max_len: int) -> PromptLookupCache:
    """Empty history int32 `[batch_size, max_len]`, `lengths` zeros."""
    batch_size = _checks.check_int("batch_size", batch_size, low=1)
    max_len = _checks.check_int("max_len", max_len, low=1)
    fallback_cache = (None if self.fallback is None else
                      self.fallback.init_cache(batch_size, max_len))
    return PromptLookupCache(
        history=jnp.zeros((batch_size, max_len), jnp.int32),
        lengths=jnp.zeros((batch_size,), jnp.int32),
        fallback_cache=fallback_cache)

  def __call__(self, tokens_BxT: jax.Array,
               cache: PromptLookupCache) -> tuple[jax.Array, PromptLookupCache]:
    """Writes `tokens` into the history, proposes the next token at each.

    Token t of row b is stored at position `p = lengths[b] + t` (dropped if
    `p >= max_len`). Its proposal looks only at positions `<= p` of the
    row, i.e. at the prompt and earlier tokens, never at stale entries. A
    position past the capacity has no stored history and counts as no match.

    Returns logits float32 `[B, T, V]` and the cache with `lengths += T`.
    Cost O(B T max_len max_ngram) elementwise work per call; long calls (a
    prompt prefill) are processed in chunks of positions so that memory
    stays O(B max_len * chunk), not O(B T max_len).
    """
    tokens_BxT = _checks.check_array("tokens", tokens_BxT, rank=2, kind="i")
    if _checks.is_concrete(tokens_BxT):  # else an id off the table is copied
      _checks.check_token_range("tokens", tokens_BxT, self.vocab_size)
    tokens_BxT = jnp.asarray(tokens_BxT, jnp.int32)
    batch, length = tokens_BxT.shape
    if cache.history.shape[0] != batch:
      raise ValueError(f"cache holds {cache.history.shape[0]} rows but tokens "
                       f"has batch size {batch}; make the cache with "
                       f"init_cache({batch}, max_len).")
    lengths_B = cache.lengths.astype(jnp.int32)
    pos_BxT = lengths_B[:, None] + jnp.arange(length, dtype=jnp.int32)
    rows_Bx1 = jnp.arange(batch)[:, None]
    history_BxL = cache.history.at[rows_Bx1, pos_BxT].set(tokens_BxT,
                                                          mode="drop")

    proposal_BxT, matched_BxT = _lookup_chunked(
        history_BxL, pos_BxT, self.min_ngram, self.max_ngram)
    onehot_BxTxV = jax.nn.one_hot(
        jnp.where(matched_BxT, proposal_BxT, tokens_BxT), self.vocab_size,
        dtype=jnp.bool_)
    logits_BxTxV = jnp.where(onehot_BxTxV, 0.0, NO_MATCH_LOGIT).astype(
        jnp.float32)

    fallback_cache = cache.fallback_cache
    if (self.fallback is None) != (fallback_cache is None):
      # A cache made by another PromptLookupDraft (with or without a
      # fallback) failed as "'NoneType' object has no attribute 'replace'".
      raise ValueError(
          "cache does not match this draft: it "
          + ("holds no" if fallback_cache is None else "holds a")
          + " fallback cache, and the draft has "
          + ("a" if self.fallback is not None else "no") + " fallback. Make "
          "it with this draft's init_cache(batch, max_len).")
    if self.fallback is not None:
      # The fallback sees the same tokens at the same positions; syncing its
      # lengths from ours makes rollback of our cache roll it back too.
      fallback_logits_BxTxV, fallback_cache = self.fallback(
          tokens_BxT, fallback_cache.replace(lengths=lengths_B))
      logits_BxTxV = jnp.where(matched_BxT[..., None], logits_BxTxV,
                               fallback_logits_BxTxV.astype(jnp.float32))
    return logits_BxTxV, PromptLookupCache(
        history=history_BxL, lengths=lengths_B + length,
        fallback_cache=fallback_cache)


def _lookup(history_BxL, pos_BxT, min_ngram, max_ngram):
  """Most recent earlier match of each position's trailing n-gram.

  For query position i = pos[b, t] and n-gram size n, candidate j matches
  when j < i, j >= n - 1, and history[j - k] == history[i - k] for k < n.
  Returns (proposal int32 `[B, T]` = history[j* + 1] for the best j*, with
  the longest matching n preferred, then the largest j; matched bool `[B, T]`).
  """
  batch, max_len = history_BxL.shape
  j_L = jnp.arange(max_len, dtype=jnp.int32)
  query_ok_BxT = pos_BxT < max_len
  earlier_BxTxL = j_L[None, None, :] < pos_BxT[..., None]
  best_j_BxT = jnp.full(pos_BxT.shape, -1, jnp.int32)
  all_equal_BxTxL = earlier_BxTxL
  for k in range(max_ngram):
    # history shifted right by k: shifted[b, j] = history[b, j - k] (j >= k).
    shifted_BxL = jnp.roll(history_BxL, k, axis=1)
    query_BxT = jnp.take_along_axis(
        shifted_BxL, jnp.clip(pos_BxT, 0, max_len - 1), axis=1)
    all_equal_BxTxL = all_equal_BxTxL & (
        shifted_BxL[:, None, :] == query_BxT[..., None])
    n = k + 1
    if n >= min_ngram:
      # j >= n - 1 excludes the wrapped-around entries of the roll (and
      # implies the query's n-gram, ending at i > j, is in range too).
      match_BxTxL = all_equal_BxTxL & (j_L >= n - 1)[None, None, :]
      j_n_BxT = jnp.max(jnp.where(match_BxTxL, j_L, -1), axis=-1)
      # Later (larger) n overwrite: the longest matching n-gram wins.
      best_j_BxT = jnp.where(j_n_BxT >= 0, j_n_BxT, best_j_BxT)
  matched_BxT = (best_j_BxT >= 0) & query_ok_BxT
  # j* < i <= max_len - 1 whenever matched, so j* + 1 is in range.
  next_BxT = jnp.clip(best_j_BxT + 1, 0, max_len - 1)
  proposal_BxT = jnp.take_along_axis(history_BxL, next_BxT, axis=1)
  return proposal_BxT, matched_BxT


def _lookup_chunked(history_BxL, pos_BxT, min_ngram, max_ngram):
  """`_lookup`, over at most `_LOOKUP_ELEMENTS` comparisons at a time."""
  batch, max_len = history_BxL.shape
  length = pos_BxT.shape[1]
  chunk = max(1, _LOOKUP_ELEMENTS // (batch * max_len))
  if length <= chunk:
    return _lookup(history_BxL, pos_BxT, min_ngram, max_ngram)

  def one_position(pos_B):
    proposal_Bx1, matched_Bx1 = _lookup(history_BxL, pos_B[:, None],
                                        min_ngram, max_ngram)
    return proposal_Bx1[:, 0], matched_Bx1[:, 0]

  # lax.map with batch_size vmaps `chunk` positions at a time.
  proposal_TxB, matched_TxB = jax.lax.map(one_position, pos_BxT.T,
                                          batch_size=chunk)
  return proposal_TxB.T, matched_TxB.T
