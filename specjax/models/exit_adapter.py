"""A trained exit adapter for `SelfDraft`: one small residual MLP after block k.

A self-draft reads the target's final norm and LM head from the output of
block k, which the head was never trained on. Kangaroo (Liu et al. 2024)
inserts a small trained *adapter* between the shallow sub-network and the
shared head; LayerSkip (Elhoushi et al. 2024) instead retrains the whole
model so that early exits work. This is a Kangaroo-style adapter, with the
target's weights frozen:

    h'_BxTxD = h_BxTxD + down(act(up(norm(h_BxTxD))))

with the target flavour's norm and MLP (LayerNorm + GELU for 'gpt2',
RMSNorm + SwiGLU for 'llama') at width `mlp_dim` (default d_model, a quarter
of a block's MLP). Kangaroo's adapter is an attention layer; this one is
position-wise on purpose: it has no keys or values, so it needs no cache and
no prefill, and a `SelfDraft(..., share_cache=True)` with an adapter still
reads and writes only the target's own first k cache layers. The cost is
the adapter's two matmuls per drafted token.

`down` starts at zero, so an untrained adapter is the identity and the draft
is exactly the training-free `SelfDraft`; training (by distillation against
the target's full-depth next-token distribution, `specjax.train.exit_adapter`)
can only start from there.

An adapter is made for one target architecture and one set of kept blocks
(`ExitAdapterConfig.target` and `.layers`); `SelfDraft` refuses it for any
other. That the weights are the very target it was trained against is the
zoo's job (its recipe key includes the target's full recipe).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from flax import struct

from specjax import _checks
from specjax.models import layer_subset
from specjax.models import transformer as transformer_lib
from specjax.models import wrapped


@dataclasses.dataclass(frozen=True)
class ExitAdapterConfig:
  """Static, hashable description of an adapter.

  Attributes:
    target: the `TransformerConfig` of the target whose exit it serves.
    layers: the kept blocks (strictly increasing indices) it follows.
    mlp_dim: hidden width F of the adapter's MLP; None means d_model.
  """
  target: transformer_lib.TransformerConfig
  layers: tuple[int, ...]
  mlp_dim: int | None = None

  def __post_init__(self):
    target = self.target
    if isinstance(target, dict):  # from a checkpoint's JSON metadata
      target = transformer_lib.TransformerConfig(**target)
    if not isinstance(target, transformer_lib.TransformerConfig):
      raise TypeError(f"ExitAdapterConfig.target must be a TransformerConfig, "
                      f"got {type(target).__name__}.")
    object.__setattr__(self, "target", target)
    if isinstance(self.layers, (str, bytes)) or not hasattr(self.layers,
                                                             "__iter__"):
      raise TypeError("ExitAdapterConfig.layers must be a sequence of block "
                      f"indices (e.g. (0,) for the first block), got "
                      f"{self.layers!r}; ExitAdapter.create(target, k) takes "
                      "an int k.")
    layers = tuple(int(_checks.check_int(
        "ExitAdapterConfig.layers[i]", i, low=0, high=target.num_layers - 1))
                   for i in self.layers)
    if list(layers) != sorted(set(layers)):
      raise ValueError(f"ExitAdapterConfig.layers must be strictly increasing "
                       f"block indices, got {layers}.")
    object.__setattr__(self, "layers", layers)
    mlp_dim = target.d_model if self.mlp_dim is None else self.mlp_dim
    object.__setattr__(self, "mlp_dim", _checks.check_int(
        "ExitAdapterConfig.mlp_dim", mlp_dim, low=1))

  @property
  def d_model(self) -> int:
    return self.target.d_model

  @property
  def max_positions(self) -> int:
    """The target's (training windows must fit it)."""
    return self.target.max_positions


class ExitAdapterModule(nnx.Module):
  """The nnx module: `__call__(h_BxTxD) -> h_BxTxD` (a residual MLP)."""

  def __init__(self, config: ExitAdapterConfig, rngs: nnx.Rngs):
    self.config = config
    mlp_config = dataclasses.replace(config.target, mlp_dim=config.mlp_dim)
    # pylint: disable-next=protected-access
    self.norm = transformer_lib._norm(mlp_config, rngs)
    self.mlp = transformer_lib.Mlp(mlp_config, rngs)
    # Zero output projection: an untrained adapter is the identity.
    down = self.mlp.down
    down.kernel[...] = jnp.zeros_like(down.kernel[...])

  def __call__(self, h_BxTxD: jax.Array) -> jax.Array:
    return h_BxTxD + self.mlp(self.norm(h_BxTxD))


class ExitAdapter(wrapped.WrapsModule, struct.PyTreeNode):
  """An `ExitAdapterModule` as a pytree: static config + graphdef, State leaves.

  The same shape as `TransformerLM` (config, graphdef, state), so the trainer
  and checkpoints handle it the same way.
  """
  config: ExitAdapterConfig = struct.field(pytree_node=False)
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  state: nnx.State

  module_type: ClassVar[type] = ExitAdapterModule

  @classmethod
  def create(cls, target: transformer_lib.TransformerLM, layers: Any, *,
             mlp_dim: int | None = None, seed: int = 0) -> ExitAdapter:
    """A fresh (identity) adapter for `SelfDraft(target, layers=layers)`."""
    if not isinstance(target, transformer_lib.TransformerLM):
      raise TypeError(f"ExitAdapter target must be a specjax TransformerLM, "
                      f"got {type(target).__name__}.")
    layers = layer_subset.normalise_layers(layers, target.config.num_layers,
                                         "ExitAdapter.create layers")
    seed = _checks.check_int("seed", seed, low=0, high=_checks.MAX_SEED)
    config = ExitAdapterConfig(target=target.config, layers=layers,
                               mlp_dim=mlp_dim)
    return cls.from_module(ExitAdapterModule(config, nnx.Rngs(seed)))

  def check_target(self, target_config: transformer_lib.TransformerConfig,
                   layers: tuple[int, ...]) -> None:
    """Raises unless made for `target_config`, following `layers`. Dtypes
    may differ: a cast target is the same model, and the adapter computes
    in its own dtype."""
    have = transformer_lib.architecture(self.config.target)
    want = transformer_lib.architecture(target_config)
    if have != want:
      diff = [f"{f.name}: {getattr(have, f.name)!r} (adapter) vs "
              f"{getattr(want, f.name)!r} (target)"
              for f in dataclasses.fields(want)
              if getattr(have, f.name) != getattr(want, f.name)]
      raise ValueError(
          "SelfDraft adapter was made for a different target: "
          + "; ".join(diff) + ". Build or train an adapter for this target "
          "(ExitAdapter.create(target, layers) / train_exit_adapter).")
    if tuple(layers) != self.config.layers:
      raise ValueError(
          f"SelfDraft adapter follows blocks {self.config.layers} but the "
          f"draft keeps {tuple(layers)}; pass layers={self.config.layers} or "
          "an adapter trained for these layers.")

  def __call__(self, h_BxTxD: jax.Array) -> jax.Array:
    """`[B, T, D]` -> `[B, T, D]` in the target's compute dtype."""
    return self.module()(h_BxTxD)
