"""A feature-level draft head (EAGLE, Li et al. 2024) over a `TransformerLM` target.

The head drafts from the target's *features* instead of from tokens alone.
Let h_j be the target's final-norm output at position j, the vector its LM
head reads to predict token j + 1 (the "pre-LM-head feature"; normalised, so
it is a well-scaled regression target). The head's input at position j is
the pair (h_{j-1}, e_j), with h_{-1} = 0 for the first token, where e_j is
the target's own input embedding of t_j at position j (`embed_inputs`: the
token embedding, plus the learned position embedding of a 'gpt2' target;
without it the head's attention, which has no RoPE in that flavour, would
be blind to order):

  fc(concat[norm(h_{j-1}), norm(e_j)])   2D -> D
  -> one pre-norm Transformer block (its own small KV cache)
  -> f_j, a prediction of h_j
  -> the target's own LM head (shared, not copied)  -> q over t_{j+1}.

The two norms (the target flavour's, learned; as in EAGLE-3) put both
halves on one scale: h is a final-norm output of RMS about 1, while an
embedding's RMS is a few hundredths, and without them the token's half of
the fc's input is drowned, which costs acceptance.

While drafting, the head's own f replaces the target's h for the next step.
Its positions are the token positions, so its cache is aligned with the
token buffer like any draft's.

`EagleHead` holds the trained parameters (fc + block), and `EagleDraft`
pairs a head with the target whose token embedding and LM head it reads
(a pytree view of the target's arrays, as `SelfDraft` is). `EagleDraft` is
a `CausalLM` (its `__call__` drafts from its own features) plus the hook the
decode loop uses for `reads_target_features` drafts: the target's verify
pass also returns its features at the scored positions, the loop keeps them
in `DecodeState.target_features`, and the next round first feeds the head
the (feature, token) pairs of the tokens the row committed
(`from_features`), then drafts. Exactness never depends on the head: the
verifier judges whatever q it returns (the tests check it with an untrained
head).

Parameter count (`EagleDraft.param_count`, `EagleHead.param_count`): the
head's own arrays (norms, fc and the block), without the shared embedding
and LM head, which the target holds anyway.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

from specjax import _checks
from specjax.models import transformer as transformer_lib
from specjax.models import wrapped
from specjax.models.cache import KVCache
from specjax.models.transformer import TransformerConfig
from specjax.models.transformer import TransformerLM
# A cast of a model (`TransformerLM.astype`) is the same model to a head.
from specjax.models.transformer import architecture


def head_config(target_config: TransformerConfig, *,
                mlp_dim: int | None = None) -> TransformerConfig:
  """The config of a head for `target_config`: one block of the target's
  flavour and width (`mlp_dim` None: the target's MLP width)."""
  if not isinstance(target_config, TransformerConfig):
    raise TypeError(f"target_config must be a TransformerConfig, got "
                    f"{type(target_config).__name__}.")
  if mlp_dim is not None:
    mlp_dim = _checks.check_int("mlp_dim", mlp_dim, low=1)
  return dataclasses.replace(target_config, num_layers=1,
                             mlp_dim=mlp_dim or target_config.mlp_dim)


def head_mismatch(config: TransformerConfig,
                  target_config: TransformerConfig) -> list[str]:
  """`field: <head's> (head) vs <wanted> (target's head)` lines where a head
  of `config` is not a head for `target_config` (`head_config` with the
  head's own MLP width); empty when it is. Dtypes may differ: a cast target
  is the same model (`architecture`)."""
  have = dataclasses.asdict(architecture(config))
  want = dataclasses.asdict(architecture(
      head_config(target_config, mlp_dim=config.mlp_dim)))
  return [f"{k}: {have[k]!r} (head) vs {want[k]!r} (this target's head)"
          for k in have if have[k] != want[k]]


def target_mismatch(recorded: TransformerConfig | None,
                    target_config: TransformerConfig) -> list[str]:
  """`field: <recorded> (head's target) vs <target's>` lines where a head's
  recorded target (`EagleHead.target_config`) is not `target_config`'s
  architecture; empty when it is, or when nothing is recorded."""
  if recorded is None:
    return []
  have = dataclasses.asdict(architecture(recorded))
  want = dataclasses.asdict(architecture(target_config))
  return [f"{k}: {have[k]!r} (the head's target) vs {want[k]!r} (this "
          "target)" for k in have if have[k] != want[k]]


class EagleHeadModule(nnx.Module):
  """Norms, fc(2D -> D), one `Block`: (feature, embedding) pairs to features."""

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    self.config = config
    self.feature_norm = transformer_lib._norm(config, rngs)
    self.embed_norm = transformer_lib._norm(config, rngs)
    self.fc = transformer_lib._linear(config, 2 * config.d_model,
                                      config.d_model, rngs)
    self.block = transformer_lib.Block(config, rngs)

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT,
               cache: KVCache | None, tree=None):
    """Predicted features `[B, T, D]`; `cache` None: full-sequence causal.
    `tree`: the block's tree argument (`transformer.tree_layout`)."""
    x_BxTxD = self.fc(jnp.concatenate(
        [self.feature_norm(features_BxTxD.astype(embeds_BxTxD.dtype)),
         self.embed_norm(embeds_BxTxD)], axis=-1))
    return self.block(x_BxTxD, positions_BxT, cache, 0, tree)


