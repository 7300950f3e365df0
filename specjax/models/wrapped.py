"""One nnx module held as a pytree: a static config and graphdef, State leaves.

`TransformerLM`, `ExitAdapter` and `EagleHead` are such pytrees (so jit
takes them as ordinary arguments, and the trainer and checkpoints handle
them alike). `WrapsModule` gives them the methods that only depend on that
shape; each names its nnx module class as `module_type`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import numpy as np
from flax import nnx


class WrapsModule:
  """Mixin for a `struct.PyTreeNode` with fields `config`, `graphdef`, `state`."""

  module_type: ClassVar[type[nnx.Module]]

  @classmethod
  def from_module(cls, module: Any):
    """Wraps the nnx module (e.g. after or inside training); shares its arrays."""
    if not isinstance(module, cls.module_type):
      raise TypeError(f"module must be a specjax {cls.module_type.__name__}, "
                      f"got {type(module).__name__}.")
    graphdef, state = nnx.split(module)
    return cls(config=module.config, graphdef=graphdef, state=state)

  def module(self):
    """The nnx module with these weights (for training: `nnx.split` it)."""
    return nnx.merge(self.graphdef, self.state)

  def param_count(self) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.state))
