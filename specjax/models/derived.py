"""Models built from another model's weights: `from_params`, `truncate`.

The arrays are shared, not copied: a truncated draft of a loaded checkpoint
costs no memory beyond its own KV cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import _checks
from specjax.models import transformer as transformer_lib
from specjax.models.transformer import TransformerConfig
from specjax.models.transformer import TransformerLM


def from_params(config: TransformerConfig, params: dict[str, Any]
                ) -> TransformerLM:
  """A `TransformerLM` of `config` whose state is the nested dict `params`.

  `params` has the layout of `nnx.to_pure_dict(model.state)` (blocks keyed
  by int); nothing is initialised randomly (the module is built abstractly).
  """
  abstract = nnx.eval_shape(
      lambda: transformer_lib.Transformer(config, nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  want = nnx.to_pure_dict(state)

  def check(path, spec, value):
    if tuple(value.shape) != tuple(spec.shape):
      name = "/".join(str(getattr(k, "key", k)) for k in path)
      raise ValueError(f"params[{name}] has shape {tuple(value.shape)}; the "
                       f"config implies {tuple(spec.shape)}.")
    return jnp.asarray(value)

  nnx.replace_by_pure_dict(
      state, jax.tree_util.tree_map_with_path(check, want, params))
  return TransformerLM(config=config, graphdef=graphdef, state=state)


def truncate(model: TransformerLM, num_layers: int) -> TransformerLM:
  """The model's first `num_layers` blocks with its embeddings, final norm
  and head (shared arrays): a truncated draft.

  Args:
    model: a `TransformerLM`.
    num_layers: blocks to keep, in [1, model.config.num_layers].
  """
  if not isinstance(model, TransformerLM):
    raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}.")
  num_layers = _checks.check_int("num_layers", num_layers, low=1,
                                 high=model.config.num_layers)
  params = nnx.to_pure_dict(model.state)
  params["blocks"] = {i: params["blocks"][i] for i in range(num_layers)}
  config = dataclasses.replace(model.config, num_layers=num_layers)
  return from_params(config, params)
