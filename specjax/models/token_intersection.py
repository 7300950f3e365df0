"""A draft of another tokenizer, seen through the target's vocabulary (TLI).

Token-level intersection (Timor et al., ICML 2025, "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"): the draft proposes only tokens both vocabularies hold, with
its law restricted to them and renormalised. `TokenIntersectionDraft` wraps
a draft model so that it is a `CausalLM` over the TARGET's ids:

* reading: each target token is fed to the draft as its bytes segmented
  into draft tokens (greedy longest match over the draft's vocabulary; at
  most `max_per_token` of them, the last ones), so the draft reads the text
  in its own vocabulary;
* proposing: its logits at a target token's last draft token become logits
  over the target's ids: a shared token (the same bytes in both, or the two
  EOS ids) takes the draft's logit of its counterpart, every other id
  `MASKED_LOGIT`, so q has exactly zero mass there and sums to one over the
  shared tokens.

The loop samples the draft's proposals from these logits and judges them
with the same law, so every chain verifier, draft-length rule, sampling
transform and constraint runs unchanged and the output stays an exact
sample of the target. A proposal is always a shared token, one draft
token long: a one-token call (the loop's drafting steps) feeds one draft
position, and a draft tree's nodes are a tree of draft tokens (where the
draft runs trees), scored below the root the last call read.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks
from specjax.data.token_bytes import token_bytes
from specjax.models.vocab import MASKED_LOGIT

# Fewer shared tokens than this is refused: such a draft could propose
# almost nothing the target writes.
MIN_SHARED = 64


class IntersectionCache(struct.PyTreeNode):
  """The draft's own cache plus where each target position starts in it.

  `draft_len_BxS[b, s]`: draft tokens that hold row b's first s target
  tokens, so rolling `lengths` back to s (as the loop does) rolls the
  draft's cache back to `draft_len_BxS[b, s]`.
  """
  inner: Any
  draft_len_BxS: jax.Array
  lengths: jax.Array

  @classmethod
  def create(cls, draft: Any, batch_size: int, max_len: int,
             max_per_token: int, margin: int = 0) -> "IntersectionCache":
    """An empty cache for `max_len` target positions, each up to
    `max_per_token` draft positions, plus `margin` draft slots past them;
    capped at the draft's `max_positions`."""
    inner_len = max_len * max_per_token + margin
    limit = getattr(draft, "max_positions", None)
    if limit is not None:
      inner_len = min(inner_len, limit)
    return cls(inner=draft.init_cache(batch_size, inner_len),
               draft_len_BxS=jnp.zeros((batch_size, max_len + 1), jnp.int32),
               lengths=jnp.zeros((batch_size,), jnp.int32))

  def move(self, src_BxK: jax.Array, dst_BxK: jax.Array
           ) -> "IntersectionCache":
    """`KVCache.move` in target slots, after a draft tree: the tree region
    starts after the root (target slot `lengths`) and each node is one
    draft token, so target slot `lengths + 1 + u` is draft slot
    `draft_len_BxS[lengths + 1] + u`. A pair with a destination outside
    the target's slots is dropped."""
    rows_B = jnp.arange(self.lengths.shape[0])
    start_B = self.draft_len_BxS[rows_B, self.lengths + 1]
    offset_Bx1 = (start_B - self.lengths - 1)[:, None]
    valid_BxK = (dst_BxK >= 0) & (dst_BxK < self.draft_len_BxS.shape[1] - 1)
    inner = self.inner.move(src_BxK + offset_Bx1,
                            jnp.where(valid_BxK, dst_BxK + offset_Bx1, -1))
    # A kept node at target slot P ends the first P + 1 target tokens.
    draft_len = self.draft_len_BxS.at[
        rows_B[:, None], jnp.where(valid_BxK, dst_BxK + 1,
                                   self.draft_len_BxS.shape[1])].set(
                                       dst_BxK + offset_Bx1 + 1, mode="drop")
    return self.replace(inner=inner, draft_len_BxS=draft_len)


def longest_match(data: bytes, index: dict[bytes, int], longest: int
                  ) -> list[int] | None:
  """Greedy longest-match segmentation of `data` into the ids of `index`
  (bytes -> id, tokens of at most `longest` bytes); None when some byte has
  no token."""
  out, i = [], 0
  while i < len(data):
    for n in range(min(longest, len(data) - i), 0, -1):
      token = index.get(data[i:i + n])
      if token is not None:
        out.append(token)
        i += n
        break
    else:
      return None
  return out