class EagleHead(wrapped.WrapsModule, struct.PyTreeNode):
  """The head's parameters: a static config + nnx GraphDef, State leaves.

  `config` is a one-layer `TransformerConfig` (see `head_config`), so the
  trainer and checkpoints handle it as they handle any Transformer's. It
  cannot tell targets of another depth or MLP width apart, so
  `target_config` records the target's whole `architecture` (None: not
  recorded, a head made from a bare config), and `EagleDraft` refuses a
  head whose recorded target is not its own.
  """
  config: TransformerConfig = struct.field(pytree_node=False)
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  state: nnx.State
  target_config: TransformerConfig | None = struct.field(pytree_node=False,
                                                         default=None)

  module_type: ClassVar[type] = EagleHeadModule

  @classmethod
  def create(cls, config: TransformerConfig,
             rngs: int | jax.Array | nnx.Rngs = 0, *,
             target_config: TransformerConfig | None = None) -> EagleHead:
    """Fresh weights for a head of `config` (from `head_config`), recording
    `target_config` (the target's config, if known) as `target_config`.
    `rngs` is a seed, one PRNG key or `nnx.Rngs`; a key array of several
    keys, or a seed jax would wrap, is refused (`transformer.as_rngs`)."""
    if not isinstance(config, TransformerConfig) or config.num_layers != 1:
      raise ValueError("EagleHead config must be a one-layer TransformerConfig "
                       "(use specjax.models.eagle.head_config(target.config)), "
                       f"got {config!r}.")
    if target_config is not None:
      diff = head_mismatch(config, target_config)
      if diff:
        raise ValueError("EagleHead config is not a head for target_config "
                         "(use head_config(target_config)):\n  "
                         + "\n  ".join(diff))
      target_config = architecture(target_config)
    rngs = transformer_lib.as_rngs(rngs)
    return cls.from_module(EagleHeadModule(config, rngs)).replace(
        target_config=target_config)


@struct.dataclass(kw_only=True)
class EagleCache(KVCache):
  """The head's `KVCache` (one layer) plus `feature`: float `[B, D]`, the
  feature the head predicted last, which its next token is paired with."""
  feature: jax.Array


def shift_features(features_BxTxD: jax.Array) -> jax.Array:
  """The head's input features: position j gets h_{j-1}, position 0 zeros."""
  return jnp.pad(features_BxTxD, ((0, 0), (1, 0), (0, 0)))[:, :-1]


