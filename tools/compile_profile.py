"""Where the test suite's JAX time goes: tracing, lowering and XLA compiles,
by jitted function, summed over the suite's worker processes.

A pytest plugin and its report. Run the suite with the plugin, then the
report:

  PYTHONPATH=tools COMPILE_PROFILE_DIR=/tmp/cprof \\
      python -m pytest -q -p compile_profile
  python -m tools.compile_profile /tmp/cprof

Each worker writes one JSON file when it exits: per function name and per
test, the count and seconds of JAX's `jaxpr_trace_duration`,
`jaxpr_to_mlir_module_duration` and `backend_compile_duration` events
(`jax.monitoring`), the persistent cache's hits, and when each test started
and ended. Seconds are wall time inside the worker, so they grow with the
load the other workers put on the box; compare shares within one run.
Subprocesses (the mesh worker, notebook kernels, command-line tests) are
not counted in the JAX columns, only in their tests' wall time.

The report's second table is each test file's wall time on its worker, the
figure tests/conftest.py orders the files by (longest first), and how long
each worker ran.
"""

import atexit
import collections
import glob
import json
import os
import sys
import time

_EVENTS = {"jaxpr_trace_duration": "trace",
           "jaxpr_to_mlir_module_duration": "lower",
           "backend_compile_duration": "compile"}
_DIR = os.environ.get("COMPILE_PROFILE_DIR", "/tmp/specjax-compile-profile")
_CURRENT = ["(collection)"]  # the running test's node id
_SPANS = []  # [node id, start, end] per test, wall clock
_RECORDS_SPANS = [True]  # False in xdist's controller, which runs no test


def _cells():
  return {k: [0, 0.0] for k in _EVENTS.values()}


def pytest_configure(config):
  # An xdist worker has `workerinput`; without -n, dist is "no".
  _RECORDS_SPANS[0] = (hasattr(config, "workerinput")
                       or getattr(config.option, "dist", "no") == "no")


def pytest_runtest_logstart(nodeid, location):
  del location
  _CURRENT[0] = nodeid
  if _RECORDS_SPANS[0]:
    _SPANS.append([nodeid, time.time(), time.time()])


def pytest_runtest_logfinish(nodeid, location):
  del location
  if _SPANS and _SPANS[-1][0] == nodeid:
    _SPANS[-1][2] = time.time()


def _install():
  """Registers the listeners and the exit hook (plugin import time)."""
  import jax  # pylint: disable=g-import-not-at-top
  totals = collections.defaultdict(_cells)
  by_test = collections.defaultdict(lambda: collections.defaultdict(_cells))
  hits = [0]

  def on_duration(event, seconds, fun_name="?", **kwargs):
    del kwargs
    kind = _EVENTS.get(event.rsplit("/", 1)[-1])
    if kind is not None:
      for cell in (totals[fun_name][kind],
                   by_test[_CURRENT[0]][fun_name][kind]):
        cell[0] += 1
        cell[1] += seconds

  def on_event(event, **kwargs):
    del kwargs
    if event.endswith("/cache_hits"):
      hits[0] += 1

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  jax.monitoring.register_event_listener(on_event)

  def dump():
    os.makedirs(_DIR, exist_ok=True)
    name = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    with open(os.path.join(_DIR, name + ".json"), "w") as fh:
      json.dump({"functions": totals, "by_test": by_test, "spans": _SPANS,
                 "cache_hits": hits[0]}, fh)

  atexit.register(dump)


def _seconds(kinds):
  return sum(seconds for _, seconds in kinds.values())


def report(directory, top=25):
  """Prints the totals, the `top` functions by their summed seconds, and
  each test file's wall time with its worker and its JAX seconds."""
  functions = collections.defaultdict(_cells)
  file_jax = collections.Counter()
  file_wall, file_worker, workers = {}, {}, {}
  hits = 0
  paths = glob.glob(os.path.join(directory, "*.json"))
  if not paths:
    raise SystemExit(f"no profiles in {directory!r}: run the suite with "
                     "-p compile_profile first (see the docstring)")
  for path in paths:
    with open(path) as fh:
      data = json.load(fh)
    hits += data["cache_hits"]
    for name, kinds in data["functions"].items():
      for kind, (n, seconds) in kinds.items():
        functions[name][kind][0] += n
        functions[name][kind][1] += seconds
    for nodeid, funs in data["by_test"].items():
      file_jax[nodeid.split("::")[0]] += sum(map(_seconds, funs.values()))
    spans = data["spans"]
    if spans:
      worker = os.path.basename(path).split("-")[0]
      workers[worker] = (min(s for _, s, _ in spans),
                         max(e for _, _, e in spans))
      for nodeid, start, end in spans:
        name = nodeid.split("::")[0]
        file_wall[name] = file_wall.get(name, 0.0) + end - start
        file_worker[name] = worker
  total = {k: sum(f[k][1] for f in functions.values()) for k in
           _EVENTS.values()}
  count = {k: sum(f[k][0] for f in functions.values()) for k in
           _EVENTS.values()}
  print(f"{len(paths)} processes; persistent-cache hits {hits}")
  for kind in _EVENTS.values():
    print(f"  {kind:8s} {count[kind]:6d} calls {total[kind]:8.1f} s")
  print(f"\nTop {top} functions by trace + lower + compile seconds "
        "(count / seconds each):")
  ranked = sorted(functions.items(), key=lambda kv: -_seconds(kv[1]))
  for name, kinds in ranked[:top]:
    cells = "  ".join(f"{kind} {kinds[kind][0]:5d} / {kinds[kind][1]:6.1f}"
                      for kind in _EVENTS.values())
    share = _seconds(kinds) / max(sum(total.values()), 1e-9)
    print(f"  {share:6.1%}  {cells}  {name}")
  if not workers:
    return
  origin = min(start for start, _ in workers.values())
  print("\nWorkers (seconds from the first test's start):")
  for worker, (start, end) in sorted(workers.items()):
    print(f"  {worker:6s} {start - origin:6.0f} -> {end - origin:6.0f}")
  print("\nTest files by wall time on their worker (JAX seconds inside):")
  for name, wall in sorted(file_wall.items(), key=lambda kv: -kv[1]):
    print(f"  {wall:7.0f} s  {file_jax[name]:7.0f} s  "
          f"{file_worker[name]:6s} {name}")


if __name__ == "__main__":
  report(sys.argv[1] if len(sys.argv) > 1 else _DIR)
else:
  _install()
