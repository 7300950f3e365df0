"""Entry-point flags every job shares: processes, mesh, model dtypes.

Every experiment entry point calls `define_flags()` at import and
`initialize_from_flags()` first thing in `main` (`--distributed` around
`jax.distributed.initialize`):

  --distributed                  join a multi-process job. On TPU pods and
                                 under SLURM, JAX finds the coordinator,
                                 process count and id itself (no more flags).
  --coordinator_address=H:P      elsewhere (e.g. several GPU hosts by hand):
  --num_processes=N              the address of process 0, the process count,
  --process_id=I                 and this process's id.
  --mesh=data:2,model:4          the device mesh of the job (all devices of
                                 all processes); decoding inside the entry
                                 point runs on it (`specjax.sharding`).
  --compilation_cache=DIR        JAX's persistent compilation cache, so a
                                 rerun loads its compiled programs instead
                                 of compiling them again. Default "auto":
                                 $JAX_COMPILATION_CACHE_DIR when set, else
                                 `xla/` in the model cache (`specjax.cache_dir`);
                                 "none" turns it off. Off in a process
                                 with several CPU devices.

After initialization `jax.devices()` lists every process's devices; the
same program runs in every process (SPMD). Only process 0 writes results
(`is_primary()`); orbax coordinates checkpoint writes itself.

Entry points that decode with Transformers also call `define_dtype_flags()`:

  --dtype=bfloat16               compute dtype of every Transformer model
  --param_dtype=bfloat16         storage dtype of its parameters
                                 (default for both: as built or trained;
                                 `dtypes_from_flags()` -> kwargs of
                                 `TransformerLM.astype`)
"""

from __future__ import annotations

import os
import re
import tempfile

import jax
from absl import app
from absl import flags
from absl import logging

from specjax import cache_dir

FLAGS = flags.FLAGS


def define_flags(mesh: bool = True) -> None:
  """Defines the flags above (once per process; safe to call again).

  `mesh=False` leaves `--mesh` to the entry point (a benchmark that takes
  several meshes defines it as a repeated flag).
  """
  if "distributed" in FLAGS:
    return
  flags.DEFINE_bool("distributed", False,
                    "Join a multi-process JAX job (jax.distributed.initialize)."
                    " No other flag is needed on TPU pods and under SLURM.")
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0 (only off TPU/SLURM).")
  flags.DEFINE_integer("num_processes", None,
                       "Number of processes (only off TPU/SLURM).")
  flags.DEFINE_integer("process_id", None,
                       "This process's id in [0, num_processes) (only off "
                       "TPU/SLURM).")
  define_compilation_cache_flag()
  if mesh:
    flags.DEFINE_string("mesh", None,
                        "Device mesh, e.g. 'data:2,model:4' or 'data:-1' "
                        "(default: one device per process, unsharded).")


def define_compilation_cache_flag() -> None:
  """Defines --compilation_cache alone (once per process), for entry points
  without the other shared flags; `define_flags` includes it."""
  if "compilation_cache" in FLAGS:
    return
  flags.DEFINE_string("compilation_cache", "auto",
                      "Directory of JAX's persistent compilation cache "
                      "(reruns load compiled programs): 'auto' is "
                      "$JAX_COMPILATION_CACHE_DIR, else xla/ in the model "
                      "cache ($SPECJAX_CACHE or ~/.cache/specjax); 'none' "
                      "turns it off.")


def define_dtype_flags(default: str | None = None) -> None:
  """Defines --dtype and --param_dtype (once per process).

  `default` None means "as the models were built or trained"; a benchmark
  that builds its own models passes "float32".
  """
  if "param_dtype" in FLAGS:
    return
  what = "as built or trained" if default is None else default
  flags.DEFINE_string("dtype", default, "Compute dtype of every Transformer "
                      f"model, e.g. bfloat16 (default: {what}). Logits, "
                      "probabilities and the coupling stay float32.")
  flags.DEFINE_string("param_dtype", default, "Storage dtype of every "
                      f"Transformer model's parameters (default: {what}).")
  for name in ("dtype", "param_dtype"):
    register_dtype_validator(name)


def register_dtype_validator(name: str) -> None:
  """`--<name>` must be unset or a floating dtype's name: else the error
  came as a traceback, after the models loaded."""
  def check(value):
    if value is None:
      return True
    from specjax.models import transformer  # pylint: disable=g-import-not-at-top
    try:
      transformer.float_dtype_name(f"--{name}", value)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from None
    return True
  flags.register_validator(name, check)


def dtypes_from_flags() -> dict[str, str]:
  """`{"dtype": ..., "param_dtype": ...}` of the flags that are set."""
  return {name: FLAGS[name].value for name in ("dtype", "param_dtype")
          if FLAGS[name].value is not None}


