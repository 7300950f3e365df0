"""The XLA settings the test suite compiles with, set in the environment.

`tests/conftest.py` applies them before JAX starts, so the subprocesses
(mesh worker, notebook kernels) inherit them; `tools/box_speed.py`
applies them too, so it times compiles as the suite does them.
"""

import os


def apply() -> None:
  """Sets the suite's compile settings in `os.environ` where not set."""
  # Compile quickly rather than well: most of the suite's time is XLA
  # compiling small programs that then run for milliseconds, and -O0 halves
  # that time (the tiny-config sweep: 90 s -> 42 s). Semantics do not change;
  # the execution-bound statistical tests opt back in (marker `optimized`,
  # tests/conftest.py). Run `JAX_DISABLE_MOST_OPTIMIZATIONS=0 pytest` to
  # test the optimised programs.
  os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
  # XLA:CPU's fusion emitters (its default code generator) compile these
  # programs more slowly than the older loop emitters do, and the tests do
  # not need the faster code: `time python -m pytest -q` on the 2-core box,
  # 10m18s with them, 6m55s without (with two duplicated compiles also moved
  # behind -m slow). Appended to XLA_FLAGS, not replacing it.
  if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_use_fusion_emitters=false").strip()
