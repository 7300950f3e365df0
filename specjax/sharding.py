"""Device meshes and sharding rules: the same jitted programs on 1 device or a pod.

Three ideas (the vocabulary of MaxText and jax-llm-examples, not their code):

1. A *mesh* with two axes, `data` and `model` (`make_mesh("data:2,model:4")`).
2. *Logical axis names* on every parameter and cache array, saying what each
   dimension means: batch, length, embed, vocab, heads, kv_heads, head_dim,
   mlp, layers. A model names its parameters (`TransformerLM.logical_axes()`);
   `KVCache.AXES` names the cache; the decode state is named here.
3. One *rules table* (`RULES`) mapping each logical name to a mesh axis (or
   None: replicated). `spec_for(shape, names, mesh)` turns names into a
   `PartitionSpec` under the rules; everything else (GSPMD) is XLA's.

The default rules put the batch on `data`, and attention heads, the MLP width
and the vocabulary on `model` (tensor parallelism); `FSDP_RULES` also split
the embedding width of every parameter over `data` (fully sharded data
parallelism: parameters and optimizer state shrink by the `data` size, XLA
gathers each weight before use).

Where a dimension does not divide its mesh axis (a vocabulary of 259 over 4
devices, 2 kv heads over 4 `model` devices, a batch of 3 over 2 `data`
devices), that dimension is replicated instead and one log line says so; the
program never fails inside XLA and computes the same values. Heads are
checked by head *count*, not by the fused `heads * head_dim` width, so a
head is never split across devices.

Sharding never changes what is computed, only where: a row's tokens for a
given key are the same on every mesh, up to float summation order in the
sharded matmuls (model-axis reductions are all-reduces).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from absl import logging
from jax.sharding import AbstractMesh
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import _checks

DATA = "data"
MODEL = "model"

# The mesh axes `make_mesh` builds: the only ones the rules map to. Another
# name (a typo such as "dta") would shard nothing.
MESH_AXES = (DATA, MODEL)

# Logical dimension names used across specjax.
LOGICAL_AXES = ("batch", "length", "embed", "vocab", "heads", "kv_heads",
                "head_dim", "mlp", "layers")

# Logical name -> mesh axis (None: replicated). Tensor parallel on `model`,
# data parallel on `data`.
RULES: Mapping[str, str | None] = {
    "batch": DATA,
    "length": None,
    "embed": None,
    "vocab": MODEL,
    "heads": MODEL,
    "kv_heads": MODEL,
    "head_dim": None,
    "mlp": MODEL,
    "layers": None,
}

# The same, plus every parameter's embedding width over `data` (FSDP).
FSDP_RULES: Mapping[str, str | None] = {**RULES, "embed": DATA}

# An axis whose size must be checked in units other than its array width:
# `heads` is a fused `num_heads * head_dim` dimension, split only at head
# boundaries, so the *count* must divide. Maps name -> count (per call).
Units = Mapping[str, int]


# -- meshes --------------------------------------------------------------------


def parse_mesh_spec(spec: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """`"data:2,model:4"` -> (("data", "model"), (2, 4)); a size may be -1."""
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"mesh spec must be a string like 'data:2,model:4', got "
                     f"{spec!r}.")
  names, sizes = [], []
  for part in spec.split(","):
    m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*:\s*(-?\d+)\s*", part)
    if not m:
      raise ValueError(f"mesh spec {spec!r}: {part!r} is not 'name:size' "
                       "(e.g. 'data:2,model:4'; one size may be -1 for 'the "
                       "remaining devices').")
    name, size = m.group(1), int(m.group(2))
    if name in names:
      raise ValueError(f"mesh spec {spec!r} names axis {name!r} twice.")
    if size == 0 or size < -1:
      raise ValueError(f"mesh spec {spec!r}: axis {name!r} has size {size}; "
                       "sizes are >= 1, or -1 for the remaining devices.")
    names.append(name)
    sizes.append(size)
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh spec {spec!r}: at most one size may be -1.")
  return tuple(names), tuple(sizes)


def check_devices(devices: Any) -> list:
  """`devices` as a list of distinct `jax.Device`s (None: all devices)."""
  if devices is None:
    return list(jax.devices())
  if isinstance(devices, str):
    # A string is a sequence too: 'cpu' would make a mesh of 'c', 'p', 'u'.
    raise TypeError(f"devices must be a list of jax.Device, got the string "
                    f"{devices!r}; for a platform's devices pass "
                    f"jax.devices({devices!r}).")
  if isinstance(devices, np.ndarray):
    devices = devices.ravel().tolist()  # e.g. mesh.devices, row-major
  if not isinstance(devices, Sequence):
    # A set has no mesh order.
    raise TypeError(f"devices must be a list of jax.Device (e.g. "
                    f"jax.devices()[:4]), got {type(devices).__name__}.")
  devices = list(devices)
  if not devices:
    raise ValueError("devices is empty; make_mesh needs at least one device "
                     "(pass None for all of them).")
  seen: dict = {}
  for i, device in enumerate(devices):
    if not isinstance(device, jax.Device):
      raise TypeError(f"devices[{i}] must be a jax.Device (from jax.devices())"
                      f", got {device!r} ({type(device).__name__}).")
    # The mesh would build, then device_put fails with a bare AssertionError.
    if device in seen:
      raise ValueError(f"devices[{i}] is {device}, already devices"
                       f"[{seen[device]}]; a mesh uses each device once: pass "
                       "distinct devices, e.g. jax.devices()[:n].")
    seen[device] = i
  return devices


def make_mesh(spec: str | Mapping[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `Mesh` over `devices` (default: all devices of all processes).

  Args:
    spec: `"data:2,model:4"`, a dict `{"data": 2, "model": 4}`, or None for
      `data` over every device and `model` of size 1. The product of the
      sizes must equal the device count; one size may be -1 (the rest).
      Axes `data` and `model` are always present (size 1 if not named), so
      the rules apply to any spec. A product smaller than the device count
      uses the first devices. Other axis names are refused: no rule maps to
      them (for rules of your own, build a `jax.sharding.Mesh` and pass it
      where a mesh is taken).
    devices: the devices to use, in mesh order: a non-empty list (or tuple,
      or array, read row-major) of distinct `jax.Device`s, e.g.
      `jax.devices()[:4]`. A string ('cpu'), a repeated device or a
      non-device is refused.

  Returns:
    A mesh with Auto axes (GSPMD propagates shardings; `spec_for` supplies
    them where it matters).
  """
  devices = check_devices(devices)
  if spec is None:
    spec = {DATA: -1}
  if isinstance(spec, Mapping):
    # int(2.7) would silently make a data:2 mesh.
    names, sizes = tuple(spec), tuple(
        _checks.check_int(f"mesh spec axis {n!r}", v) for n, v in spec.items())
    parse_mesh_spec(",".join(f"{n}:{s}" for n, s in zip(names, sizes)))
  else:
    names, sizes = parse_mesh_spec(spec)
  for name in names:
    if name not in MESH_AXES:
      raise ValueError(f"mesh spec {spec!r}: unknown mesh axis {name!r}; use "
                       "'data' and/or 'model' (the axes the sharding rules "
                       "map to), e.g. 'data:2,model:4'.")
  for axis in MESH_AXES:
    if axis not in names:
      names, sizes = names + (axis,), sizes + (1,)
  n = len(devices)
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if n % known:
      raise ValueError(f"mesh spec {spec!r}: the named sizes ({known} devices)"
                       f" do not divide the {n} devices.")
    sizes = tuple(n // known if s == -1 else s for s in sizes)
  if int(np.prod(sizes)) < n and -1 not in sizes:
    # A smaller mesh on the first devices (e.g. "data:1,model:1" on a host
    # with 8): what the spec asks for, said once.
    logging.info("make_mesh(%r): using %d of %d devices.", spec,
                 int(np.prod(sizes)), n)
    devices = devices[:int(np.prod(sizes))]
  elif int(np.prod(sizes)) != n:
    raise ValueError(
        f"mesh spec {spec!r} needs {int(np.prod(sizes))} devices but {n} are "
        f"available ({devices[0].platform}); make the product of the sizes "
        f"at most {n}, or use -1 for one axis.")
  try:
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names),
                         devices=devices)
  except Exception:  # pylint: disable=broad-except
    # make_mesh insists on a physical layout for some device counts; a plain
    # row-major mesh is always valid.
    return Mesh(np.asarray(devices).reshape(sizes), names,
                axis_types=(AxisType.Auto,) * len(names))