def initialize(distributed: bool, coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """`jax.distributed.initialize`, with explicit arguments only when given.

  Raises ValueError naming the flags when only some of the three explicit
  arguments are set, or when they are set without `distributed`.
  """
  explicit = {"coordinator_address": coordinator_address,
              "num_processes": num_processes, "process_id": process_id}
  given = [k for k, v in explicit.items() if v is not None]
  if not distributed:
    if given:
      raise ValueError(f"--{' --'.join(given)} only make sense with "
                       "--distributed.")
    return
  if given and len(given) != 3:
    missing = sorted(set(explicit) - set(given))
    raise ValueError(f"--distributed with --{' --'.join(given)} also needs "
                     f"--{' --'.join(missing)} (or none of them on TPU pods "
                     "and SLURM, where JAX finds them).")
  if given and (num_processes < 1 or not 0 <= process_id < num_processes):
    raise ValueError(f"--process_id={process_id} must be in [0, "
                     f"--num_processes={num_processes}).")
  # CPU devices of different processes talk through gloo (this touches only
  # the CPU client; accelerators use their own collectives).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if given:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes,
                               process_id=process_id)
  else:
    jax.distributed.initialize()
  logging.info("process %d of %d; %d local / %d global devices",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def use_compilation_cache(directory: str | None = "auto") -> str | None:
  """Keeps compiled programs in JAX's persistent cache under `directory`.

  A rerun of a job (the same programs, jax version and XLA flags) then loads
  each program from disk instead of compiling it. The programs are the same
  executables either way, so no timing changes meaning (every timed call
  runs after an untimed warm-up). Every program is kept (JAX's default keeps
  only those that took a second or more to compile).

  Stays off (returns None, with a warning) in a process set up for several
  CPU devices (`several_cpu_devices`): with jax 0.10.2, sharded decoding
  programs loaded from the cache can deadlock in XLA:CPU's collectives (a
  rendezvous timeout, half the devices at another collective), where the
  same programs freshly compiled run.

  Args:
    directory: a directory path; "auto" (the default): $JAX_COMPILATION_CACHE_DIR
      when set, else `xla/` in the model cache (`specjax.cache_dir`);
      None or "none": leave JAX's setting as it is (off unless configured).

  Returns:
    The directory in use, or None. Must run before the process compiles its
    first program (JAX reads the setting once).
  """
  if directory is None or directory == "none":
    return None
  if not isinstance(directory, (str, os.PathLike)):
    raise TypeError("--compilation_cache must be a directory path, 'auto' or "
                    f"'none', got {type(directory).__name__}.")
  if not os.fspath(directory):
    raise ValueError("--compilation_cache must be a directory, 'auto' or "
                     "'none', got ''.")
  if directory == "auto":
    directory = (os.environ.get("JAX_COMPILATION_CACHE_DIR")
                 or os.path.join(cache_dir.resolve_cache_dir(), "xla"))
  directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise ValueError(f"--compilation_cache={directory} is a file; give a "
                     "directory, 'auto' or 'none'.")
  if several_cpu_devices():
    logging.warning("specjax does not turn on JAX's persistent compilation "
                    "cache: this process has several CPU devices, and "
                    "sharded programs loaded from the cache deadlocked in "
                    "XLA:CPU's collectives (see "
                    "specjax.distributed.use_compilation_cache).")
    return None
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  return directory


def several_cpu_devices() -> bool:
  """True when this process is set up for more than one CPU device
  (`--xla_force_host_platform_device_count` in XLA_FLAGS, or
  `jax_num_cpu_devices`); read without starting a backend."""
  counts = re.findall(r"--xla_force_host_platform_device_count=(\d+)",
                      os.environ.get("XLA_FLAGS", ""))
  return ((bool(counts) and int(counts[-1]) > 1)
          or jax.config.jax_num_cpu_devices > 1)


def initialize_from_flags() -> None:
  """`initialize` from the parsed flags (call at the top of `main`), after
  turning on the persistent compilation cache (`use_compilation_cache`)."""
  use_compilation_cache(FLAGS.compilation_cache)
  initialize(FLAGS.distributed, FLAGS.coordinator_address,
             FLAGS.num_processes, FLAGS.process_id)


def mesh_from_flags():
  """The `--mesh` as a `Mesh` (None when the flag is unset); a spec the
  devices cannot hold (more devices than there are, an axis of size 0) is
  a usage error naming the flag, not a traceback."""
  from specjax import sharding  # pylint: disable=g-import-not-at-top
  if FLAGS.mesh is None:
    return None
  try:
    return sharding.make_mesh(FLAGS.mesh)
  except ValueError as e:
    raise app.UsageError(f"--mesh={FLAGS.mesh}: {e}") from None


def is_primary() -> bool:
  """True in process 0, the one that writes results and prints summaries."""
  return jax.process_index() == 0


def output_dir(results_dir: str) -> str:
  """`results_dir` in process 0; a private scratch directory elsewhere.

  Library code that writes results unconditionally (the sweep) is pointed
  here, so other processes compute alongside process 0 without racing it on
  the same files.
  """
  if is_primary():
    return results_dir
  return tempfile.mkdtemp(prefix=f"specjax-process{jax.process_index()}-")
