"""A draft of another tokenizer that proposes text (string-level exact match).

String-level exact match, SLEM (Timor et al., ICML 2025, "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"): the draft writes text in its own tokens, the text is cut
into the TARGET's tokens, and the target judges those tokens in its own
tokenization. `StringLevelDraft` wraps a draft model so that it is a
`CausalLM` over the target's ids with `one_hot_q`: each proposal is one
target token, and the law it is judged against is the point mass on it.

Why the output is exact. A proposal is a function of the committed text
and of the draft's own random stream (a key in its cache, never the
verifier's uniforms). Given both, the proposal is fixed, so its law is
one-hot, and every chain verifier with a one-hot q keeps the target's law
(token verification keeps x with probability p(x) and else draws from p
without x). Nothing about how the text is cut, nor whether the draft read
the context perfectly, can bias the output; those choices change only how
often proposals are kept.

How text becomes target tokens. The draft writes its tokens one at a time
(its argmax by default, or samples at `draft_temperature`) and appends
their bytes to a buffer; the draft's EOS (any special id) is the symbol
256. The buffer
is cut by greedy longest match over the target's vocabulary: the walk
follows the buffer's bytes down the target's tokens (sorted by bytes, so
each prefix is a contiguous range, found by binary search) and stops where
no longer token continues; the longest complete token on the way is the
proposal. The draft samples more only while the walk could still continue,
so a proposal costs its own bytes' draft passes plus at most one byte of
look-ahead, which the next proposal reuses. Longest match is not the
target's own segmentation (BPE's merges, SentencePiece's scores); where
they differ a proposal is less likely to be kept, never wrong.

Reading. The loop rolls the draft back each round and re-reads committed
target tokens; those are read as in `TokenIntersectionDraft` (each target
token's bytes segmented into draft tokens). A proposal the loop feeds
back (its own drafts) is not re-read: its bytes are already in the draft's
cache. When a draft token straddles the end of a proposal, the position a
rollback returns to is after that draft token, so a later re-read may see
a few bytes twice; this touches what the draft reads, not the output law.

Cost. The draft's passes per proposal vary with the token's bytes (the
loop's `draft_calls` counts one per proposal). Trees are refused
(no `tree_decode`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks
from specjax.data.token_bytes import token_bytes
from specjax.models import token_intersection
from specjax.models.vocab import MASKED_LOGIT

# The buffer's symbol for the draft's EOS (and any id without text).
EOS_SYMBOL = 256


class StringLevelCache(struct.PyTreeNode):
  """The draft's cache, how target positions map into it, and the text it
  has drafted but not yet proposed.

  inner, draft_len_BxS, lengths: as `IntersectionCache`.
  buffer_BxK: int32 symbols (bytes, or `EOS_SYMBOL`) drafted after the last
    proposal, -1 past `buffer_len_B`; each already read by the draft.
  buffer_end_BxK: int32, the draft position after the draft token that
    holds each buffered symbol.
  logits_BxW: float32, the draft's logits after its last token.
  proposal_B: int32, the target id last proposed (-1: none), covering the
    first `proposal_len_B` buffered symbols.
  draws_B: int32, draft tokens sampled so far (folded into the row's key).
  """
  inner: Any
  draft_len_BxS: jax.Array
  lengths: jax.Array
  buffer_BxK: jax.Array
  buffer_end_BxK: jax.Array
  buffer_len_B: jax.Array
  logits_BxW: jax.Array
  proposal_B: jax.Array
  proposal_len_B: jax.Array
  draws_B: jax.Array


class StringLevelDraft(struct.PyTreeNode):
  """`draft` (a `CausalLM` over its own ids) proposing text for a target of
  `vocab_size` ids. Build with `StringLevelDraft.build`.

  Attributes:
    draft, to_draft_VxL, to_draft_len_V: how the draft reads target tokens
      (`TokenIntersectionDraft`'s attributes of the same names).
    symbols_WxM: int32 `[W, M]`: each draft id's bytes (special ids:
      `EOS_SYMBOL`), -1 padded; `symbols_len_W` how many.
    sorted_ids_N: int32, the target ids with text of at most
      `max_token_bytes` bytes, sorted by their bytes; `sorted_bytes_NxL`
      int32 their bytes, -1 padded (so a prefix sorts first);
      `sorted_len_N` their lengths.
    eos_id: the target id proposed for the draft's EOS (-1: none).
    vocab_size: V, the target's ids.
    draft_temperature: the draft's sampling temperature (0: argmax).
    seed: the draft's random stream (row b's is seed's key folded with b).
  """
  draft: Any
  to_draft_VxL: jax.Array
  to_draft_len_V: jax.Array
  symbols_WxM: jax.Array
  symbols_len_W: jax.Array
  sorted_ids_N: jax.Array
  sorted_bytes_NxL: jax.Array
  sorted_len_N: jax.Array
  eos_id: int = struct.field(pytree_node=False)
  vocab_size: int = struct.field(pytree_node=False)
  draft_temperature: float = struct.field(pytree_node=False)
  seed: int = struct.field(pytree_node=False)

  one_hot_q = True

  @classmethod
  def build(cls, draft: Any, draft_tokenizer: Any, target_tokenizer: Any, *,
            target_vocab_size: int | None = None,
            draft_temperature: float = 0.0, seed: int = 0,
            max_token_bytes: int = 16, max_per_token: int = 16
            ) -> "StringLevelDraft":
    """Wraps `draft` to propose the target's tokens from its own text.

    Args:
      draft: a `CausalLM` whose ids are `draft_tokenizer`'s.
      draft_tokenizer, target_tokenizer: `ByteTokenizer`s, `HFTokenizer`s
        or lists of each id's bytes (`specjax.data.token_bytes`).
      target_vocab_size: the target model's head (default: the target
        tokenizer's ids); ids past the tokenizer are never proposed.
      draft_temperature: >= 0; the draft samples its text at this
        temperature, whatever the target's sampling. 0 (the default) is
        its argmax, which suits every target temperature: a point-mass
        proposal x is kept with probability p(x), and the most likely
        text beats a sample (max p >= sum p^2 where the draft's law is
        the target's).
      seed: the draft's random stream.
      max_token_bytes: target tokens longer than this are never proposed
        (the walk looks at most this far).
      max_per_token: as in `TokenIntersectionDraft.build`.

    Raises:
      ValueError when some byte has no draft token, when no target token
      has text, or for an argument out of range (named).
    """
    to_draft, lengths, _, vocab, _, _ = token_intersection.reading_tables(
        draft, draft_tokenizer, target_tokenizer, target_vocab_size,
        max_per_token)
    draft_temperature = _checks.check_float("draft_temperature",
                                            draft_temperature)
    if not draft_temperature >= 0.0:
      raise ValueError("draft_temperature must be >= 0 (0: the draft's "
                       f"argmax), got {draft_temperature}.")
    seed = _checks.check_int("seed", seed, low=0)
    max_token_bytes = _checks.check_int("max_token_bytes", max_token_bytes,
                                        low=1)
    draft_bytes = token_bytes(draft_tokenizer)
    draft_bytes += [None] * (draft.vocab_size - len(draft_bytes))
    width = max(1, max(len(b) for b in draft_bytes if b))
    symbols = np.full((len(draft_bytes), width), -1, np.int32)
    symbols_len = np.ones(len(draft_bytes), np.int32)
    for i, b in enumerate(draft_bytes):
      if b:
        symbols[i, :len(b)] = list(b)
        symbols_len[i] = len(b)
      else:
        symbols[i, 0] = EOS_SYMBOL
    target_bytes = token_bytes(target_tokenizer)
    entries = sorted((b, t) for t, b in enumerate(target_bytes)
                     if b and len(b) <= max_token_bytes)
    if not entries:
      raise ValueError("target_tokenizer has no token with text of at most "
                       f"max_token_bytes={max_token_bytes} bytes.")
    longest = max(len(b) for b, _ in entries)
    sorted_bytes = np.full((len(entries), longest), -1, np.int32)
    for n, (b, _) in enumerate(entries):
      sorted_bytes[n, :len(b)] = list(b)
    eos_ids = getattr(target_tokenizer, "eos_ids", ()) or ()
    return cls(
        draft=draft, to_draft_VxL=jnp.asarray(to_draft),
        to_draft_len_V=jnp.asarray(lengths),
        symbols_WxM=jnp.asarray(symbols),
        symbols_len_W=jnp.asarray(symbols_len),
        sorted_ids_N=jnp.asarray([t for _, t in entries], jnp.int32),
        sorted_bytes_NxL=jnp.asarray(sorted_bytes),
        sorted_len_N=jnp.asarray([len(b) for b, _ in entries], jnp.int32),
        eos_id=int(eos_ids[0]) if eos_ids else -1, vocab_size=vocab,
        draft_temperature=draft_temperature, seed=seed)

  @property
  def max_per_token(self) -> int:
    return int(self.to_draft_VxL.shape[1])

  @property
  def buffer_size(self) -> int:
    """Symbols the buffer holds: a whole walk plus one draft token."""
    return int(self.sorted_bytes_NxL.shape[1] + self.symbols_WxM.shape[1])

  @property
  def max_positions(self) -> int | None:
    """Target positions that surely fit the draft's context."""
    limit = getattr(self.draft, "max_positions", None)
    if limit is None:
      return None
    return max(1, (limit - self._margin) // self.max_per_token)

  @property
  def _margin(self) -> int:
    # Look-ahead past the committed text, and a parked read (`_mixed`).
    return self.buffer_size + self.max_per_token

  def init_cache(self, batch_size: int, max_len: int) -> StringLevelCache:
    inner_len = max_len * self.max_per_token + self._margin
    limit = getattr(self.draft, "max_positions", None)
    if limit is not None:
      inner_len = min(inner_len, limit)
    size = self.buffer_size
    return StringLevelCache(
        inner=self.draft.init_cache(batch_size, inner_len),
        draft_len_BxS=jnp.zeros((batch_size, max_len + 1), jnp.int32),
        lengths=jnp.zeros((batch_size,), jnp.int32),
        buffer_BxK=jnp.full((batch_size, size), -1, jnp.int32),
        buffer_end_BxK=jnp.zeros((batch_size, size), jnp.int32),
        buffer_len_B=jnp.zeros((batch_size,), jnp.int32),
        logits_BxW=jnp.zeros((batch_size, self.draft.vocab_size),
                             jnp.float32),
        proposal_B=jnp.full((batch_size,), -1, jnp.int32),
        proposal_len_B=jnp.zeros((batch_size,), jnp.int32),
        draws_B=jnp.zeros((batch_size,), jnp.int32))

  def __call__(self, tokens_BxT: jax.Array, cache: StringLevelCache
               ) -> tuple[jax.Array, StringLevelCache]:
    """Reads T target tokens and proposes the next: logits float32
    `[B, T, V]`, at every position 0 on the proposal and `MASKED_LOGIT`
    elsewhere, and the cache with `lengths += T`."""
    if tokens_BxT.shape[1] == 1:
      # The loop feeds back its drafts, which are this draft's proposals:
      # their bytes are read already (`_consume`). Any other token (a
      # constraint may overrule a proposal) is read.
      own_B = ((tokens_BxT[:, 0] == cache.proposal_B)
               & (cache.proposal_len_B > 0))
      cache = jax.lax.cond(jnp.all(own_B), lambda c: self._consume(c),
                           lambda c: self._mixed(tokens_BxT, c, own_B),
                           cache)
    else:
      cache = self._read(tokens_BxT, cache)
    cache = self._draft_text(cache)
    batch, num = tokens_BxT.shape
    logits_BxV = jnp.where(
        jnp.arange(self.vocab_size) == cache.proposal_B[:, None], 0.0,
        MASKED_LOGIT).astype(jnp.float32)
    return jnp.broadcast_to(logits_BxV[:, None],
                            (batch, num, self.vocab_size)), cache

  # ------------------------------------------------------------ reading

  def _read(self, tokens_BxT, cache):
    """Reads target tokens as draft tokens; the buffer starts empty."""
    logits_BxTxW, cache = token_intersection.read(self, tokens_BxT, cache)
    return cache.replace(
        logits_BxW=logits_BxTxW[:, -1],
        buffer_BxK=jnp.full_like(cache.buffer_BxK, -1),
        buffer_len_B=jnp.zeros_like(cache.buffer_len_B),
        proposal_B=jnp.full_like(cache.proposal_B, -1),
        proposal_len_B=jnp.zeros_like(cache.proposal_len_B))

  def _consume(self, cache):
    """The last proposal is committed to the text: drop its symbols from
    the buffer; its position ends after its last symbol's draft token."""
    rows_B = jnp.arange(cache.lengths.shape[0])
    used_B = cache.proposal_len_B
    end_B = jnp.take_along_axis(cache.buffer_end_BxK,
                                jnp.maximum(used_B - 1, 0)[:, None], 1)[:, 0]
    size = self.buffer_size
    at_BxK = jnp.arange(size)[None, :] + used_B[:, None]
    keep_BxK = at_BxK < size
    at_BxK = jnp.minimum(at_BxK, size - 1)
    return cache.replace(
        buffer_BxK=jnp.where(keep_BxK, jnp.take_along_axis(
            cache.buffer_BxK, at_BxK, 1), -1),
        buffer_end_BxK=jnp.take_along_axis(cache.buffer_end_BxK, at_BxK, 1),
        buffer_len_B=cache.buffer_len_B - used_B,
        draft_len_BxS=cache.draft_len_BxS.at[rows_B, cache.lengths + 1].set(
            end_B, mode="drop"),
        lengths=cache.lengths + 1,
        proposal_B=jnp.full_like(cache.proposal_B, -1),
        proposal_len_B=jnp.zeros_like(cache.proposal_len_B))

  def _mixed(self, tokens_Bx1, cache, own_B):
    """Rows feeding back their proposal consume it; the others read their
    token. The read runs for every row, so a consuming row's read is
    parked past its draft's text (its `draft_len` entry at `lengths`
    pointing there) and its cache is then kept."""
    consumed = self._consume(cache)
    rows_B = jnp.arange(cache.lengths.shape[0])
    parked = cache.draft_len_BxS.at[rows_B, cache.lengths].set(
        jnp.where(own_B, cache.inner.lengths,
                  cache.draft_len_BxS[rows_B, cache.lengths]))
    read = self._read(tokens_Bx1, cache.replace(draft_len_BxS=parked))
    own = lambda a, b: jnp.where(
        own_B.reshape(own_B.shape + (1,) * (a.ndim - 1)), a, b)
    # Every field but `inner` leads with the batch; the draft's cache may
    # not (its arrays are the read's, only its lengths differ per row).
    inner = read.inner.replace(lengths=jnp.where(
        own_B, consumed.inner.lengths, read.inner.lengths))
    mixed = jax.tree.map(own, consumed.replace(inner=None),
                         read.replace(inner=None))
    return mixed.replace(inner=inner)

  # ------------------------------------------------------------ drafting

  def _walk(self, buffer_BxK, buffer_len_B):
    """Greedy longest match of each row's buffer over the target's tokens.

    Returns `(token_B, length_B, done_B)`: the proposal and the symbols it
    covers, and whether the buffer settles it (the walk left the
    vocabulary, reached a token nothing extends, or its length limit);
    where it does not, the draft must write more.
    """
    batch = buffer_BxK.shape[0]
    count, longest = self.sorted_bytes_NxL.shape
    steps = max(1, math.ceil(math.log2(count + 1)))

    def first_at_least(lo_B, hi_B, column_N, value_B):
      # The first n in [lo, hi) with column[n] >= value: within a prefix's
      # range the next byte's column is sorted. (Loops, not unrolled: the
      # walk sits inside the loop's scan and this draft's while loop.)
      def halve(_, bounds):
        lo_B, hi_B = bounds
        open_B = lo_B < hi_B
        mid_B = (lo_B + hi_B) // 2
        less_B = column_N[jnp.minimum(mid_B, count - 1)] < value_B
        return (jnp.where(open_B & less_B, mid_B + 1, lo_B),
                jnp.where(open_B & ~less_B, mid_B, hi_B))
      return jax.lax.fori_loop(0, steps, halve, (lo_B, hi_B))[0]

    def step(carry, depth):
      lo_B, hi_B, token_B, length_B, alive_B, done_B = carry
      have_B = depth < buffer_len_B
      c_B = jnp.take_along_axis(buffer_BxK, jnp.full((batch, 1), depth),
                                1)[:, 0]
      column_N = jax.lax.dynamic_index_in_dim(self.sorted_bytes_NxL, depth,
                                              1, keepdims=False)
      start_B = first_at_least(lo_B, hi_B, column_N, c_B)
      stop_B = first_at_least(start_B, hi_B, column_N, c_B + 1)
      step_B = alive_B & have_B & (start_B < stop_B)
      done_B |= alive_B & have_B & (start_B >= stop_B)
      at_B = jnp.minimum(start_B, count - 1)
      complete_B = step_B & (self.sorted_len_N[at_B] == depth + 1)
      token_B = jnp.where(complete_B, self.sorted_ids_N[at_B], token_B)
      length_B = jnp.where(complete_B, depth + 1, length_B)
      # A complete token alone in its range: nothing extends it.
      leaf_B = complete_B & (stop_B - start_B == 1)
      return (jnp.where(step_B, start_B, lo_B),
              jnp.where(step_B, stop_B, hi_B), token_B, length_B,
              step_B & ~leaf_B, done_B | leaf_B), None

    zeros_B = jnp.zeros((batch,), jnp.int32)
    (_, _, token_B, length_B, alive_B, done_B), _ = jax.lax.scan(
        step, (zeros_B, jnp.full((batch,), count, jnp.int32), zeros_B - 1,
               zeros_B, jnp.ones((batch,), bool), jnp.zeros((batch,), bool)),
        jnp.arange(longest))
    first_B = buffer_BxK[:, 0]
    eos_B = (buffer_len_B > 0) & (first_B == EOS_SYMBOL)
    done_B |= alive_B  # walked the longest token's length
    # The draft's EOS proposes the target's; a buffer no token starts (a
    # byte the target cannot spell alone) proposes the first token, one
    # symbol used: any fixed choice keeps the output exact.
    token_B = jnp.where(eos_B, self.eos_id if self.eos_id >= 0
                        else self.sorted_ids_N[0], token_B)
    length_B = jnp.where(eos_B, 1, length_B)
    done_B |= eos_B
    token_B = jnp.where(length_B == 0, self.sorted_ids_N[0], token_B)
    length_B = jnp.maximum(length_B, 1)
    return token_B, length_B, done_B

  def _sample(self, cache, rows_B):
    """One draft token per row from `logits_BxW`, from the row's stream."""
    if self.draft_temperature == 0.0:
      return jnp.argmax(cache.logits_BxW, axis=-1).astype(jnp.int32)
    base = jax.random.key(self.seed)

    def one(row, draws, logits_W):
      key = jax.random.fold_in(jax.random.fold_in(base, row), draws)
      return jax.random.categorical(key, logits_W / self.draft_temperature)

    return jax.vmap(one)(rows_B, cache.draws_B,
                         cache.logits_BxW).astype(jnp.int32)

  def _draft_text(self, cache):
    """Drafts until every row's buffer settles its next proposal."""
    batch = cache.lengths.shape[0]
    rows_B = jnp.arange(batch)
    size = self.buffer_size
    width = self.symbols_WxM.shape[1]

    def more(carry):
      cache, _, _, done_B, steps = carry
      need_B = ~done_B
      w_B = self._sample(cache, rows_B)
      # Append the token's symbols to the rows that need them.
      n_B = jnp.where(need_B, self.symbols_len_W[w_B], 0)
      at_BxM = cache.buffer_len_B[:, None] + jnp.arange(width)
      put_BxM = jnp.where(jnp.arange(width) < n_B[:, None], at_BxM, size)
      start_B = cache.inner.lengths
      logits_Bx1xW, inner = self.draft(w_B[:, None], cache.inner)
      inner = inner.replace(lengths=jnp.where(need_B, start_B + 1, start_B))
      cache = cache.replace(
          inner=inner,
          buffer_BxK=cache.buffer_BxK.at[rows_B[:, None], put_BxM].set(
              self.symbols_WxM[w_B], mode="drop"),
          buffer_end_BxK=cache.buffer_end_BxK.at[rows_B[:, None],
                                                 put_BxM].set(
              jnp.broadcast_to((start_B + 1)[:, None], put_BxM.shape),
              mode="drop"),
          buffer_len_B=jnp.minimum(cache.buffer_len_B + n_B, size),
          logits_BxW=jnp.where(need_B[:, None],
                               logits_Bx1xW[:, 0].astype(jnp.float32),
                               cache.logits_BxW),
          draws_B=cache.draws_B + need_B)
      return (cache, *self._walk(cache.buffer_BxK, cache.buffer_len_B),
              steps + 1)

    # Each pass adds at least one symbol to every unsettled row, and a walk
    # settles within the longest token's length plus one.
    limit = self.sorted_bytes_NxL.shape[1] + 1
    cache, token_B, length_B, _, _ = jax.lax.while_loop(
        lambda c: jnp.any(~c[3]) & (c[4] < limit), more,
        (cache, *self._walk(cache.buffer_BxK, cache.buffer_len_B),
         jnp.int32(0)))
    return cache.replace(proposal_B=token_B, proposal_len_B=length_B)


def longest_match_agreement(texts: list[str], tokenizer: Any,
                            max_token_bytes: int = 16) -> float:
  """The fraction of `tokenizer`'s own tokens of `texts` that greedy
  longest match over its vocabulary (the cut `StringLevelDraft` makes)
  also cuts, at the same offset: where the two differ, a proposal of the
  right text is the wrong token."""
  max_token_bytes = _checks.check_int("max_token_bytes", max_token_bytes,
                                      low=1)
  if not hasattr(tokenizer, "encode"):
    raise TypeError("tokenizer must encode text (an HFTokenizer or "
                    f"ByteTokenizer), got {type(tokenizer).__name__}.")
  pieces = token_bytes(tokenizer)
  index = {b: i for i, b in enumerate(pieces) if b and len(b) <
           max_token_bytes + 1}
  agree = total = 0
  for text in texts:
    cut, at = set(), 0
    ids = token_intersection.longest_match(text.encode(), index,
                                           max_token_bytes) or []
    for i in ids:
      cut.add((at, i))
      at += len(pieces[i])
    at = 0
    for i in tokenizer.encode(text):
      if pieces[i]:
        agree += (at, i) in cut
        total += 1
        at += len(pieces[i])
  if not total:
    raise ValueError("texts hold no token with text.")
  return agree / total

