"""The Transformer's key/value cache: static-shape arrays plus `lengths[B]`.

Layout: `k` and `v` are tuples with one array per layer, each
`[batch, kv_heads, max_len, head_dim]` (logical axis names in `AXES`), and
`lengths` is int32 `[batch]`, the number of valid positions of each row.
Rows are ragged: row b's next token goes to position `lengths[b]`.

* Writing scatters each row's new keys/values at its own positions with
  `mode='drop'`, so a write at a position >= max_len is silently dropped (the
  decode loop guarantees committed positions fit; a speculative lookahead
  that runs off the end must not crash or wrap around).
* At batch 1, XLA CPU compiles a one-token write into an update it computes
  twice (for the carried cache, and for the attention, which reads the
  layer without its size-1 batch axis) and copies each layer four times a
  step. Selecting the slot instead avoids most of the copies but runs no
  faster: the copies are cheap, so the write stays one scatter for every
  shape.
* Rolling back is `cache.replace(lengths=new_lengths)`: entries at positions
  >= lengths are stale, masked out by `attention_mask`, and overwritten by the
  next write. Nothing is zeroed.

Why not one `[layers, B, max_len, kv_heads, head_dim]` array? In decode
steps inside a jitted loop, reading one layer out of a stacked array is a
`slice`, a copy of the layer every step, and `max_len` before `kv_heads`
forces a transpose copy before the attention matmuls. Per-layer
`[B, K, S, H]` arrays need neither copy, which saves most where a step is
short: a small draft's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax import _checks

# Logical axis names of each per-layer `k[l]` / `v[l]`, for sharding rules
# (batch -> 'data', kv_heads -> 'model').
AXES = ("batch", "kv_heads", "length", "head_dim")


@struct.dataclass(kw_only=True)
class KVCache:
  """Keys and values of every layer for `batch` rows of up to `max_len` tokens.

  Attributes:
    k: tuple of `num_layers` arrays `[B, kv_heads, max_len, head_dim]`: keys
      (RoPE already applied for Llama-style models), compute dtype.
    v: same shapes and dtype as `k`: values.
    lengths: int32 `[B]`: positions `< lengths[b]` of row b are valid.
    max_len: static int, the capacity in positions.
  """
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: jax.Array
  max_len: int = struct.field(pytree_node=False)

  @classmethod
  def create(cls, *, num_layers: int, batch_size: int, max_len: int,
             num_kv_heads: int, head_dim: int,
             dtype=jnp.float32) -> KVCache:
    """An empty cache: zeros everywhere and all `lengths` 0."""
    num_layers, batch_size, max_len, num_kv_heads, head_dim = (
        _checks.check_int(f"KVCache.create {name}", value, low=low)
        for name, value, low in (
            ("num_layers", num_layers, 0), ("batch_size", batch_size, 1),
            ("max_len", max_len, 1), ("num_kv_heads", num_kv_heads, 1),
            ("head_dim", head_dim, 1)))
    shape = (batch_size, num_kv_heads, max_len, head_dim)
    zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
    return cls(k=zeros(), v=zeros(), max_len=max_len,
               lengths=jnp.zeros((batch_size,), jnp.int32))

  @property
  def num_layers(self) -> int:
    return len(self.k)

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  def positions(self, num_tokens: int) -> jax.Array:
    """int32 `[B, num_tokens]`: where the next `num_tokens` tokens of each row go."""
    return self.lengths[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)

  def write(self, layer: int, k_BxTxKxH: jax.Array, v_BxTxKxH: jax.Array,
            positions_BxT: jax.Array) -> KVCache:
    """Stores layer `layer`'s new keys/values at each row's own positions.

    Positions outside `[0, max_len)` are dropped, not clamped. `lengths` is
    not changed (the model advances it once, after all layers). Inside a
    jitted loop that carries the cache the update is in place.
    """
    # A negative index would wrap (-1 wrote the last slot): send it past
    # the end, where mode="drop" drops it.
    positions_BxT = jnp.where(positions_BxT < 0, self.max_len, positions_BxT)
    if positions_BxT.shape[1] == 1 and jax.default_backend() == "cpu":
      # XLA turns a one-slot write into a dynamic-update-slice, and XLA:CPU
      # then copies the whole layer buffer four times a call at batch 1
      # (for the attention that reads the result through a bitcast). A
      # second, dropped update keeps it a scatter, written in place.
      # Accelerators keep the dynamic-update-slice.
      positions_BxT = jnp.concatenate(
          [positions_BxT, jnp.full_like(positions_BxT, self.max_len)], axis=1)
      k_BxTxKxH, v_BxTxKxH = (jnp.concatenate([x, x], axis=1)
                              for x in (k_BxTxKxH, v_BxTxKxH))

    # One scatter per row (vmapped, so the batch is a scatter batching
    # dimension): under a mesh each device writes its own rows, where an
    # explicit batch index made XLA all-gather every row's keys and values.
    def put_row(cache_KxSxH, new_KxTxH, positions_T):
      return cache_KxSxH.at[:, positions_T].set(new_KxTxH, mode="drop")

    def put(layers, new_BxTxKxH):
      new_BxKxTxH = new_BxTxKxH.transpose(0, 2, 1, 3).astype(layers[layer].dtype)
      updated = jax.vmap(put_row)(layers[layer], new_BxKxTxH, positions_BxT)
      return layers[:layer] + (updated,) + layers[layer + 1:]

    return self.replace(k=put(self.k, k_BxTxKxH), v=put(self.v, v_BxTxKxH))

  def move(self, src_BxK: jax.Array, dst_BxK: jax.Array) -> KVCache:
    """Copies every layer's entries at slots `src_BxK` to slots `dst_BxK`.

    Used after a draft tree: the kept path's entries (scattered over the
    tree's slots) move to the row's contiguous positions. All reads happen
    before any write, so overlapping ranges are safe; a pair whose source
    or destination is outside `[0, max_len)` is dropped (else a negative
    index would wrap, and a source past the end be clamped). `lengths` is
    not changed.
    """
    if not self.k:  # no layers (a zero-block self-draft): nothing to move
      return self
    outside_BxK = ((src_BxK < 0) | (src_BxK >= self.max_len) | (dst_BxK < 0))
    dst_BxK = jnp.where(outside_BxK, self.max_len, dst_BxK)
    src_BxK = jnp.clip(src_BxK, 0, self.max_len - 1)  # read, then dropped
    batch_Bx1x1 = jnp.arange(self.batch_size, dtype=jnp.int32)[:, None, None]
    num_kv_heads = self.k[0].shape[1]
    head_1xKx1 = jnp.arange(num_kv_heads, dtype=jnp.int32)[None, :, None]
    src = (batch_Bx1x1, head_1xKx1, src_BxK[:, None, :])
    dst = (batch_Bx1x1, head_1xKx1, dst_BxK[:, None, :])
    move = lambda layers: tuple(x.at[dst].set(x[src], mode="drop")
                                for x in layers)
    return self.replace(k=move(self.k), v=move(self.v))

  def attention_mask(self, positions_BxT: jax.Array) -> jax.Array:
    """bool `[B, T, max_len]`: the query at position p sees cache slots <= p.

    Slots in `[lengths, p]` were written by the current call before
    attention, so no stale entry is ever visible. A query always sees at least
    its own slot (or, past the end, every slot), so no row is fully masked.
    """
    slots_S = jnp.arange(self.max_len, dtype=jnp.int32)
    return slots_S[None, None, :] <= positions_BxT[:, :, None]
