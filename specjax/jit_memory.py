"""Compiled programs against the kernel's limit on memory mappings.

XLA:CPU loads each compiled program's machine code into memory mappings of
its own, and JAX keeps every program in its caches for the life of the
process. Linux caps mappings per process (`vm.max_map_count`, by default
65530); past it LLVM cannot map the next program ("LLVM compilation error:
Cannot allocate memory") and the process crashes. A whole-generation
program takes on the order of a thousand mappings (fewer at -O0), so a
process that compiles a few dozen of them, e.g. a notebook sweeping drafts
x gamma x temperature, would crash without a Python error.

This module watches the count after every XLA compile (a JAX monitoring
listener, so only compiles pay for reading /proc/self/maps, whose cost
grows with the mappings):
- at half the limit it warns once, naming the cause and the two fixes
  (`jax.clear_caches()` between experiments, or a higher limit);
- at `RELIEVE_AT` of the limit it marks the caches to be cleared, which the
  next `generate` / `speculative_generate` call, or the next timer, does
  before it compiles anything (`relieve_if_needed`), with a warning:
  programs compiled before compile again when next called, which is slower
  but not a crash. (One `gamma="auto"` call runs a dozen timers and
  compiles dozens of programs.)
Clearing happens only at the start of those calls, never inside a
compilation: a clear there leaves the program being compiled to compile a
second time at its next call. Nor inside a timer: a clear between a timer's
warm-up and its timed calls would time a compile. `specjax.harness.measure`'s
and `specjax.harness.sweep`'s timers hold the clearing off (`deferred()`)
from their first warm-up to their last timed call, and check with
`compiles()` that no timed call compiled.

Without /proc (not Linux) the count is unknown and nothing is watched;
`compiles()` still counts.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import jax
import jax.monitoring

# JAX's event for a program XLA compiled or JAX loaded from its persistent
# compilation cache (jax._src.dispatch times both as one "backend compile").
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
WARN_AT = 0.5
RELIEVE_AT = 0.8
_MAPS = "/proc/self/maps"
_LIMIT_FILE = "/proc/sys/vm/max_map_count"

_lock = threading.Lock()
_state = {"compiles": 0, "compile_seconds": 0.0, "warned": False,
          "relieve": False, "reliefs": 0, "stuck": False, "deferred": 0}


def mapping_limit() -> int | None:
  """The kernel's limit on this process's memory mappings, None if unknown."""
  try:
    with open(_LIMIT_FILE, "rb") as f:
      return int(f.read())
  except (OSError, ValueError):
    return None


def mapping_count() -> int | None:
  """This process's memory mappings now, None if unknown."""
  try:
    with open(_MAPS, "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return None


def compiles() -> int:
  """Programs XLA compiled, or JAX loaded from its persistent compilation
  cache, in this process since specjax was imported."""
  return _state["compiles"]


def compile_seconds() -> float:
  """Seconds those compiles (or loads) took, as JAX times them."""
  return _state["compile_seconds"]


def _advice(count: int, limit: int) -> str:
  return (f"this process holds {count:,} memory mappings, {count / limit:.0%} "
          f"of the kernel's limit vm.max_map_count={limit:,}; XLA:CPU maps "
          "every compiled program, JAX keeps them all, and past the limit "
          "the next compile fails ('LLVM compilation error: Cannot allocate "
          "memory') and the process crashes. Call jax.clear_caches() "
          "between experiments that do not reuse their programs, or raise "
          "the limit (as root: sysctl -w vm.max_map_count=262144).")


def _on_event(event: str, duration_secs: float, **kwargs) -> None:
  """After each compile: count the mappings; warn or mark for relief."""
  del kwargs
  if event != _COMPILE_EVENT:
    return
  with _lock:
    _state["compiles"] += 1
    _state["compile_seconds"] += duration_secs
  limit = mapping_limit()
  count = mapping_count() if limit else None
  if not count:
    return
  if count >= WARN_AT * limit and not _state["warned"]:
    _state["warned"] = True
    warnings.warn("specjax: " + _advice(count, limit), RuntimeWarning,
                  stacklevel=2)
  if count >= RELIEVE_AT * limit and not _state["stuck"]:
    _state["relieve"] = True


jax.monitoring.register_event_duration_secs_listener(_on_event)


@contextlib.contextmanager
def deferred():
  """Holds off clearing the caches inside the block (a timer: module doc)."""
  with _lock:
    _state["deferred"] += 1
  try:
    yield
  finally:
    with _lock:
      _state["deferred"] -= 1


def relieve_if_needed(where: str) -> None:
  """Clears JAX's caches if the mappings neared the limit (module doc).

  Called by `where` (a public entry point) before it compiles anything;
  does nothing inside `deferred()`.
  """
  if not _state["relieve"] or _state["deferred"]:
    return
  _state["relieve"] = False
  limit = mapping_limit()
  before = mapping_count()
  jax.clear_caches()
  after = mapping_count()
  _state["reliefs"] += 1
  if limit and before and after:
    message = (f"specjax {where}: cleared JAX's compilation caches, which "
               f"held {before - after:,} of {before:,} memory mappings; "
               "programs compiled before compile again when next called. "
               + _advice(before, limit))
    if after >= RELIEVE_AT * limit:
      # The mappings are not compiled programs': clearing again would only
      # cost recompiles.
      _state["stuck"] = True
      message += (f" {after:,} mappings remain, not held by JAX's caches; "
                  "specjax will not clear them again.")
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def reliefs() -> int:
  """How many times `relieve_if_needed` cleared the caches."""
  return _state["reliefs"]
