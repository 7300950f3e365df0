"""Count-based unigram and bigram language models: the cheapest drafts.

`NGramLM.fit` counts tokens (order 1) or adjacent pairs (order 2) of a
training token array in numpy, smooths with add-k, and stores the log
probabilities as the model's only leaf. The model then implements the
`CausalLM` protocol: the logits at a position are the log-probabilities of
the next token given the token there (bigram) or given nothing (unigram).

Neither order needs any history beyond the current token, so the cache holds
only `lengths[B]`; it exists so the decode loop treats every model alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks

SUPPORTED_ORDERS = (1, 2)


class NGramCache(struct.PyTreeNode):
  """The cache of a context-free model: just the valid length of each row.

  Attributes:
    lengths: int32 `[B]`, positions of each row seen so far (protocol field;
      roll back with `cache.replace(lengths=...)`).
    max_len: static capacity (informational: nothing is stored per position).
  """
  lengths: jax.Array
  max_len: int = struct.field(pytree_node=False)

  def move(self, src_BxK: jax.Array, dst_BxK: jax.Array) -> "NGramCache":
    """The tree round's `KVCache.move`: nothing is stored per position."""
    del src_BxK, dst_BxK
    return self


def ngram_counts(tokens_N, vocab_size: int, order: int) -> np.ndarray:
  """Exact counts: int64 `[V]` (order 1) or `[V, V]` (order 2).

  `tokens_N` is one integer `[N]` array, or a list or tuple of them
  (separate sequences, e.g. prompts of different lengths). For order 2,
  `counts[a, b]` is the number of i with `tokens[i] == a` and
  `tokens[i + 1] == b` within one array: no pair joins the end of one
  sequence to the start of the next. Inside one array, pairs across
  document boundaries (`EOS BOS`) are counted like any other, since the
  draft sees them too.
  """
  vocab_size = _checks.check_int("vocab_size", vocab_size, low=1)
  order = _check_order(order)
  if isinstance(tokens_N, (list, tuple)) and tokens_N and not np.isscalar(
      tokens_N[0]):
    seqs = [np.asarray(_checks.check_array(f"tokens[{i}]", t, rank=1,
                                           kind="i")).astype(np.int64)
            for i, t in enumerate(tokens_N)]
  else:
    seqs = [np.asarray(_checks.check_array("tokens", tokens_N, rank=1,
                                           kind="i")).astype(np.int64)]
  if max(t.size for t in seqs) < order:
    raise ValueError(f"tokens has no sequence of {order} tokens; an "
                     f"order-{order} model needs at least {order} in one.")
  for t in seqs:
    if t.size and (t.min() < 0 or t.max() >= vocab_size):
      raise ValueError(f"tokens must lie in [0, vocab_size={vocab_size}), got "
                       f"values in [{t.min()}, {t.max()}].")
  if order == 1:
    return np.bincount(np.concatenate(seqs), minlength=vocab_size)
  pair_ids = np.concatenate([t[:-1] * vocab_size + t[1:] for t in seqs])
  return np.bincount(pair_ids, minlength=vocab_size * vocab_size).reshape(
      vocab_size, vocab_size)


def _check_order(order) -> int:
  order = _checks.check_int("order", order)
  if order not in SUPPORTED_ORDERS:
    raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}.")
  return order