def reading_tables(draft: Any, draft_tokenizer: Any, target_tokenizer: Any,
                   target_vocab_size: int | None, max_per_token: int):
  """How the draft reads each target id, and which ids both hold.

  Returns `(to_draft_VxL, to_draft_len_V, from_draft_V, V, target_ids,
  draft_ids)` as numpy arrays and counts (see `TokenIntersectionDraft`'s
  attributes); `target_ids`/`draft_ids`: the tokenizers' id counts.

  Raises:
    TypeError when `draft` is no `CausalLM`; ValueError when some byte has
    no draft token, or the draft tokenizer has more ids than the model.
  """
  if not (callable(draft) and hasattr(draft, "init_cache")
          and hasattr(draft, "vocab_size")):
    raise TypeError("draft must be a CausalLM (vocab_size, init_cache, "
                    f"__call__), got {type(draft).__name__}.")
  max_per_token = _checks.check_int("max_per_token", max_per_token, low=1)
  target_bytes = token_bytes(target_tokenizer)
  draft_bytes = token_bytes(draft_tokenizer)
  vocab = len(target_bytes) if target_vocab_size is None else (
      _checks.check_int("target_vocab_size", target_vocab_size,
                        low=len(target_bytes)))
  if len(draft_bytes) > draft.vocab_size:
    raise ValueError(f"draft_tokenizer has {len(draft_bytes)} ids, more "
                     f"than the draft's vocab_size {draft.vocab_size}.")
  index = {}
  for i, b in enumerate(draft_bytes):
    if b:
      index.setdefault(b, i)  # duplicates: the lowest id reads them
  longest = max(len(b) for b in index)
  # A special id of the target (BOS, EOS, ...) is read as the draft's
  # matching special where there is one, else as its EOS: any fixed
  # reading keeps the output exact.
  draft_eos = getattr(draft_tokenizer, "eos_id", None)
  target_eos = set(getattr(target_tokenizer, "eos_ids", ()) or ())
  draft_bos = getattr(draft_tokenizer, "bos_id", None)
  target_bos = getattr(target_tokenizer, "bos_id", None)
  fallback = draft_eos if draft_eos is not None else 0
  to_draft = np.zeros((vocab, max_per_token), np.int32)
  lengths = np.ones(vocab, np.int32)
  from_draft = np.full(vocab, -1, np.int32)
  unreadable = []
  for t, b in enumerate(target_bytes):
    if b is None:
      special = (draft_bos if t == target_bos and draft_bos is not None
                 else fallback)
      to_draft[t, 0] = special
      if t in target_eos and draft_eos is not None:
        from_draft[t] = draft_eos
      continue
    ids = longest_match(b, index, longest)
    if ids is None:
      unreadable.append(t)
      to_draft[t, 0] = fallback
      continue
    ids = ids[-max_per_token:]
    to_draft[t, :len(ids)] = ids
    lengths[t] = len(ids)
    if len(ids) == 1 and draft_bytes[ids[0]] == b:
      from_draft[t] = ids[0]
  if unreadable:
    raise ValueError(
        f"{len(unreadable)} target tokens hold bytes no draft token does "
        f"(first: id {unreadable[0]}, {target_bytes[unreadable[0]]!r}); "
        "the draft's vocabulary needs every byte (byte-level BPE and "
        "byte fallback have them).")
  # As wide as the longest reading, not the cap: each call feeds T times
  # this many draft positions.
  to_draft = to_draft[:, :int(lengths.max())]
  return (to_draft, lengths, from_draft, vocab, len(target_bytes),
          len(draft_bytes))


