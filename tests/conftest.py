"""Puts the repository root on sys.path: `configs/` and `experiments/` are
top-level folders of the checkout, not part of the installed package."""

import logging
import os
import pathlib
import sys

# Compile quickly rather than well: most of the suite's time is XLA compiling
# small programs that then run for milliseconds, and -O0 halves that time
# (the tiny-config sweep: 90 s -> 42 s). Semantics do not change; the
# statistical tests, which run long, measured the same. Set by environment
# so the subprocesses (mesh worker, notebook kernels) inherit it; run
# `JAX_DISABLE_MOST_OPTIMIZATIONS=0 pytest` to test the optimised programs.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from hypothesis import settings  # pylint: disable=wrong-import-position

# A plugin may have imported jax before the variable was set.
jax.config.update("jax_disable_most_optimizations",
                  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] not in
                  ("0", "false", "False", ""))

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

# A deliberately damaged checkpoint leaves orbax's async reads with futures
# whose (expected) errors asyncio logs at interpreter exit, after pytest's
# summary; they say nothing the test has not already asserted.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

# CI runs the same hypothesis examples every time, so a red run is
# reproducible; locally hypothesis keeps exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
  settings.load_profile("ci")

# The longest files first: `--dist loadfile` hands files to the two workers
# in collection order, and a long file collected last (the 8-device mesh
# worker, the sweep's tiny grid) left one worker running alone for minutes.
_LONGEST_FIRST = ("test_sharding.py", "test_sweep.py", "test_exactness.py",
                  "test_self_draft.py", "test_readme.py",
                  "test_sharded_notebook.py", "test_draft_length.py",
                  "test_decode.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
