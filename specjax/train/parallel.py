"""Data parallelism: a mesh axis `data`; batch sharded, params replicated.

The train step is a plain `jax.jit` with explicit shardings: the batch's
leading axis is split over the `data` axis and everything else (parameters,
optimizer state, keys, a distillation teacher) is replicated. XLA inserts the
gradient all-reduce. With one device every sharding is trivial and the
program is the single-device one; with N devices the global batch, and so
every loss and gradient, is the same as on one device up to float summation
order (tested with 8 fake CPU devices).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import sharding

DATA_AXIS = "data"


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh over `devices` (default: all) with the axis name `data`."""
  devices = sharding.check_devices(devices)  # distinct jax.Devices
  return Mesh(np.array(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over `data`, other axes whole."""
  return NamedSharding(mesh, P(DATA_AXIS))


def check_batch_size(name: str, batch_size: int, mesh: Mesh) -> None:
  n = mesh.shape[DATA_AXIS]
  if batch_size % n:
    raise ValueError(
        f"{name}={batch_size} is not divisible by the {n} devices of the "
        f"'{DATA_AXIS}' mesh axis; use a multiple of {n}.")


def shard_batch(batch: Any, mesh: Mesh) -> Any:
  """Places a host batch (pytree of `[B, ...]` arrays) split over `data`."""
  return jax.device_put(batch, batch_sharded(mesh))


def replicate(tree: Any, mesh: Mesh) -> Any:
  return jax.device_put(tree, replicated(mesh))