class TokenIntersectionDraft(struct.PyTreeNode):
  """`draft` (a `CausalLM` over its own ids) as a draft over the target's
  `vocab_size` ids. Build with `TokenIntersectionDraft.build`.

  Attributes:
    draft: the wrapped model.
    to_draft_VxL: int32 `[V, L]`: the draft ids each target id is read as,
      left-aligned; `to_draft_len_V` int32 `[V]` how many (1..L).
    from_draft_V: int32 `[V]`: the draft id whose logit a shared target id
      takes, -1 for the others.
    vocab_size: V, the target's ids; num_shared: shared ids.
  """
  draft: Any
  to_draft_VxL: jax.Array
  to_draft_len_V: jax.Array
  from_draft_V: jax.Array
  vocab_size: int = struct.field(pytree_node=False)
  num_shared: int = struct.field(pytree_node=False)

  @classmethod
  def build(cls, draft: Any, draft_tokenizer: Any, target_tokenizer: Any, *,
            target_vocab_size: int | None = None, max_per_token: int = 16,
            min_shared: int = MIN_SHARED) -> "TokenIntersectionDraft":
    """Maps `draft`'s vocabulary onto the target's, by token bytes.

    Args:
      draft: a `CausalLM` whose ids are `draft_tokenizer`'s.
      draft_tokenizer, target_tokenizer: `ByteTokenizer`s, `HFTokenizer`s
        or lists of each id's bytes (`specjax.data.token_bytes`).
      target_vocab_size: the target model's head (default: the target
        tokenizer's ids); ids past the tokenizer are never proposed.
      max_per_token: the most draft tokens one target token is read as
        (its last ones; a longer token is cut, which only changes what the
        draft reads).
      min_shared: refuse a pair sharing fewer tokens.

    Raises:
      ValueError naming the counts when the vocabularies share fewer than
      `min_shared` tokens, or when some byte has no draft token.
    """
    to_draft, lengths, from_draft, vocab, target_count, draft_count = (
        reading_tables(draft, draft_tokenizer, target_tokenizer,
                       target_vocab_size, max_per_token))
    min_shared = _checks.check_int("min_shared", min_shared, low=1)
    shared = int((from_draft >= 0).sum())
    if shared < min_shared:
      raise ValueError(
          f"the draft and target vocabularies share {shared} tokens (of "
          f"{target_count} target and {draft_count} draft ids), "
          f"fewer than min_shared={min_shared}: such a draft could propose "
          "almost nothing. Pick a draft with a closer vocabulary.")
    return cls(draft=draft, to_draft_VxL=jnp.asarray(to_draft),
               to_draft_len_V=jnp.asarray(lengths),
               from_draft_V=jnp.asarray(from_draft), vocab_size=vocab,
               num_shared=shared)

  @property
  def max_per_token(self) -> int:
    return int(self.to_draft_VxL.shape[1])

  @property
  def one_hot_q(self) -> bool:
    return getattr(self.draft, "one_hot_q", False)

  @property
  def tree_decode(self):
    """Draft trees, where the draft has them (None otherwise, so
    `protocol.supports_trees` refuses): `_tree_decode`."""
    if not callable(getattr(self.draft, "tree_decode", None)):
      return None
    return self._tree_decode

  def _tree_decode(self, tokens_BxL: jax.Array, cache: IntersectionCache,
                   depth_T, ancestor_TxT, nodes=None
                   ) -> tuple[jax.Array, IntersectionCache]:
    """Scores a level of a draft tree (`TransformerLM.tree_decode`'s
    layout: node 0 is the root, the last committed token at target slot
    `cache.lengths`, which `__call__` has read).

    Every other node is a shared token, one draft token (q has no mass
    elsewhere), so the draft scores the tree without its root: node u at
    draft slot `draft_len_BxS[lengths + 1] + u - 1` and depth
    `depth_T[u] - 1`. Returns logits float32 `[B, L, V]` over the target's
    ids and the cache, `lengths` unchanged.
    """
    depth_T = np.asarray(depth_T, np.int32)
    ancestor_TxT = np.asarray(ancestor_TxT, bool)
    if nodes is None or 0 in tuple(nodes) or depth_T[0] != 0 or not (
        ancestor_TxT[:, 0].all()):
      raise ValueError(
          "a TokenIntersectionDraft scores a tree's levels below its root "
          "(nodes without 0, node 0 the root at depth 0): the root is the "
          "last committed token, which the draft reads by a call.")
    rows_B = jnp.arange(tokens_BxL.shape[0])
    ids_BxL = jnp.take_along_axis(
        self.to_draft_VxL[tokens_BxL],
        (self.to_draft_len_V[tokens_BxL] - 1)[..., None], -1)[..., 0]
    start_B = cache.draft_len_BxS[rows_B, cache.lengths + 1]
    logits_BxLxW, inner = self.draft.tree_decode(
        ids_BxL, cache.inner.replace(lengths=start_B), depth_T[1:] - 1,
        ancestor_TxT[1:, 1:], nodes=tuple(int(u) - 1 for u in nodes))
    return self._on_target(logits_BxLxW.astype(jnp.float32)), cache.replace(
        inner=inner)

  def _on_target(self, logits_BxTxW: jax.Array) -> jax.Array:
    """The draft's logits as logits over the target's ids `[B, T, V]`."""
    shared_V = self.from_draft_V >= 0
    return jnp.where(shared_V,
                     logits_BxTxW[..., jnp.maximum(self.from_draft_V, 0)],
                     MASKED_LOGIT)

  @property
  def max_positions(self) -> int | None:
    """Target positions that surely fit the draft's context: each may take
    `max_per_token` draft positions."""
    limit = getattr(self.draft, "max_positions", None)
    return None if limit is None else max(1, limit // self.max_per_token)

  def init_cache(self, batch_size: int, max_len: int) -> IntersectionCache:
    return IntersectionCache.create(self.draft, batch_size, max_len,
                                    self.max_per_token)

  def __call__(self, tokens_BxT: jax.Array, cache: IntersectionCache
               ) -> tuple[jax.Array, IntersectionCache]:
    """Scores T target tokens: logits float32 `[B, T, V]` over the target's
    ids, and the cache with `lengths += T`."""
    # A one-token call reads its token's last draft token only: the loop's
    # drafting steps feed the draft's own (shared) proposals, one draft
    # token each.
    logits_BxTxW, cache = read(self, tokens_BxT, cache,
                               last_only=tokens_BxT.shape[1] == 1)
    return self._on_target(logits_BxTxW), cache


def read(tables: Any, tokens_BxT: jax.Array, cache: Any, last_only=False
         ) -> tuple[jax.Array, Any]:
  """The draft (`tables.draft`) reads T target tokens as its own ids.

  Args:
    tables: anything with `draft`, `to_draft_VxL` and `to_draft_len_V` (a
      `TokenIntersectionDraft`'s attributes).
    tokens_BxT: int32 target ids.
    cache: a cache with `inner`, `draft_len_BxS` and `lengths` (as
      `IntersectionCache`); reading starts at draft position
      `draft_len_BxS[b, lengths[b]]`.
    last_only: static; read each token as its last draft token alone.

  Returns:
    The draft's float32 logits `[B, T, W]` after each token's last draft
    token, and the cache with `lengths += T`, `draft_len_BxS` set for the
    T new positions and `inner` at the end of what was read.
  """
  batch, num = tokens_BxT.shape
  rows_B = jnp.arange(batch)
  longest = tables.to_draft_VxL.shape[1]
  width = 1 if last_only else longest
  ids_BxTxL = tables.to_draft_VxL[tokens_BxT]
  len_BxT = jnp.minimum(tables.to_draft_len_V[tokens_BxT], width)
  if width < longest:
    last_BxT = tables.to_draft_len_V[tokens_BxT] - 1
    ids_BxTxL = jnp.take_along_axis(ids_BxTxL, last_BxT[..., None], -1)
  end_BxT = jnp.cumsum(len_BxT, axis=1)
  start_B = cache.draft_len_BxS[rows_B, cache.lengths]
  # Pack each row's draft tokens from position 0 of this call's window;
  # unused slots are written past the row's length and never read.
  slot_BxTxL = (end_BxT - len_BxT)[..., None] + jnp.arange(width)
  used_BxTxL = jnp.arange(width) < len_BxT[..., None]
  packed = jnp.zeros((batch, num * width), jnp.int32)
  packed = packed.at[rows_B[:, None, None],
                     jnp.where(used_BxTxL, slot_BxTxL, num * width)].set(
                         ids_BxTxL, mode="drop")
  logits_BxMxW, inner = tables.draft(packed,
                                     cache.inner.replace(lengths=start_B))
  logits_BxTxW = jnp.take_along_axis(
      logits_BxMxW, (end_BxT - 1)[..., None], axis=1).astype(jnp.float32)
  draft_len = cache.draft_len_BxS.at[
      rows_B[:, None], cache.lengths[:, None] + 1 + jnp.arange(num)].set(
          start_B[:, None] + end_BxT, mode="drop")
  return logits_BxTxW, cache.replace(
      inner=inner.replace(lengths=start_B + end_BxT[:, -1]),
      draft_len_BxS=draft_len, lengths=cache.lengths + num)