def as_mesh(mesh: Mesh | str | None) -> Mesh | None:
  """A `Mesh` from a mesh, a spec string, or None (the enclosing mesh, if any).

  The enclosing mesh is the one set by `with jax.set_mesh(mesh):`. Axes of
  any type are accepted; the returned mesh has Auto axes.
  """
  if mesh is None:
    enclosing = jax.sharding.get_mesh()
    if enclosing is None or enclosing.empty:
      return None
    mesh = enclosing
  if isinstance(mesh, str):
    return make_mesh(mesh)
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, a spec like "
                    f"'data:2,model:4', or None; got {type(mesh).__name__}.")
  try:  # as make_mesh checks its devices: a repeated one failed in jax
    check_devices(mesh.devices)
  except (TypeError, ValueError) as e:
    raise type(e)(f"mesh {mesh.shape_tuple}: {e}") from None
  if any(t != AxisType.Auto for t in mesh.axis_types):
    mesh = Mesh(mesh.devices, mesh.axis_names,
                axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  return mesh


def check_mesh_axes(mesh: Mesh | None,
                    rules: Mapping[str, str | None] = RULES) -> None:
  """Raises ValueError for a mesh axis of size > 1 that no rule maps to: its
  devices would each hold a copy of everything, silently (a Mesh built by
  hand with axes ("x", "y") sharded nothing)."""
  if mesh is None:
    return
  used = {axis for axis in (rules or {}).values() if axis is not None}
  idle = [(name, size) for name, size in mesh.shape.items()
          if size > 1 and name not in used]
  if idle:
    raise ValueError(
        f"mesh {mesh.shape_tuple}: no sharding rule maps to axis(es) "
        f"{', '.join(f'{n!r} (size {k})' for n, k in idle)}, so their "
        f"devices would hold copies. Name the axes "
        f"{' and '.join(map(repr, MESH_AXES))} (e.g. "
        "sharding.make_mesh('data:2,model:4')).")


def axis_size(mesh, axis: str | None) -> int:
  """Devices along `axis` (1 for None or an axis the mesh lacks)."""
  if axis is None:
    return 1
  return int(dict(zip(mesh.axis_names, mesh.axis_sizes)).get(axis, 1))


def describe(mesh: Mesh) -> str:
  """`"data:2,model:4"`: the spec that rebuilds this mesh's shape."""
  return ",".join(f"{n}:{s}" for n, s in zip(mesh.axis_names, mesh.axis_sizes))


# -- logical names -> specs ----------------------------------------------------

_logged: set = set()


def _note_replicated(reasons: list[str]) -> None:
  """One log line per distinct set of replicated dimensions."""
  key = tuple(sorted(set(reasons)))
  if key and key not in _logged:
    _logged.add(key)
    logging.warning("sharding: replicating %s (size does not divide the mesh "
                    "axis).", "; ".join(key))


def _check_mesh(mesh: Any) -> None:
  if not isinstance(mesh, (Mesh, AbstractMesh)):
    hint = (f"; for a spec string pass make_mesh({mesh!r})"
            if isinstance(mesh, str) else "")
    raise TypeError(f"mesh must be a jax.sharding.Mesh or AbstractMesh (e.g. "
                    f"make_mesh('data:2,model:4')), got "
                    f"{type(mesh).__name__}{hint}.")


def _check_rules(rules: Any) -> None:
  if not isinstance(rules, Mapping):
    raise TypeError(f"rules must be a mapping from logical axis names to a "
                    f"mesh axis or None (e.g. sharding.RULES or FSDP_RULES; "
                    f"{{}} replicates everything), got {type(rules).__name__}.")
  for name, axis in rules.items():
    if not isinstance(name, str) or not (axis is None or isinstance(axis, str)):
      raise TypeError(f"rules[{name!r}] = {axis!r}: rules map a logical axis "
                      "name (str) to a mesh axis name (str) or None "
                      "(replicated).")


def spec_for(shape: Sequence[int], names: Sequence[str | None], mesh, *,
             rules: Mapping[str, str | None] = RULES,
             units: Units | None = None,
             reasons: list[str] | None = None) -> P:
  """The `PartitionSpec` of an array with logical axis `names` under `rules`.

  A dimension is sharded over its rule's mesh axis when that axis exists,
  has more than one device, is not already used by an earlier dimension,
  and divides the dimension (in `units[name]` for fused axes such as
  `heads`). Otherwise it is replicated; the reason is appended to `reasons`.
  A name of None, or one of `LOGICAL_AXES` that `rules` leaves out, is
  replicated.

  Refused: a `shape` that is not a sequence of ints >= 0; `names` that is
  not a sequence of str or None, one per dimension, or that holds a name in
  neither `LOGICAL_AXES` nor `rules` (a typo such as "embd" would silently
  replicate); a `mesh` that is not a `Mesh` or `AbstractMesh` (a spec
  string goes through `make_mesh` first); `rules` that is not a mapping of
  str to str or None, or that names an axis in neither `MESH_AXES` nor the
  mesh; `units` counts that are not ints >= 1.
  """
  if isinstance(shape, str) or not isinstance(shape, (Sequence, np.ndarray)):
    raise TypeError(f"shape must be a tuple of ints (e.g. x.shape), got "
                    f"{shape!r} ({type(shape).__name__}).")
  # A float dimension or a negative one is no array's shape.
  shape = tuple(_checks.check_int(f"shape[{i}]", d, low=0)
                for i, d in enumerate(shape))
  if isinstance(names, str) or not isinstance(names, Sequence):
    raise TypeError(f"names must be a tuple of logical axis names (str or "
                    f"None), one per dimension, e.g. ('embed', 'vocab'); got "
                    f"{names!r} ({type(names).__name__}).")
  _check_mesh(mesh)
  _check_rules(rules)
  for i, name in enumerate(names):
    if name is None:
      continue
    if not isinstance(name, str):
      raise TypeError(f"names[{i}] must be a logical axis name (str) or None "
                      f"(replicated), got {name!r} ({type(name).__name__}).")
    if name not in LOGICAL_AXES and name not in rules:
      raise ValueError(f"names[{i}] = {name!r} is not a logical axis name; "
                       f"use one of {LOGICAL_AXES} (or a key of rules), or "
                       "None to replicate.")
  # A rule may name an axis this mesh lacks (RULES' "model" on a data-only
  # mesh: replicated), but not one no mesh has: a typo such as "modle"
  # replicated silently.
  for name, axis in rules.items():
    if axis is not None and axis not in MESH_AXES + tuple(mesh.axis_names):
      raise ValueError(f"rules[{name!r}] = {axis!r} is not a mesh axis: use "
                       f"one of {MESH_AXES} or of this mesh's "
                       f"{tuple(mesh.axis_names)}, or None to replicate.")
  if units is not None:
    if not isinstance(units, Mapping):
      raise TypeError(f"units must be a mapping from logical axis names to "
                      f"counts (e.g. {{'heads': 8}}) or None, got "
                      f"{type(units).__name__}.")
    for name, count in units.items():
      _checks.check_int(f"units[{name!r}]", count, low=1)
  if reasons is not None and not isinstance(reasons, list):
    raise TypeError(f"reasons must be a list (appended to) or None, got "
                    f"{type(reasons).__name__}.")
  if len(names) != len(shape):
    raise ValueError(f"logical names {tuple(names)} do not match an array of "
                     f"shape {tuple(shape)}.")
  out, used = [], set()
  for dim, name in zip(shape, names):
    axis = None if name is None else rules.get(name)
    size = axis_size(mesh, axis)
    count = (units or {}).get(name, dim)
    if axis is None or size == 1 or axis in used:
      out.append(None)
    elif count % size:
      if reasons is not None:
        reasons.append(f"{name}={count} over {axis}:{size}")
      out.append(None)
    else:
      used.add(axis)
      out.append(axis)
  while out and out[-1] is None:
    out.pop()
  return P(*out)


def tree_specs(tree: Any, names_tree: Any, mesh, *,
               rules: Mapping[str, str | None] = RULES,
               units: Units | None = None) -> Any:
  """`PartitionSpec`s for every array of `tree`, named by `names_tree`.

  `names_tree` has the structure of `tree` with a tuple of names (or None:
  replicated) at each leaf. Logs once if some dimension is replicated.
  `mesh`, `rules` and each leaf's names are checked as in `spec_for`.
  """
  # Checked here too, so an empty tree does not hide a wrong mesh or rules.
  _check_mesh(mesh)
  _check_rules(rules)
  reasons: list[str] = []
  flat, treedef = jax.tree.flatten(tree)
  try:
    flat_names = treedef.flatten_up_to(names_tree)
  except (ValueError, TypeError) as e:
    raise ValueError(f"logical names do not match the tree's structure: {e}"
                     ) from e
  specs = [P() if names is None else
           spec_for(np.shape(x), names, mesh, rules=rules, units=units,
                    reasons=reasons)
           for x, names in zip(flat, flat_names)]
  _note_replicated(reasons)
  return jax.tree.unflatten(treedef, specs)


def _batch_names(x, batch: int) -> tuple | None:
  shape = np.shape(x)
  if shape and shape[0] == batch:
    return ("batch",) + (None,) * (len(shape) - 1)
  return None


def cache_names(cache: Any, batch: int) -> Any:
  """Logical names of a model cache.

  A `KVCache` gets `KVCache.AXES` on every k/v and `("batch",)` on lengths;
  any other cache (n-gram, prompt lookup, imported models) is split on its
  leading axis where that axis is the batch, replicated elsewhere.
  """
  from specjax.models import cache as cache_lib  # pylint: disable=g-import-not-at-top
  if isinstance(cache, cache_lib.KVCache):
    # A KVCache subclass's own fields (an EagleCache's feature) go by batch.
    names = jax.tree.map(lambda x: _batch_names(x, batch), cache)
    return names.replace(k=tuple(cache_lib.AXES for _ in cache.k),
                         v=tuple(cache_lib.AXES for _ in cache.v),
                         lengths=("batch",))
  return jax.tree.map(lambda x: _batch_names(x, batch), cache)


def model_names(model: Any) -> Any:
  """Logical names of a model's parameters (`model.logical_axes()`), or
  None at every leaf (replicated) for models that do not name theirs."""
  if hasattr(model, "logical_axes"):
    return model.logical_axes()
  return jax.tree.map(lambda _: None, model)


def model_units(model: Any) -> Units:
  config = getattr(model, "config", None)
  if config is None or not hasattr(config, "num_kv_heads"):
    return {}
  return {"heads": config.num_heads, "kv_heads": config.num_kv_heads}


def model_shardings(model: Any, mesh: Mesh, *,
                    rules: Mapping[str, str | None] = RULES) -> Any:
  """`NamedSharding`s for every array leaf of a model pytree."""
  specs = tree_specs(model, model_names(model), mesh, rules=rules,
                     units=model_units(model))
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def shard_model(model: Any, mesh: Mesh | str, *,
                rules: Mapping[str, str | None] = RULES) -> Any:
  """The model with its parameters placed on `mesh` under `rules`.

  A no-op for arrays already placed so (so calling it every generation is
  cheap). Works in multi-process runs when every process holds the same
  values (e.g. the same seed or checkpoint).
  """
  # Else jax's "Argument 'x' ... is not a valid JAX type" named no argument.
  odd = sorted({type(x).__name__ for x in jax.tree.leaves(model)
                if not hasattr(x, "shape")
                and not isinstance(x, (int, float, complex, np.generic))})
  if odd:
    raise TypeError(f"model must be a model whose leaves are arrays (a "
                    f"TransformerLM, a draft), got a {type(model).__name__} "
                    f"holding {', '.join(odd)}.")
  mesh = as_mesh(mesh)
  check_mesh_axes(mesh, rules)
  return place(model, model_shardings(model, mesh, rules=rules))


def place(tree: Any, shardings: Any) -> Any:
  """`jax.device_put`, also from host values in multi-process runs.

  Arrays already with the wanted sharding are returned as they are. Host
  values (numpy, or arrays this process holds whole) go through
  `make_array_from_callback`, so each process copies only the shards its
  own devices hold; every process must pass the same values.
  """
  def put(x, sharding):
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    if (jax.process_count() == 1 or
        (isinstance(x, jax.Array) and not x.is_fully_addressable)):
      return jax.device_put(x, sharding)
    host = np.asarray(x) if not jax.dtypes.issubdtype(
        getattr(x, "dtype", np.float32), jax.dtypes.prng_key) else None
    if host is None:  # typed PRNG keys: move their raw data, re-wrap
      impl = jax.random.key_impl(x)
      data = place(jax.random.key_data(x), sharding)
      return jax.random.wrap_key_data(data, impl=impl)
    return jax.make_array_from_callback(host.shape, sharding,
                                        lambda idx: host[idx])
  return jax.tree.map(put, tree, shardings)


# -- inside a jitted program ---------------------------------------------------


def current_mesh():
  """The mesh of the enclosing `jax.set_mesh` (abstract inside jit), or None."""
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh is None or mesh.empty else mesh


def constrain(tree: Any, names_tree: Any, *,
              rules: Mapping[str, str | None] = RULES,
              units: Units | None = None) -> Any:
  """`with_sharding_constraint` by logical names; a no-op without a mesh.

  Called inside the decode loop so that arrays created inside the jit (the
  caches, the token buffer) get the rules' shardings instead of whatever
  propagation picks. Without an enclosing mesh it returns `tree` unchanged,
  so single-device programs are untouched.
  """
  mesh = current_mesh()
  if mesh is None or mesh.size == 1:
    return tree
  specs = tree_specs(tree, names_tree, mesh, rules=rules, units=units)
  return jax.tree.map(jax.lax.with_sharding_constraint, tree, specs)


def decode_state_names(state: Any) -> Any:
  """Logical names of a `DecodeState`: every per-row array on batch."""
  batch = state.lengths.shape[0]
  per_row = lambda t: jax.tree.map(lambda x: _batch_names(x, batch), t)
  return state.replace(
      tokens=("batch", "length"), lengths=("batch",),
      prompt_lengths=("batch",), done=("batch",), round=None,
      row_keys=("batch",),
      target_cache=cache_names(state.target_cache, batch),
      draft_cache=(None if state.draft_cache is None
                   else cache_names(state.draft_cache, batch)),
      stats=per_row(state.stats),
      target_features=per_row(state.target_features),
      constraint_state=per_row(state.constraint_state))


def constrain_decode_state(state: Any, units: Units | None = None) -> Any:
  """`constrain(state, decode_state_names(state))`; no-op without a mesh."""
  if current_mesh() is None:
    return state
  return constrain(state, decode_state_names(state), units=units)


@contextlib.contextmanager
def using(mesh: Mesh | str | None):
  """`jax.set_mesh(mesh)` when a mesh (or a spec like "data:2,model:4") is
  given; nothing for None."""
  if mesh is None:
    yield None
  else:
    mesh = as_mesh(mesh)  # a spec string reached jax's own type error
    with jax.set_mesh(mesh):
      yield mesh


# -- reporting -----------------------------------------------------------------


def per_device_bytes(tree: Any) -> dict[Any, int]:
  """Bytes each device holds of `tree`'s arrays (from `addressable_shards`).

  Every leaf must be a concrete `jax.Array` (e.g. `shard_model(...).state`).
  Refused: a tree with no array (None, {}), and any other leaf (a string, a
  numpy array: host values, on no device; a tracer inside jit), which would
  otherwise be left out of the count without a word.
  """
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  if not leaves:
    raise ValueError(f"tree holds no jax.Array (got {type(tree).__name__}); "
                     "pass arrays placed on devices, e.g. "
                     "shard_model(model, mesh).state.")
  for path, x in leaves:
    if not isinstance(x, jax.Array) or not _checks.is_concrete(x):
      raise TypeError(f"tree{jax.tree_util.keystr(path)} is a "
                      f"{type(x).__name__}, not a jax.Array on devices; "
                      "place it first (jax.device_put or sharding.place), "
                      "outside jit.")
  out: dict[Any, int] = {}
  for _, x in leaves:
    for shard in x.addressable_shards:
      out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
  return out


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "collective-permute")
_COLLECTIVE_RE = re.compile(r"=\s*(.+?)\s+(" + "|".join(COLLECTIVES) +
                            r")(-start)?\(")
