"""Vocabularies of draft/target pairs: padding rows and reduced draft heads.

* `reconcile(target, draft, target_tokenizer, draft_tokenizer)`: model heads
  that differ only by padding rows (Qwen2.5-0.5B's 151,936 against 7B's
  152,064) become one vocabulary of max(V_target, V_draft) ids, where every
  id past the tokenizer's last real id gets logit `MASKED_LOGIT`, so exactly
  zero mass in p and q under every sampling config. Refused (ValueError
  naming the first differing id and both tokens) unless the two tokenizers
  agree on every real id.
* `ReducedVocabLM(draft, token_ids_K)`: the draft's head restricted to K
  tokens (e.g. `frequent_tokens`); q is exactly 0 elsewhere. The output
  stays an exact sample from the target (the coupling handles q(x) = 0);
  only the acceptance rate can change, while the draft's vocabulary
  projection shrinks from V to K columns.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks
from specjax.models import transformer
from specjax.models.transformer import TransformerLM

# Finite (so no non-finite-logit alarm fires) yet far enough below any real
# logit that softmax underflows to exactly 0 after the max is subtracted, at
# every temperature `SamplingConfig` accepts (<= sampling.MAX_TEMPERATURE).
MASKED_LOGIT = -1e30


class PaddedVocabLM(struct.PyTreeNode):
  """A `CausalLM` seen through a vocabulary of `vocab_size` ids of which only
  the first `num_real` are tokens: logits are padded (or cut) to
  `vocab_size` and every id >= num_real gets `MASKED_LOGIT`."""
  model: Any
  vocab_size: int = struct.field(pytree_node=False)
  num_real: int = struct.field(pytree_node=False)

  def __post_init__(self):
    if not all(hasattr(self.model, a) for a in ("vocab_size", "init_cache")):
      raise TypeError("PaddedVocabLM model must be a CausalLM (vocab_size, "
                      "init_cache, __call__), got "
                      f"{type(self.model).__name__}.")
    vocab = _checks.check_int("PaddedVocabLM vocab_size", self.vocab_size,
                              low=1)
    # Every real id must be one the model scores (and embeds).
    _checks.check_int("PaddedVocabLM num_real", self.num_real, low=1,
                      high=min(vocab, self.model.vocab_size))

  @property
  def one_hot_q(self) -> bool:
    return getattr(self.model, "one_hot_q", False)

  @property
  def max_positions(self):
    return getattr(self.model, "max_positions", None)

  def init_cache(self, batch_size: int, max_len: int):
    return self.model.init_cache(batch_size, max_len)

  def __call__(self, tokens_BxT, cache):
    logits_BxTxW, cache = self.model(tokens_BxT, cache)
    return self._pad(logits_BxTxW), cache

  # The model's window scoring, padded, where it has one (an AttributeError,
  # so `hasattr` is False, where it does not): the decode loop then runs the
  # last block and the head on a prompt's last positions alone
  # (`Goodput.prompt_prior`).
  @property
  def logits_at(self):
    inner = self.model.logits_at

    def logits_at(tokens_BxT, cache, at_BxQ):
      logits_BxQxW, cache = inner(tokens_BxT, cache, at_BxQ)
      return self._pad(logits_BxQxW), cache
    return logits_at

  def _pad(self, logits_BxTxW):
    keep = min(self.num_real, logits_BxTxW.shape[-1])
    logits_BxTxV = jnp.full(logits_BxTxW.shape[:-1] + (self.vocab_size,),
                            MASKED_LOGIT, jnp.float32)
    return logits_BxTxV.at[..., :keep].set(
        logits_BxTxW[..., :keep].astype(jnp.float32))


def _token(tokenizer, i: int):
  return tokenizer.id_to_token(i) if i < tokenizer.vocab_size else None


def check_same_tokenizer(target_tokenizer, draft_tokenizer) -> int:
  """The number of real ids both tokenizers share; raises at the first id
  where they differ (naming it and both tokens)."""
  if target_tokenizer == draft_tokenizer:
    return target_tokenizer.vocab_size
  for name, tok in (("target_tokenizer", target_tokenizer),
                    ("draft_tokenizer", draft_tokenizer)):
    if not hasattr(tok, "id_to_token"):
      raise TypeError(f"{name} ({type(tok).__name__}) cannot be compared id "
                      "by id; pass the same tokenizer object for both.")
  n = max(target_tokenizer.vocab_size, draft_tokenizer.vocab_size)
  for i in range(n):
    a, b = _token(target_tokenizer, i), _token(draft_tokenizer, i)
    if a != b:
      raise ValueError(
          f"The draft's tokenizer differs from the target's at id {i}: "
          f"target {a!r}, draft {b!r}. One vocabulary needs one tokenizer; "
          "for a draft of another tokenizer use specjax.models."
          "TokenIntersectionDraft.build(draft, draft_tokenizer, "
          "target_tokenizer).")
  return n


def reconcile(target, draft, target_tokenizer, draft_tokenizer):
  """`(target, draft)` over one vocabulary, padding ids masked in both.

  Args:
    target, draft: `CausalLM`s whose heads have >= the tokenizers' real ids
      (extra rows are padding, as in Qwen2.5).
    target_tokenizer, draft_tokenizer: must agree on every real id.

  Returns:
    The two models unchanged if their heads already have exactly the real
    ids; else both wrapped in `PaddedVocabLM` with vocab_size the larger head
    and ids >= the tokenizer size masked (exactly zero mass in p and q).
  """
  num_real = check_same_tokenizer(target_tokenizer, draft_tokenizer)
  for name, model in (("target", target), ("draft", draft)):
    if model.vocab_size < num_real:
      raise ValueError(f"{name}.vocab_size ({model.vocab_size}) is smaller "
                       f"than its tokenizer ({num_real} ids).")
  if target.vocab_size == draft.vocab_size == num_real:
    return target, draft
  vocab = max(target.vocab_size, draft.vocab_size)
  return (PaddedVocabLM(target, vocab, num_real),
          PaddedVocabLM(draft, vocab, num_real))


def frequent_tokens(token_ids: Any, vocab_size: int, k: int, *,
                    include: Sequence[int] = ()) -> np.ndarray:
  """The `k` most frequent ids of `token_ids` (ties: lower id first), with
  `include` (e.g. EOS ids) always among them. Returns sorted int32 `[k]`.

  Negative ids (padding such as -1) are skipped. An id >= vocab_size is
  refused, not skipped: it means the ids come from another vocabulary. So
  is a `token_ids` with no id to count.
  """
  vocab_size = _checks.check_int("vocab_size", vocab_size, low=1)
  k = _checks.check_int("k", k, low=1, high=vocab_size)
  ids = np.asarray(_checks.check_array("token_ids", token_ids,
                                       kind="i")).reshape(-1)
  if (ids >= vocab_size).any():
    bad = ids[ids >= vocab_size][0]
    raise ValueError(f"token_ids holds id {bad}, outside the vocabulary's "
                     f"[0, {vocab_size}): pass ids of the model's vocabulary "
                     "(drop padding ids >= vocab_size first).")
  ids = ids[ids >= 0]
  if ids.size == 0:
    raise ValueError("token_ids holds no id >= 0: there is nothing to count. "
                     "Pass the token ids whose frequencies pick the head.")
  include = np.unique(np.asarray(_checks.check_array(
      "include", list(include), kind="i") if len(include) else [], np.int64))
  if include.size and (include.min() < 0 or include.max() >= vocab_size):
    raise ValueError(f"include must hold ids in [0, {vocab_size}), got "
                     f"{include.tolist()}.")
  if include.size > k:
    raise ValueError(f"include has {include.size} distinct ids but k is {k}: "
                     "every included id must be among the k; raise k.")
  counts_V = np.bincount(ids, minlength=vocab_size).astype(np.float64)
  counts_V[include] = np.inf
  order = np.lexsort((np.arange(vocab_size), -counts_V))
  return np.sort(order[:k]).astype(np.int32)


class ReducedVocabLM(struct.PyTreeNode):
  """A `TransformerLM` draft whose head scores only K tokens.

  Build with `ReducedVocabLM.create(draft, token_ids_K)`. Logits of the K
  ids are the draft's own; every other id gets `MASKED_LOGIT`, so q is
  exactly 0 there (exactness is unaffected: the coupling never accepts a
  token q cannot propose and the residual covers it). The head matmul is
  `[D, K]` instead of `[D, V]`.
  """
  model: TransformerLM
  head_DxK: jax.Array
  token_ids_K: jax.Array
  one_hot_q = False

  @classmethod
  def create(cls, model: TransformerLM, token_ids_K: Any) -> ReducedVocabLM:
    if not isinstance(model, TransformerLM):
      raise TypeError("model must be a TransformerLM, got "
                      f"{type(model).__name__}.")
    ids_K = np.unique(np.asarray(_checks.check_array(
        "token_ids_K", token_ids_K, kind="i")).reshape(-1))
    if ids_K.size == 0 or ids_K.min() < 0 or ids_K.max() >= model.vocab_size:
      raise ValueError(f"token_ids_K must be non-empty ids in [0, "
                       f"{model.vocab_size}).")
    module = model.module()
    if model.config.tie_embeddings:
      head_DxK = module.embed.embedding[...][ids_K].T
    else:
      head_DxK = module.lm_head.kernel[...][:, ids_K]
    return cls(model=model, head_DxK=jnp.asarray(head_DxK),
               token_ids_K=jnp.asarray(ids_K, jnp.int32))

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def max_positions(self) -> int:
    return self.model.max_positions

  def init_cache(self, batch_size: int, max_len: int):
    return self.model.init_cache(batch_size, max_len)

  def __call__(self, tokens_BxT, cache):
    logits_BxTxV, _, cache = self.forward_with_hidden(tokens_BxT, cache)
    return logits_BxTxV, cache

  def forward_with_hidden(self, tokens_BxT, cache):
    """`(logits_BxTxV, features_BxTxD, cache)`: `__call__` with the final
    norm's features its head read (`head_logits`)."""
    x_BxTxD, cache = self.model.features(tokens_BxT, cache)
    return self.head_logits(x_BxTxD), x_BxTxD, cache

  def logits_at(self, tokens_BxT, cache, at_BxQ):
    """`(logits_BxQxV, cache)`: `__call__`'s logits at the new tokens
    `at_BxQ` alone (`TransformerLM.logits_at`), through the K-token head."""
    at_BxQ = transformer.check_token_indices(at_BxQ, tokens_BxT)
    x_BxQxD, cache = self.model.features(tokens_BxT, cache, at_BxQ)
    return self.head_logits(x_BxQxD), cache

  def head_logits(self, features_BxTxD):
    """float32 `[B, T, V]`: the K-token head, every other id masked."""
    logits_BxTxK = jnp.einsum("btd,dk->btk", features_BxTxD,
                              self.head_DxK.astype(features_BxTxD.dtype))
    logits_BxTxV = jnp.full(logits_BxTxK.shape[:-1] + (self.vocab_size,),
                            MASKED_LOGIT, jnp.float32)
    return logits_BxTxV.at[..., self.token_ids_K].set(
        logits_BxTxK.astype(jnp.float32))