class NGramLM(struct.PyTreeNode):
  """A unigram or bigram model over `vocab_size` tokens (a `CausalLM`).

  Attributes:
    log_probs: float32 `[V]` (order 1) or `[V, V]` (order 2), where
      `log_probs[a, b] = log P(next = b | current = a)`. Every row is a
      normalised distribution with all entries finite (smoothing > 0).
    vocab_size: V (static).
    order: 1 or 2 (static).
    max_positions: None: the model has no length limit.
    one_hot_q: False: the distribution is never one-hot.
  """
  log_probs: jax.Array
  vocab_size: int = struct.field(pytree_node=False)
  order: int = struct.field(pytree_node=False)
  max_positions: int | None = struct.field(pytree_node=False, default=None)
  one_hot_q: bool = struct.field(pytree_node=False, default=False)

  @classmethod
  def fit(cls, tokens_N, vocab_size: int, order: int = 2, *,
          smoothing: float = 1.0) -> "NGramLM":
    """Fits add-k smoothed counts of `tokens_N`: any integer `[N]` array, or
    a list of them, whose pairs are counted within each (`ngram_counts`).

    `P(b | a) = (counts[a, b] + k) / (sum_b' counts[a, b'] + k V)`, with
    `k = smoothing > 0`, so every token keeps positive mass and a context
    never seen in training gets the uniform distribution. Computed in
    float64, stored as float32.

    Refuses (ValueError naming smoothing) a k so large that k V overflows
    float64, or so small that an unseen token's k / (counts + k V)
    underflows to 0: either would store log-probabilities of -inf.
    """
    k = _checks.check_float("smoothing", smoothing)
    if k <= 0:
      raise ValueError(f"smoothing must be > 0 (add-k), got {k}: with 0, an "
                       "unseen token gets log-probability -inf and an unseen "
                       "context a 0/0 row.")
    counts = ngram_counts(tokens_N, vocab_size, order).astype(np.float64)
    with np.errstate(over="ignore", divide="ignore"):  # refused just below
      probs = (counts + k) / (counts.sum(axis=-1, keepdims=True)
                              + k * vocab_size)
      log_probs = np.log(probs)
    # Checked on the result, so the bound is exact whatever the counts.
    if not np.isfinite(log_probs).all():
      raise ValueError(
          f"smoothing={k} overflows or underflows float64 in (counts + k) / "
          f"(total + k * vocab_size) with vocab_size={vocab_size}, giving "
          "log-probabilities of -inf; use a moderate smoothing such as 1.0 "
          "(add-one) or 0.01.")
    return cls(log_probs=jnp.asarray(log_probs, jnp.float32),
               vocab_size=vocab_size, order=order)

  @classmethod
  def uniform(cls, vocab_size: int) -> "NGramLM":
    """The uniform distribution as an order-1 model (a neutral fallback)."""
    vocab_size = _checks.check_int("vocab_size", vocab_size, low=1)
    return cls(log_probs=jnp.full((vocab_size,), -np.log(vocab_size),
                                  jnp.float32),
               vocab_size=vocab_size, order=1)

  def __post_init__(self):
    _check_order(self.order)
    shape = getattr(self.log_probs, "shape", None)
    # Inside jax transformations leaves can be placeholders (object()): only
    # check real arrays.
    if shape is not None and tuple(shape) != (self.vocab_size,) * self.order:
      raise ValueError(f"log_probs must have shape {(self.vocab_size,) * self.order}"
                       f" for order {self.order}, vocab_size {self.vocab_size}; "
                       f"got {tuple(shape)}.")

  def init_cache(self, batch_size: int, max_len: int) -> NGramCache:
    """An empty cache: `lengths` zeros int32 `[batch_size]`."""
    batch_size = _checks.check_int("batch_size", batch_size, low=1)
    max_len = _checks.check_int("max_len", max_len, low=1)
    return NGramCache(lengths=jnp.zeros((batch_size,), jnp.int32),
                      max_len=max_len)

  def __call__(self, tokens_BxT: jax.Array,
               cache: NGramCache) -> tuple[jax.Array, NGramCache]:
    """Logits float32 `[B, T, V]`: log P(next | tokens[b, t]); lengths += T.

    Pure and jit-able. The output at a position depends only on the token
    there (bigram) or on nothing (unigram), so ragged `lengths` need no
    masking.
    """
    tokens_BxT = _checks.check_array("tokens", tokens_BxT, rank=2, kind="i")
    if _checks.is_concrete(tokens_BxT):  # an id off the table read another
      _checks.check_token_range("tokens", tokens_BxT, self.vocab_size)
    batch, length = tokens_BxT.shape
    if cache.lengths.shape != (batch,):
      raise ValueError(f"cache.lengths has shape {tuple(cache.lengths.shape)} "
                       f"but tokens has batch size {batch}; make the cache with "
                       f"init_cache({batch}, max_len).")
    log_probs = jnp.asarray(self.log_probs, jnp.float32)
    if self.order == 1:
      logits_BxTxV = jnp.broadcast_to(log_probs,
                                      (batch, length, self.vocab_size))
    else:
      logits_BxTxV = log_probs[jnp.asarray(tokens_BxT)]
    return logits_BxTxV, cache.replace(lengths=cache.lengths + length)

  def tree_decode(self, tokens_BxL: jax.Array, cache: NGramCache, depth_T,
                  ancestor_TxT, nodes=None) -> tuple[jax.Array, NGramCache]:
    """`TransformerLM.tree_decode` for a context-free model: exact for free.

    A node's logits depend only on its own token, never on its ancestors, so
    scoring a tree is scoring its tokens. `lengths` advances by T = len(
    depth_T) for the whole tree and is unchanged for a part (`nodes`).
    """
    del ancestor_TxT
    logits_BxLxV, _ = self(tokens_BxL, cache)
    advance = len(depth_T) if nodes is None else 0
    return logits_BxLxV, cache.replace(lengths=cache.lengths + advance)