# HLO element types: pred, bf16, s4..s64, u4..u64, f16..f64, the fp8 kinds
# (f8e4m3fn, f8e5m2, ...) and c64 / c128, each priced at its own width: a
# shape the pattern missed would count 0 bytes, and a guessed width would
# misprice it (s4 is half a byte).
_SHAPE_RE = re.compile(
    r"\b(pred|bf16|[suf]\d+(?:e\d+m\d+[a-z]*)?|c\d+)\[([\d,]*)\]")


def _shape_bytes(dtype: str, dims: str) -> int:
  bits = {"pred": 8, "bf16": 16}.get(dtype)
  if bits is None:
    bits = int(re.match(r"[sufc](\d+)", dtype).group(1))
  count = int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
  return (bits * count + 7) // 8


def collectives(hlo_text: str) -> list[dict]:
  """The collectives of a compiled program, from its HLO text.

  `hlo_text` is `jax.jit(f).lower(...).compile().as_text()` (per-device
  shapes). One entry per op (an async `-start`/`-done` pair counts once):
  `{"op": "all-gather", "shapes": ["f32[4,16]"], "bytes": 256}`, the
  per-device result shapes and their bytes (for an async start, its largest
  shape: the result; its tuple also holds the operands). A collective inside
  a loop body is listed once, not once per iteration.
  """
  out = []
  for line in hlo_text.splitlines():
    m = _COLLECTIVE_RE.search(line)
    if not m:
      continue
    shapes = _SHAPE_RE.findall(m.group(1))
    sizes = [_shape_bytes(*s) for s in shapes]
    out.append({"op": m.group(2),
                "shapes": [f"{t}[{d}]" for t, d in shapes],
                "bytes": (max(sizes, default=0) if m.group(3)
                          else sum(sizes))})
  return out