class EagleDraft(struct.PyTreeNode):
  """An `EagleHead` drafting for `target` through the target's embedding and head.

  Attributes:
    target: the `TransformerLM` whose token embedding and LM head the head
      uses (shared arrays, not copies) and whose features it reads.
    head: the trained (or fresh) `EagleHead`; its width must be the target's.
  """
  target: TransformerLM
  head: EagleHead

  one_hot_q: ClassVar[bool] = False
  # Static: the decode loop feeds this draft the target's features.
  reads_target_features: ClassVar[bool] = True

  def __post_init__(self):
    if not isinstance(self.target, TransformerLM):
      raise TypeError(f"EagleDraft target must be a specjax TransformerLM, got "
                      f"{type(self.target).__name__}.")
    if not isinstance(self.head, EagleHead):
      raise TypeError(f"EagleDraft head must be an EagleHead, got "
                      f"{type(self.head).__name__}.")
    self._check_width("target", self.target.config)
    # A head's config is its target's, one block deep (`head_config`):
    # another flavour, head count or context means another target's head,
    # which would run and only cost acceptance, silently.
    diff = head_mismatch(self.head.config, self.target.config)
    # Depth and MLP width are not in a head's config: its record says.
    diff = diff or target_mismatch(self.head.target_config, self.target.config)
    if diff:
      raise ValueError(
          "The EagleDraft head was made for another target; use a head made "
          "for this target (EagleDraft.create(target) or "
          "specjax.train.eagle.train_head):\n  " + "\n  ".join(diff))

  @classmethod
  def create(cls, target: TransformerLM,
             rngs: int | jax.Array | nnx.Rngs = 0, *,
             mlp_dim: int | None = None) -> EagleDraft:
    """An untrained head for `target` (train it with `specjax.train.eagle`);
    `rngs` as for `EagleHead.create`."""
    if not isinstance(target, TransformerLM):
      raise TypeError(f"EagleDraft target must be a specjax TransformerLM, got "
                      f"{type(target).__name__}.")
    return cls(target=target, head=EagleHead.create(
        head_config(target.config, mlp_dim=mlp_dim), rngs,
        target_config=target.config))

  def _check_width(self, name: str, config: TransformerConfig) -> None:
    h = self.head.config
    if config.d_model != h.d_model or config.vocab_size != h.vocab_size:
      raise ValueError(
          f"The EagleDraft head reads features of width d_model={h.d_model} "
          f"over vocab_size={h.vocab_size}, but the {name} has "
          f"d_model={config.d_model}, vocab_size={config.vocab_size}. Use a "
          "head made for this target (EagleDraft.create(target) or "
          "specjax.train.eagle.train_head).")

  # --- CausalLM protocol -----------------------------------------------------

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def max_positions(self) -> int:
    return self.target.max_positions

  def param_count(self) -> int:
    """The head's own parameters (the shared embedding / LM head excluded)."""
    return self.head.param_count()

  def init_cache(self, batch_size: int, max_len: int) -> EagleCache:
    """An empty `EagleCache` (one KV layer; zero feature)."""
    batch_size = _checks.check_int("batch_size", batch_size, low=1)
    max_len = _checks.check_int("max_len", max_len, low=1,
                                high=self.max_positions)
    c = self.head.config
    kv = KVCache.create(num_layers=1, batch_size=batch_size, max_len=max_len,
                        num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                        dtype=c.dtype)
    return EagleCache(k=kv.k, v=kv.v, lengths=kv.lengths, max_len=max_len,
                      feature=jnp.zeros((batch_size, c.d_model), c.dtype))

  def __call__(self, tokens_BxT: jax.Array,
               cache: EagleCache) -> tuple[jax.Array, EagleCache]:
    """Scores T >= 1 tokens on the head's own features (no target).

    Token t is paired with the feature predicted for the position before it
    (`cache.feature` for t = 0), as while drafting. Returns float32 logits
    `[B, T, V]` and the cache advanced by T, holding the last prediction.
    """
    self._check_call(tokens_BxT, cache)
    logits = []
    for t in range(tokens_BxT.shape[1]):
      logits_Bx1xV, features_Bx1xD, cache = self.from_features(
          cache.feature[:, None], tokens_BxT[:, t:t + 1], cache)
      logits.append(logits_Bx1xV)
    return jnp.concatenate(logits, axis=1), cache

  def from_features(self, features_BxTxD: jax.Array, tokens_BxT: jax.Array,
                    cache: EagleCache
                    ) -> tuple[jax.Array, jax.Array, EagleCache]:
    """Scores T pairs (features[:, t], tokens[:, t]) at positions `lengths + t`.

    `features[:, t]` is the target's (or the head's) feature of the position
    before token t. Returns float32 logits `[B, T, V]` (token t's q over the
    next token), the predicted features `[B, T, D]`, and the cache with
    `lengths` advanced by T and `feature` = the last prediction.
    """
    self._check_call(tokens_BxT, cache, features_BxTxD)
    target = self.target.module()
    positions_BxT = cache.positions(tokens_BxT.shape[1])
    features_BxTxD, kv = self.head.module()(
        features_BxTxD, target.embed_inputs(tokens_BxT, positions_BxT),
        positions_BxT, cache)
    cache = kv.replace(lengths=positions_BxT[:, -1] + 1,
                       feature=features_BxTxD[:, -1].astype(kv.feature.dtype))
    return target.head(features_BxTxD), features_BxTxD, cache

  def tree_from_features(self, features_BxLxD: jax.Array,
                         tokens_BxL: jax.Array, cache: EagleCache, depth_T,
                         ancestor_TxT, nodes) -> tuple[jax.Array, jax.Array,
                                                       EagleCache]:
    """`from_features` for one level of a static draft tree, in ONE pass.

    Node `nodes[l]` goes to slot `lengths + nodes[l]` at position `lengths +
    depth_T[nodes[l]]` and attends to the committed slots and its
    ancestors' (`TransformerLM.tree_decode`'s layout); its pair is
    (`features_BxLxD[:, l]`, `tokens_BxL[:, l]`), where the feature is the
    one the head predicted at the node's parent. Returns float32 logits
    `[B, L, V]`, the predicted features `[B, L, D]`, and the cache with
    `lengths` unchanged (the tree region still starts there); the decode
    loop re-feeds committed tokens from the target's features each round,
    so the tree's slots need no move.
    """
    self._check_call(tokens_BxL, cache)
    if nodes is None:
      raise ValueError("tree_from_features scores one level: pass nodes "
                       "(the tree indices of tokens_BxL).")
    depth_T, ancestor_TxT, nodes = transformer_lib.check_tree_call(
        tokens_BxL, depth_T, ancestor_TxT, nodes)
    want = (*tokens_BxL.shape, self.head.config.d_model)
    if tuple(features_BxLxD.shape) != want:
      raise ValueError(f"features_BxLxD has shape {features_BxLxD.shape}; "
                       f"expected {want} (one parent feature per node).")
    positions_BxL, tree, _ = transformer_lib.tree_layout(
        cache, depth_T, ancestor_TxT, nodes)
    target = self.target.module()
    features_BxLxD, kv = self.head.module()(
        features_BxLxD, target.embed_inputs(tokens_BxL, positions_BxL),
        positions_BxL, cache, tree)
    cache = kv.replace(lengths=cache.lengths)
    return target.head(features_BxLxD), features_BxLxD, cache

  def _check_call(self, tokens_BxT, cache, features_BxTxD=None):
    transformer_lib.check_call(tokens_BxT, cache, self.head.config, 1,
                               EagleCache)
    if features_BxTxD is not None:
      want = (*np.shape(tokens_BxT), self.head.config.d_model)
      if tuple(np.shape(features_BxTxD)) != want:
        raise ValueError(
            f"features_BxTxD has shape {tuple(np.shape(features_BxTxD))}; "
            f"expected {want} (one feature per token, of the target's "
            "width).")

  # --- the target-feature hook (used by the decode loop) -----------------------

  def check_target(self, target: Any) -> None:
    """Raises unless `target` returns features this head reads: a
    TransformerLM of the config the draft was built for (any dtype)."""
    if not hasattr(target, "forward_with_hidden") or not hasattr(
        target, "config"):
      raise TypeError(
          "An EagleDraft drafts from the target's features, so the target "
          "must be a specjax TransformerLM (with forward_with_hidden); got "
          f"{type(target).__name__}.")
    self._check_width("target", target.config)
    # Same width is not enough: the head learned one target's features (its
    # embeddings and head are this draft's `target`'s), and another
    # architecture's features would only cost acceptance, silently.
    if architecture(target.config) != architecture(self.target.config):
      raise ValueError(
          "An EagleDraft must decode with the target it was built for (it "
          "reads that target's features, through that target's embeddings "
          f"and head): its target's config is {self.target.config}, the "
          f"target passed is {target.config}. Use EagleDraft.create(target) "
          "or train a head for this target (specjax.train.eagle.train_head).")

  def prefill(self, prompts_BxP: jax.Array, hidden_BxPxD: jax.Array,
              lengths_B: jax.Array, cache: EagleCache, window: int
              ) -> tuple[EagleCache, jax.Array]:
    """The head's state after a prompt, and its first unread-feature window.

    Feeds the prompt's pairs (h_{j-1}, t_j) (`hidden_BxPxD` from the
    target's prefill; positions past a row's prompt are overwritten later),
    then rolls the cache back to `lengths - 1`: the pair of each prompt's
    last token is re-fed at the first round, from the window
    `[B, window, D]` whose entry 0 is h_{lengths - 2} (zeros for a
    one-token prompt).
    """
    shifted_BxPxD = shift_features(hidden_BxPxD)
    _, _, cache = self.from_features(shifted_BxPxD, prompts_BxP, cache)
    last_BxD = jnp.take_along_axis(
        shifted_BxPxD, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    window_BxWxD = jnp.zeros(
        (prompts_BxP.shape[0], window, hidden_BxPxD.shape[-1]),
        hidden_BxPxD.dtype).at[:, 0].set(last_BxD)
    return cache.replace(lengths=lengths_B - 1), window_BxWxD
