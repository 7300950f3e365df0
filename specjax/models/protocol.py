"""What the decode loop needs from a model: the `CausalLM` protocol.

Targets and drafts alike (Transformers, n-gram counts, prompt lookup, imported
checkpoints) are *pytrees*: a `flax.struct.PyTreeNode` whose static fields
(config, nnx GraphDef, hyper-parameters) are hashable and whose leaves are the
parameter arrays. A model is therefore passed to `jax.jit` as an ordinary
argument; a new model of the same structure does not recompile.

Caches are pytrees too, with an int32 field `lengths[B]`: the number of
positions of each row that hold valid state. Rolling a cache back is
`cache.replace(lengths=new_lengths)`; entries at positions >= lengths are
stale, masked out, and overwritten by the next call.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax


@runtime_checkable
class CausalLM(Protocol):
  """A next-token model usable as target or draft.

  Attributes:
    vocab_size: number of tokens; target and draft must agree.
    max_positions: the longest sequence (prompt + generated + lookahead) the
      model can attend over, or None when unbounded (e.g. n-gram drafts).
    one_hot_q: True when the model's logits put all mass on one token
      (prompt lookup): the loop may then skip sampling the draft.
  """

  vocab_size: int
  max_positions: int | None
  one_hot_q: bool

  def init_cache(self, batch_size: int, max_len: int) -> Any:
    """An empty cache (all `lengths` 0) holding up to `max_len` positions."""

  def __call__(self, tokens_BxT: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
    """Scores `T >= 1` new tokens per row; pure and jit-able.

    Token t of row b sits at position `cache.lengths[b] + t` and attends to
    the row's positions `< cache.lengths[b] + t + 1`. Returns
    `(logits_BxTxV float32, cache)` with the new tokens written and
    `lengths` advanced by T. Writes past the cache's capacity are dropped.
    """


def cache_length(model: Any, buffer_len: int) -> int:
  """Positions of `model`'s cache for a generation buffer of `buffer_len`:
  the buffer, capped at the model's max_positions if it has one (no
  committed or scored position reaches past it)."""
  limit = getattr(model, "max_positions", None)
  return buffer_len if limit is None else min(buffer_len, limit)


def supports_trees(model: Any) -> bool:
  """Whether `model` can run draft trees (`verifier="tree:..."`).

  A tree model also has `tree_decode(tokens_BxL, cache, depth_T,
  ancestor_TxT, nodes=None) -> (logits_BxLxV, cache)` (see
  `TransformerLM.tree_decode`: every node scored in one pass under the tree
  attention mask, positions = depth), and its cache has `move(src_BxK,
  dst_BxK)`, which copies the kept path's per-position state to the row's
  contiguous slots. `TransformerLM` (and Hugging Face imports), `NGramLM`
  (context-free: nothing to move) and `SelfDraft` (either cache mode: a
  shared cache is the target's, moved by the target) have both. A draft
  that reads the target's features (`EagleDraft`) has
  `tree_from_features` instead: each node paired with the feature it
  predicted at the node's parent (decode/tree_round.py). Drafts whose
  output is a function of a context window of their own history (prompt
  lookup) have neither.
  """
  if getattr(model, "reads_target_features", False):
    return callable(getattr(model, "tree_from_features", None))
  return callable(getattr(model, "tree_decode", None))