def collective_summary(hlo_text: str) -> dict[str, dict[str, int]]:
  """Per collective kind: `{"count", "bytes", "largest"}` (bytes per device,
  summed over the ops of the program; largest single op) of `collectives`."""
  summary = {op: {"count": 0, "bytes": 0, "largest": 0} for op in COLLECTIVES}
  for c in collectives(hlo_text):
    s = summary[c["op"]]
    s["count"] += 1
    s["bytes"] += c["bytes"]
    s["largest"] = max(s["largest"], c["bytes"])
  return summary


def constrain_replicated(tree: Any) -> Any:
  """Every array of `tree` replicated on the enclosing mesh (no-op without).

  Generation results are small (`[B, max_new_tokens]` tokens and per-row
  counters), so every process can read them whole.
  """
  if current_mesh() is None:
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, P()), tree)


def place_decode_inputs(mesh: Mesh | None, models: Sequence[Any],
                        per_row: Sequence[Any]) -> tuple[tuple, tuple]:
  """Models placed by their rules and per-row arrays (`[B, ...]`) on `data`.

  Without a mesh, returns the inputs unchanged (one device). The decode
  loop's jit then runs with these committed input shardings.
  """
  if mesh is None:
    return tuple(models), tuple(per_row)
  models = tuple(None if m is None else shard_model(m, mesh) for m in models)
  batch = np.shape(per_row[0])[0]
  names = [_batch_names(x, batch) for x in per_row]
  specs = tree_specs(list(per_row), names, mesh)
  return models, tuple(place(list(per_row),
                             [NamedSharding(mesh, s) for s in specs]))
