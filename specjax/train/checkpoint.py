"""Orbax checkpoints of training runs: validated metadata and checksums.

Layout (one orbax `CheckpointManager` directory, usually
`<workdir>/checkpoints`):

  <step>/params      the model's nnx State         (`ocp.args.StandardSave`)
  <step>/opt_state   the optax state (holds the update count the learning
                     rate schedule reads)          (`ocp.args.StandardSave`)
  <step>/metadata    JSON (`ocp.args.JsonSave`): format tag, step, the model
                     config, the train config, the corpus fingerprint, a
                     sha256 of each array item, library versions, any
                     `extra` the caller adds (e.g. a distillation teacher),
                     and the type and sha256 of the loss's `aux` (e.g. the
                     teacher itself), which a resume must match.

Guarantees:
* Restore is bitwise: every array comes back with the dtype, shape and bytes
  it was saved with. Orbax itself does not checksum array data (a flipped bit
  in a data file restores silently as a wrong value), so `save` records a
  sha256 of each item and `restore` recomputes and compares it.
* Restore first reads the metadata and compares the stored model config with
  the requested one, so a checkpoint of another model is refused with the
  differing fields named, before any array is read.
* Every failure (missing directory, missing item, unreadable JSON, orbax or
  tensorstore read error, checksum mismatch) raises `CheckpointError` (or
  `FileNotFoundError` when there is no checkpoint at all) naming the
  directory or file and the fix.

Checksums need the arrays on the host; they are computed when the process
sees all of every array (single-process runs, including one-host data
parallelism) and skipped (recorded as null) in multi-process runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from typing import Any

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from specjax import _checks
from specjax.models import transformer as transformer_lib

FORMAT = "specjax.train/1"
ARRAY_ITEMS = ("params", "opt_state")
ITEMS = ARRAY_ITEMS + ("metadata",)
CHECKPOINTS_SUBDIR = "checkpoints"
# TransformerConfig fields that checkpoints written before them lack.
_LATER_FIELDS = ("param_dtype", "qkv_bias", "rope_scaling")


class CheckpointError(ValueError):
  """A checkpoint exists but cannot be used; the message names file and fix."""


def tree_checksum(tree: Any) -> str | None:
  """sha256 (hex) over the dtype, shape and bytes of every leaf, in tree order.

  Returns None when some leaf is not fully addressable by this process
  (multi-process runs), where the host cannot see the whole array.
  """
  leaves = jax.tree.leaves(tree)
  if any(isinstance(x, jax.Array) and not x.is_fully_addressable
         for x in leaves):
    return None
  hasher = hashlib.sha256()
  for x in leaves:
    x = np.ascontiguousarray(np.asarray(jax.device_get(x)))
    hasher.update(f"{x.dtype.str}{x.shape};".encode())
    hasher.update(x.tobytes())
  return hasher.hexdigest()


def aux_checksum(aux: Any) -> str | None:
  """`tree_checksum` of a pytree of arrays and numbers (e.g. a teacher
  model); None when some leaf is neither (its bytes would not identify it)
  or the process cannot see every array."""
  if not all(isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int,
                            float, complex))
             for x in jax.tree.leaves(aux)):
    return None
  return tree_checksum(aux)


def model_config_dict(config: Any) -> dict:
  """JSON-ready dict of a model's dataclass config (a `TransformerConfig`, all
  derived fields resolved, or e.g. an `ExitAdapterConfig`)."""
  return dataclasses.asdict(config)


def make_metadata(*, model_config: transformer_lib.TransformerConfig,
                  train_config: Any = None, corpus: dict | None = None,
                  extra: dict | None = None, aux: Any = None) -> dict:
  """The JSON metadata stored with every checkpoint (`save` adds step/sums).

  Args:
    model_config: the trained model's config; restore validates against it.
    train_config: the run's ConfigDict (stored for the record).
    corpus: `Corpus.fingerprint()` of the training corpus.
    extra: any JSON-serialisable dict (e.g. the teacher of a distilled draft).
    aux: the training loss's frozen input (e.g. the teacher), or None;
      recorded as its type and `aux_checksum`, so a resume can tell it.
  """
  if train_config is not None and hasattr(train_config, "to_json_best_effort"):
    train_config = json.loads(train_config.to_json_best_effort())
  return {
      "format": FORMAT,
      "model_config": model_config_dict(model_config),
      "train_config": train_config,
      "corpus": corpus,
      "extra": extra or {},
      "aux": None if aux is None else {"type": type(aux).__name__,
                                       "sha256": aux_checksum(aux)},
      "versions": {"jax": jax.__version__, "flax": flax.__version__,
                   "orbax": getattr(ocp, "__version__", "unknown")},
  }


def config_diff(stored: dict, requested: dict) -> list[str]:
  """Human-readable `field: stored vs requested` lines (empty when equal)."""
  lines = []
  for key in sorted(set(stored) | set(requested)):
    a, b = stored.get(key, "<absent>"), requested.get(key, "<absent>")
    if a != b:
      lines.append(f"{key}: {a!r} in the checkpoint vs {b!r} requested")
  return lines


def checkpoints_dir(path: str) -> str:
  """`path/checkpoints` if `path` is a training workdir, else `path` itself."""
  sub = os.path.join(path, CHECKPOINTS_SUBDIR)
  return sub if os.path.isdir(sub) else path


class Checkpointer:
  """A thin, validating wrapper around one `ocp.CheckpointManager` directory.

  Usage:
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=3,
                        create=True)
    ckpt.save(step, state, metadata)        # state: params, opt_state, step
    state, meta = ckpt.restore(template, model_config=config)
    ckpt.close()
  """

  def __init__(self, directory: str, *, max_to_keep: int | None = None,
               create: bool = False):
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(
        directory):
      raise TypeError("directory must be a non-empty path (str or "
                      f"os.PathLike), got {directory!r}.")
    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory) and not os.path.isdir(directory):
      raise NotADirectoryError(
          f"Checkpoint directory {directory!r} is a file. Pass the --workdir "
          "of a training run (or its checkpoints/ subdirectory), or a new "
          "path to create.")
    if not create and not os.path.isdir(directory):
      raise FileNotFoundError(
          f"Checkpoint directory {directory!r} does not exist. Pass the "
          "--workdir of a training run (or its checkpoints/ subdirectory), or "
          "train one first with `python -m experiments.train`.")
    if create and not _checks.dir_or_creatable(directory):
      raise NotADirectoryError(
          f"Cannot create the checkpoint directory {directory!r}: a parent of "
          "it is a file or not writable. Pass another path.")
    if max_to_keep is not None:
      # 0 would make orbax delete every checkpoint it writes.
      max_to_keep = _checks.check_int("max_to_keep", max_to_keep, low=1)
    self.directory = directory
    self._manager = ocp.CheckpointManager(
        directory, item_names=ITEMS,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                             create=create))

  # -- listing ---------------------------------------------------------------

  def steps(self) -> list[int]:
    """Steps of the complete checkpoints, ascending."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  # -- saving ----------------------------------------------------------------

  def save(self, step: int, state: dict, metadata: dict) -> None:
    """Saves `state['params']` and `state['opt_state']` plus JSON metadata.

    Returns once the arrays are copied off the devices (the files are
    written in the background; `wait()` or `close()` blocks until they are
    on disk). `metadata` comes from `make_metadata` (a JSON-serialisable
    dict); the step and the item checksums are added here.

    Checkpoints only move forward: `step` must be an int >= 0 above every
    step already saved here (raises ValueError otherwise; orbax would
    silently drop the save). A resumed run saves only steps past the one it
    restored; to redo a step, delete its directory first.
    """
    step = _checks.check_int("step", step, low=0)
    if not isinstance(state, dict) or any(k not in state
                                          for k in ARRAY_ITEMS):
      raise TypeError(f"state must be a dict holding {list(ARRAY_ITEMS)} (a "
                      "train state from trainer.init_state), got "
                      f"{type(state).__name__}"
                      + (f" with keys {sorted(state)}"
                         if isinstance(state, dict) else "") + ".")
    empty = [k for k in ARRAY_ITEMS if not jax.tree.leaves(state[k])]
    if empty:  # orbax refuses an empty item deep inside its save
      raise ValueError(f"state[{empty[0]!r}] holds no arrays; orbax cannot "
                       "save an empty item. Save a train state from "
                       "trainer.init_state.")
    if not isinstance(metadata, dict):
      raise TypeError("metadata must be a dict (from make_metadata), got "
                      f"{type(metadata).__name__}.")
    try:  # here, not in orbax's writer thread, where it would only be logged
      json.dumps(metadata)
    except (TypeError, ValueError) as e:
      raise TypeError(f"metadata must be JSON-serialisable (plain dicts, "
                      f"lists, str, numbers, bools, None): {e}. Convert "
                      "arrays with .tolist().") from e
    # A save in flight is not on disk yet; orbax's save waits for it anyway.
    self._manager.wait_until_finished()
    latest = self.latest_step()
    if latest is not None and step <= latest:
      raise ValueError(
          f"Cannot save step {step} in {self.directory!r}: it already holds "
          f"step {latest}, and checkpoints only move forward (orbax would "
          f"drop this save). Fix: save a step > {latest}, delete "
          f"{self.step_dir(latest)!r} (and any later step) first, or use a "
          "fresh --workdir.")
    metadata = dict(metadata, step=step,
                    saved_at=datetime.datetime.now(
                        datetime.timezone.utc).isoformat(timespec="seconds"),
                    checksums={k: tree_checksum(state[k]) for k in ARRAY_ITEMS})
    saved = self._manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(state["params"]),
        opt_state=ocp.args.StandardSave(state["opt_state"]),
        metadata=ocp.args.JsonSave(metadata)))
    if not saved:  # orbax declines silently; never lose a save unnoticed
      raise CheckpointError(
          f"orbax declined to save step {step} in {self.directory!r} (steps "
          f"there: {self.steps()}). Save a later step or use a fresh "
          "--workdir.")

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # -- restoring -------------------------------------------------------------

  def _resolve_step(self, step: int | None) -> int:
    if step is not None:  # a float or bool would match a step by equality
      step = _checks.check_int("step", step, low=0)
    steps = self.steps()
    if step is None:
      if not steps:
        raise FileNotFoundError(
            f"No checkpoint in {self.directory!r} (no complete <step>/ "
            "subdirectory). Point to the --workdir of a run that saved one, "
            "or train first.")
      return steps[-1]
    if step not in steps:
      raise FileNotFoundError(
          f"No checkpoint for step {step} in {self.directory!r}; available "
          f"steps: {steps}. Pass one of those, or None for the latest.")
    return step

  def _missing(self, step: int, item: str) -> CheckpointError:
    path = os.path.join(self.step_dir(step), item)
    return CheckpointError(
        f"Checkpoint {self.step_dir(step)!r} is incomplete: {path!r} is "
        f"missing. {self._fix(step)}")

  def _fix(self, step: int) -> str:
    others = [s for s in self.steps() if s != step]
    earlier = (f"resume from an earlier checkpoint (steps {others}) by "
               if others else "")
    return (f"Fix: {earlier}deleting {self.step_dir(step)!r}, or start a "
            "fresh --workdir.")

  def read_metadata(self, step: int | None = None) -> dict:
    """The JSON metadata of `step` (latest when None), format-checked."""
    step = self._resolve_step(step)
    item_dir = os.path.join(self.step_dir(step), "metadata")
    if not os.path.isdir(item_dir):
      raise self._missing(step, "metadata")
    try:
      metadata = self._manager.restore(step, args=ocp.args.Composite(
          metadata=ocp.args.JsonRestore())).metadata
    except Exception as e:  # orbax raises many types; all mean "unreadable"
      raise CheckpointError(
          f"Cannot read the metadata of checkpoint {self.step_dir(step)!r} "
          f"(in {item_dir!r}): {type(e).__name__}: {first_line(e)}. The "
          f"file is corrupted or was not written by specjax. "
          f"{self._fix(step)}") from e
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
      found = (metadata.get("format") if isinstance(metadata, dict)
               else metadata)
      raise CheckpointError(
          f"The metadata in {item_dir!r} is not a specjax training checkpoint "
          f"(expected format {FORMAT!r}, got {found!r}). {self._fix(step)}")
    if metadata.get("step") != step:
      raise CheckpointError(
          f"The metadata in {item_dir!r} records step {metadata.get('step')} "
          f"but sits in the directory of step {step}: the checkpoint was "
          f"moved or corrupted. {self._fix(step)}")
    return metadata

  def check_model_config(self, metadata: dict, step: int,
                         model_config: transformer_lib.TransformerConfig
                         ) -> None:
    """Raises CheckpointError naming the differing fields, if any."""
    # Fields added to TransformerConfig after a checkpoint was written take
    # their defaults (so older checkpoints still load).
    stored = {}
    if isinstance(model_config, transformer_lib.TransformerConfig):
      stored = {f.name: f.default
                for f in dataclasses.fields(transformer_lib.TransformerConfig)
                if f.name in _LATER_FIELDS}
    stored.update(metadata.get("model_config") or {})
    # Compared as stored (JSON): tuples in the config are lists on disk.
    requested = json.loads(json.dumps(model_config_dict(model_config)))
    diff = config_diff(stored, requested)
    if diff:
      raise CheckpointError(
          f"Checkpoint {self.step_dir(step)!r} holds a different model than "
          "the one requested:\n  " + "\n  ".join(diff) + "\nFix: use a fresh "
          "--workdir for the new model, or request the checkpoint's model "
          "config (e.g. --config.model.<field>=<value in the checkpoint>).")

  def restore(self, template: dict, *, step: int | None = None,
              model_config: transformer_lib.TransformerConfig | None = None
              ) -> tuple[dict, dict]:
    """Restores the array items named in `template`, validated.

    Args:
      template: a dict with `params` and optionally `opt_state` (and `step`,
        ignored): arrays or `jax.ShapeDtypeStruct`s with the target
        structure, dtypes and shardings (e.g. a freshly initialised state).
      step: the step to restore; None for the latest.
      model_config: if given, the stored model config must equal it.

    Returns:
      `(state, metadata)`: `state` has the template's array items restored
      bitwise plus `step` (int32 scalar); `metadata` is the stored JSON.
    """
    if not isinstance(template, dict) or "params" not in template:
      raise TypeError(
          "template must be a dict holding 'params' (and optionally "
          "'opt_state'): arrays or jax.ShapeDtypeStructs of the target "
          "structure, e.g. trainer.init_state(model, optimizer, mesh) or "
          "{'params': model.state}; got "
          f"{type(template).__name__}"
          + (f" with keys {sorted(template)}" if isinstance(template, dict)
             else "") + ".")
    step = self._resolve_step(step)
    metadata = self.read_metadata(step)
    if model_config is not None:
      self.check_model_config(metadata, step, model_config)
    items = [k for k in ARRAY_ITEMS if k in template]
    for item in items:
      if not os.path.isdir(os.path.join(self.step_dir(step), item)):
        raise self._missing(step, item)
    abstract = {k: jax.tree.map(ocp.utils.to_shape_dtype_struct, template[k])
                for k in items}
    state = {}
    for item in items:  # one at a time, so an error names the item
      try:
        state[item] = self._manager.restore(step, args=ocp.args.Composite(**{
            item: ocp.args.StandardRestore(abstract[item])}))[item]
      except Exception as e:  # tensorstore/orbax: unreadable or mismatched
        raise CheckpointError(
            f"Cannot restore the arrays in "
            f"{os.path.join(self.step_dir(step), item)!r}: "
            f"{type(e).__name__}: {first_line(e)}. A file under it is "
            "missing, truncated or corrupted, or it holds a different "
            f"structure than requested. {self._fix(step)}") from e
    sums = metadata.get("checksums") or {}
    for item in items:
      want = sums.get(item)
      got = tree_checksum(state[item]) if want is not None else None
      if want is not None and got is not None and got != want:
        raise CheckpointError(
            "The arrays restored from "
            f"{os.path.join(self.step_dir(step), item)!r} do not match the "
            "sha256 recorded in its metadata: the checkpoint is corrupted (a "
            f"damaged or partially copied file). {self._fix(step)}")
    state["step"] = np.int32(step)
    return state, metadata


