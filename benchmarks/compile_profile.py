"""Where the test suite's JAX time goes: tracing, lowering and XLA compiles,
by jitted function, summed over the suite's worker processes.

A pytest plugin and its report. Run the suite with the plugin, then the
report:

  PYTHONPATH=benchmarks COMPILE_PROFILE_DIR=/tmp/cprof \\
      python -m pytest -q -p compile_profile
  python benchmarks/compile_profile.py /tmp/cprof

Each worker writes one JSON file when it exits: per function name, the
count and seconds of JAX's `jaxpr_trace_duration`,
`jaxpr_to_mlir_module_duration` and `backend_compile_duration` events
(`jax.monitoring`), and the persistent cache's hits. Seconds are wall time
inside the worker, so they grow with the load the other workers put on the
box; compare shares within one run. Subprocesses (the mesh worker, notebook
kernels, command-line tests) are not counted.
"""

import atexit
import collections
import glob
import json
import os
import sys

_EVENTS = {"jaxpr_trace_duration": "trace",
           "jaxpr_to_mlir_module_duration": "lower",
           "backend_compile_duration": "compile"}
_DIR = os.environ.get("COMPILE_PROFILE_DIR", "/tmp/specjax-compile-profile")


def _install():
  """Registers the listeners and the exit hook (plugin import time)."""
  import jax  # pylint: disable=g-import-not-at-top
  totals = collections.defaultdict(lambda: {k: [0, 0.0] for k in
                                            _EVENTS.values()})
  hits = [0]

  def on_duration(event, seconds, fun_name="?", **kwargs):
    del kwargs
    kind = _EVENTS.get(event.rsplit("/", 1)[-1])
    if kind is not None:
      totals[fun_name][kind][0] += 1
      totals[fun_name][kind][1] += seconds

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
      json.dump({"functions": totals, "cache_hits": hits[0]}, fh)

  atexit.register(dump)


def report(directory, top=25):
  """Prints the totals and the `top` functions by their summed seconds."""
  functions = collections.defaultdict(lambda: {k: [0, 0.0] for k in
                                               _EVENTS.values()})
  hits = 0
  files = glob.glob(os.path.join(directory, "*.json"))
  if not files:
    raise SystemExit(f"no profiles in {directory!r}: run the suite with "
                     "-p compile_profile first (see the docstring)")
  for path in files:
    with open(path) as fh:
      data = json.load(fh)
    hits += data["cache_hits"]
    for name, kinds in data["functions"].items():
      for kind, (n, seconds) in kinds.items():
        functions[name][kind][0] += n
        functions[name][kind][1] += seconds
  total = {k: sum(f[k][1] for f in functions.values()) for k in
           _EVENTS.values()}
  count = {k: sum(f[k][0] for f in functions.values()) for k in
           _EVENTS.values()}
  print(f"{len(files)} processes; persistent-cache hits {hits}")
  for kind in _EVENTS.values():
    print(f"  {kind:8s} {count[kind]:6d} calls {total[kind]:8.1f} s")
  print(f"\nTop {top} functions by trace + lower + compile seconds "
        "(count / seconds each):")
  ranked = sorted(functions.items(),
                  key=lambda kv: -sum(s for _, s in kv[1].values()))
  for name, kinds in ranked[:top]:
    cells = "  ".join(f"{kind} {kinds[kind][0]:5d} / {kinds[kind][1]:6.1f}"
                      for kind in _EVENTS.values())
    share = sum(s for _, s in kinds.values()) / max(sum(total.values()), 1e-9)
    print(f"  {share:6.1%}  {cells}  {name}")


if __name__ == "__main__":
  report(sys.argv[1] if len(sys.argv) > 1 else _DIR)
else:
  _install()
