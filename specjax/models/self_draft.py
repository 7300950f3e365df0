"""Self-speculative drafts: the target's own shallow layers (LayerSkip, Draft&Verify).

`SelfDraft(target, layers=k)` is a `CausalLM` that runs the target's token
(and position) embeddings, its first `k` blocks, its final norm and its LM
head: no second model, no training. `layers=(0, 1, 5)` keeps an explicit set
of blocks instead, and `SelfDraft.skipping(target, skip=(3, 4))` drops a
set (Draft&Verify / SWIFT style). The draft is a pytree *view*: its leaves
are the target's own parameter arrays, so it costs no memory for weights and
sees any new weights the target is given (`draft.replace(target=new)`).

Two cache modes:

* Own cache (default): `init_cache` gives a `KVCache` with one entry per kept
  layer; the decode loop prefills and rolls it back like any draft's.
* `share_cache=True` (only for a prefix `layers=k`): the keys and values of
  blocks `0..k-1` at committed positions are *exactly* the target's, because
  those blocks see the same inputs in both models. The draft then reads and
  writes the target's cache (`reads_target_cache = True`): the loop builds
  the draft's cache as a view of the target's first k layers
  (`cache_from_target`), lets the draft write its lookahead positions there,
  and hands the layers back (`cache_to_target`). The verify pass that follows
  overwrites every one of those lookahead positions before reading them (a
  call writes its keys/values before attending), so the target's committed
  state is untouched. The draft needs no prefill and no cache of its own.
  With a skipped block below a kept one, the kept block's inputs differ from
  the target's, so sharing is refused.

`adapter=` (an `ExitAdapter`, see exit_adapter.py) inserts a small trained
residual MLP between the last kept block and the final norm. It is
position-wise (no keys or values), so both cache modes work unchanged: the
draft's cache is still exactly its kept blocks' (own, or the target's first
k layers when shared). The adapter is the draft's only own parameters.

Draft trees (`verifier="tree:..."`): `tree_decode` scores a level of tree
nodes through the kept blocks in one pass, under the tree mask, as the
target's does. With its own cache, the kept path is moved like any draft's.
With a shared cache, the nodes' keys and values go to the target's tree
slots in the first k layers, which the target's tree pass overwrites
before reading, and then moves along its kept path (decode/tree_round.py).

Exactness never depends on the draft (the verifier judges whatever q it
returns), so both modes are exact by construction; the tests check it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks
from specjax.models import transformer as transformer_lib
from specjax.models.cache import KVCache
from specjax.models.exit_adapter import ExitAdapter
from specjax.models.layer_subset import normalise_layers
from specjax.models.transformer import TransformerLM


class SelfDraft(struct.PyTreeNode):
  """A subset of `target`'s blocks, with its embeddings, final norm and head.

  Attributes:
    target: the `TransformerLM` whose weights the draft uses (shared, not
      copied: its arrays are the draft's pytree leaves).
    layers: static; an int k (normalised to `(0, ..., k-1)`) or the strictly
      increasing indices of the blocks to keep, in [0, num_layers).
    share_cache: static; read and write the target's KV cache instead of
      keeping one (requires `layers` to be a prefix `0..k-1`; see module doc).
    adapter: None (training-free), or an `ExitAdapter` made for this
      target's config and these `layers`, applied before the final norm.
  """
  target: TransformerLM
  layers: Any = struct.field(pytree_node=False, default=1)
  share_cache: bool = struct.field(pytree_node=False, default=False)
  adapter: ExitAdapter | None = None

  one_hot_q: ClassVar[bool] = False

  def __post_init__(self):
    if not isinstance(self.target, TransformerLM):
      raise TypeError(f"SelfDraft target must be a specjax TransformerLM, got "
                      f"{type(self.target).__name__}.")
    num_layers = self.target.config.num_layers
    object.__setattr__(self, "layers",
                       normalise_layers(self.layers, num_layers))
    object.__setattr__(self, "share_cache", _checks.check_bool(
        "SelfDraft share_cache", self.share_cache))
    if self.share_cache and self.layers != tuple(range(len(self.layers))):
      raise ValueError(
          f"SelfDraft share_cache=True needs the first k blocks (layers=k); "
          f"layers={self.layers} skips a block below a kept one, so the kept "
          "blocks' keys and values differ from the target's. Use "
          "share_cache=False.")
    if self.adapter is not None:
      if not isinstance(self.adapter, ExitAdapter):
        raise TypeError(f"SelfDraft adapter must be an ExitAdapter or None, "
                        f"got {type(self.adapter).__name__}.")
      self.adapter.check_target(self.target.config, self.layers)

  @classmethod
  def skipping(cls, target: TransformerLM, skip: Sequence[int],
               **kwargs) -> SelfDraft:
    """The target without the blocks in `skip` (e.g. a middle range)."""
    if not isinstance(target, TransformerLM):
      raise TypeError(f"SelfDraft target must be a specjax TransformerLM, got "
                      f"{type(target).__name__}.")
    n = target.config.num_layers
    if isinstance(skip, (str, bytes)) or not hasattr(skip, "__iter__"):
      raise TypeError(f"SelfDraft.skipping skip must be a sequence of block "
                      f"indices in [0, {n}), e.g. skip=[{n // 2}], got "
                      f"{skip!r}.")
    skip = set(normalise_layers(sorted(set(skip)), n))
    return cls(target=target, layers=tuple(i for i in range(n) if i not in skip),
               **kwargs)

  # --- CausalLM protocol -----------------------------------------------------

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def max_positions(self) -> int:
    return self.target.max_positions

  @property
  def reads_target_cache(self) -> bool:
    """Static: the loop passes the draft a view of the target's cache."""
    return self.share_cache

  @property
  def num_layers(self) -> int:
    return len(self.layers)

  def param_count(self) -> int:
    """Parameters the draft's forward pass reads (its own: the adapter's)."""
    module_state = self.target.state
    total = 0
    for path, x in jax.tree_util.tree_leaves_with_path(module_state):
      keys = [getattr(p, "key", getattr(p, "idx", None)) for p in path]
      if "blocks" in keys:
        block = keys[keys.index("blocks") + 1]
        if block not in self.layers:
          continue
      total += int(np.prod(x.shape))
    return total + (0 if self.adapter is None else self.adapter.param_count())

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    """An empty `KVCache` with one entry per kept block."""
    batch_size = _checks.check_int("batch_size", batch_size, low=1)
    max_len = _checks.check_int("max_len", max_len, low=1,
                                high=self.max_positions)
    c = self.target.config
    return KVCache.create(num_layers=len(self.layers), batch_size=batch_size,
                          max_len=max_len, num_kv_heads=c.num_kv_heads,
                          head_dim=c.head_dim, dtype=c.dtype)

  def __call__(self, tokens_BxT: jax.Array,
               cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Scores T >= 1 tokens through the kept blocks; see `TransformerLM.__call__`.

    `cache` holds one layer per kept block (from `init_cache`, or
    `cache_from_target` when sharing).
    """
    self._check_call(tokens_BxT, cache)
    return self._decode(tokens_BxT, cache)

  def logits_at(self, tokens_BxT: jax.Array, cache: KVCache, at_BxQ: jax.Array
                ) -> tuple[jax.Array, KVCache]:
    """`__call__`'s logits at the new tokens `at_BxQ` alone, and its cache
    (`TransformerLM.logits_at`): the last kept block's queries and MLP, the
    adapter, the final norm and the head run at the Q tokens alone."""
    self._check_call(tokens_BxT, cache)
    return self._decode(tokens_BxT, cache,
                        transformer_lib.check_token_indices(at_BxQ, tokens_BxT))

  def _decode(self, tokens_BxT, cache, at_BxQ=None):
    """`__call__` (`at_BxQ` None) or `logits_at` on checked inputs: the
    forward pass at the cache's next positions, and the cache advanced."""
    positions_BxT = cache.positions(tokens_BxT.shape[1])
    logits_BxQxV, cache = self._forward(tokens_BxT, positions_BxT, cache,
                                        at_BxQ=at_BxQ)
    return logits_BxQxV, cache.replace(lengths=positions_BxT[:, -1] + 1)

  def tree_decode(self, tokens_BxL: jax.Array, cache: KVCache, depth_T,
                  ancestor_TxT, nodes=None) -> tuple[jax.Array, KVCache]:
    """Scores (part of) a static draft tree through the kept blocks, in ONE
    pass; see `TransformerLM.tree_decode` for the slots, positions, mask and
    arguments. Its cache moves the kept path like the target's
    (`KVCache.move`); a shared cache is the target's own, moved by the
    target's pass."""
    self._check_call(tokens_BxL, cache)
    depth_T, ancestor_TxT, nodes = transformer_lib.check_tree_call(
        tokens_BxL, depth_T, ancestor_TxT, nodes)
    positions_BxL, tree, advance = transformer_lib.tree_layout(
        cache, depth_T, ancestor_TxT, nodes)
    logits_BxLxV, cache = self._forward(tokens_BxL, positions_BxL, cache,
                                        tree)
    return logits_BxLxV, cache.replace(lengths=cache.lengths + advance)

  def _check_call(self, tokens_BxT, cache):
    if isinstance(cache, KVCache) and cache.num_layers != len(self.layers):
      raise ValueError(
          f"cache must be a KVCache with {len(self.layers)} layers (one per "
          f"kept block: draft.init_cache(...) or "
          f"draft.cache_from_target(target_cache)), got {cache.num_layers}.")
    transformer_lib.check_call(tokens_BxT, cache, self.target.config,
                               len(self.layers))

  def logits(self, tokens_BxT: jax.Array) -> jax.Array:
    """float32 `[B, T, V]` full-sequence causal forward, no cache (training)."""
    tokens_BxT = _checks.check_array("tokens_BxT", tokens_BxT, rank=2, kind="i")
    b, t = tokens_BxT.shape
    if t > self.max_positions:
      raise ValueError(f"tokens_BxT has {t} positions; the target has "
                       f"max_positions={self.max_positions}.")
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return self._forward(tokens_BxT, positions_BxT, None)[0]

  def _forward(self, tokens_BxT, positions_BxT, cache: KVCache | None,
               tree=None, at_BxQ=None):
    """Embeddings, kept blocks (cache slot i for the i-th), adapter, head.
    `tree`: the blocks' tree argument (`transformer.tree_layout`); `at_BxQ`:
    the tokens past the last kept block's keys and values (else all)."""
    module = self.target.module()
    x_BxTxD = module.embed_inputs(tokens_BxT, positions_BxT)
    last = len(self.layers) - 1
    for slot, layer in enumerate(self.layers):
      x_BxTxD, cache = module.blocks[layer](x_BxTxD, positions_BxT, cache, slot,
                                            tree,
                                            at_BxQ if slot == last else None)
    if not self.layers and at_BxQ is not None:
      # No block to pick the tokens: the embeddings go to the head as they are.
      x_BxTxD = transformer_lib.take_tokens(x_BxTxD, at_BxQ)
    if self.adapter is not None:
      x_BxTxD = self.adapter(x_BxTxD)
    return module.head(module.final_norm(x_BxTxD)), cache

  # --- the shared-cache hook (used by the decode loop when reads_target_cache)

  def check_target(self, target: Any) -> None:
    """Raises unless `target`'s cache can be shared (same Transformer config)."""
    if not isinstance(target, TransformerLM) or target.config != self.target.config:
      raise ValueError(
          "a SelfDraft with share_cache=True must decode with the target it "
          f"was built from: its config is {self.target.config}, the target's "
          f"is {getattr(target, 'config', type(target).__name__)}.")

  def cache_from_target(self, target_cache: KVCache) -> KVCache:
    """The draft's view of the target's cache: its first k layers, same lengths."""
    k = len(self.layers)
    return KVCache(k=target_cache.k[:k], v=target_cache.v[:k],
                   lengths=target_cache.lengths, max_len=target_cache.max_len)

  def cache_to_target(self, target_cache: KVCache, cache: KVCache) -> KVCache:
    """Hands the draft-written layers back; the target's lengths are kept.

    The draft wrote only positions >= the target's committed length, which the
    next target call overwrites before it attends to them.
    """
    k = len(self.layers)
    return target_cache.replace(k=cache.k + target_cache.k[k:],
                                v=cache.v + target_cache.v[k:])