def first_line(e: BaseException) -> str:
  """An exception's first line, cut at 400 characters (for messages that
  wrap a library's error)."""
  text = str(e).strip().splitlines()
  text = text[0] if text else ""
  return text if len(text) <= 400 else text[:400] + "..."


def abstract_model(config: transformer_lib.TransformerConfig
                   ) -> tuple[nnx.GraphDef, nnx.State]:
  """The graphdef and a ShapeDtypeStruct State of a model (no allocation)."""
  module = nnx.eval_shape(
      lambda: transformer_lib.Transformer(config, nnx.Rngs(0)))
  return nnx.split(module)


# What a training workdir can hold, and the function that loads each.
LOADERS = {"transformer": "specjax.train.load_model(workdir)",
           "eagle-head": "specjax.train.load_head(workdir, target)",
           "exit-adapter": "specjax.train.load_exit_adapter(workdir, target)"}


def stored_kind(metadata: dict) -> str:
  """What a checkpoint holds, from its metadata: "eagle-head" (recorded in
  `extra.kind`), "exit-adapter" (its model config names a `target`),
  "transformer" (any other)."""
  kind = (metadata.get("extra") or {}).get("kind")
  if kind:
    return kind
  model_config = metadata.get("model_config")
  if isinstance(model_config, dict) and "target" in model_config:
    return "exit-adapter"
  return "transformer"


def check_stored_kind(metadata: dict, kind: str, where: str) -> None:
  """Raises `CheckpointError` naming what `where` holds and its loader when
  it is not a `kind` (e.g. an EAGLE head given to `load_model`): the
  restore would fail on the arrays' structure, and say the files were
  corrupt."""
  found = stored_kind(metadata)
  if found != kind:
    raise CheckpointError(
        f"{where!r} holds {'an' if found[0] in 'aeiou' else 'a'} {found}, "
        f"not {'an' if kind[0] in 'aeiou' else 'a'} {kind}: load it with "
        f"{LOADERS.get(found, 'the loader of its kind')}.")


def load_model(directory: str, step: int | None = None, *, mesh: Any = None,
               rules: Any = None
               ) -> tuple[transformer_lib.TransformerLM, dict]:
  """A trained `TransformerLM` from a workdir (or its checkpoints/ dir).

  Reads only the parameters (not the optimizer state), verified against the
  stored checksum. With `mesh` (a `Mesh` or a spec like "data:4,model:2")
  the parameters are restored straight onto it, sharded by `rules`
  (default `specjax.sharding.RULES`), whatever mesh they were saved from;
  without, onto the default device.

  Returns:
    `(model, metadata)`; `metadata["model_config"]`, `["corpus"]` and
    `["train_config"]` describe how the model was made.
  """
  if not isinstance(directory, (str, os.PathLike)):
    raise TypeError("directory must be a training workdir or its "
                    "checkpoints/ directory (str or os.PathLike), got "
                    f"{type(directory).__name__}.")
  ckpt = Checkpointer(checkpoints_dir(os.fspath(directory)))
  try:
    metadata = ckpt.read_metadata(step)
    step = metadata["step"]
    check_stored_kind(metadata, "transformer", ckpt.step_dir(step))
    try:
      config = transformer_lib.TransformerConfig(**metadata["model_config"])
    except (TypeError, ValueError, KeyError) as e:
      raise CheckpointError(
          f"The model config stored in {ckpt.step_dir(step)!r} is not valid "
          f"for this version of specjax: {e}") from e
    graphdef, abstract = abstract_model(config)
    if mesh is not None:
      from specjax import sharding  # pylint: disable=g-import-not-at-top
      shapes = transformer_lib.TransformerLM(config=config, graphdef=graphdef,
                                             state=abstract)
      shardings = sharding.model_shardings(
          shapes, sharding.as_mesh(mesh),
          rules=sharding.RULES if rules is None else rules).state
      abstract = jax.tree.map(
          lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
          abstract, shardings)
    state, metadata = ckpt.restore({"params": abstract}, step=step)
  finally:
    ckpt.close()
  return transformer_lib.TransformerLM(config=config, graphdef=graphdef,
                                       state=state["params"]), metadata
