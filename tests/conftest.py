"""Puts the repository root on sys.path: `configs/` and `experiments/` are
top-level folders of the checkout, not part of the installed package."""

import gc
import logging
import os
import pathlib
import shutil
import tempfile
import sys

import compile_settings  # tests/, beside this file

# The suite's XLA settings (-O0, loop emitters), set by environment so the
# subprocesses (mesh worker, notebook kernels) inherit them.
compile_settings.apply()
# One compilation cache for this run, shared by the two workers and every
# subprocess (set before the workers start, so they inherit it): a program
# that several files compile is compiled once.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
      prefix="specjax-test-xla-")
  _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]
else:
  _OWN_CACHE = None
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=wrong-import-position
from hypothesis import settings  # pylint: disable=wrong-import-position

# A plugin may have imported jax before the variables were set.
jax.config.update("jax_disable_most_optimizations",
                  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] not in
                  ("0", "false", "False", ""))
jax.config.update("jax_compilation_cache_dir",
                  os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(autouse=True)
def _optimized_for_marked_tests(request):
  """-O0 halves compiles but slows execution: the statistical tests, which run
  one program on 10^4-10^5 rows, are faster fully optimised (measured on the
  self-draft control at 20,000 rows: 2.5 s + 2.0 s per run at -O0, 3.1 s +
  1.2 s at -O2). The flag is read when a program compiles, so only programs
  first compiled inside a marked test change."""
  if request.node.get_closest_marker("optimized") is None:
    yield
    return
  before = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True)
def _prompt_buckets_for_big_batches(request, monkeypatch):
  """The loop pads prompts to at least `loop.MIN_PROMPT_BUCKET` (16)
  positions, so short prompts of any length share one program; on the
  statistical tests' 10^4-10^5 rows of 3-6-token prompts, that padding was
  most of the run (`python benchmarks/prompt_bucket.py`: 7.1 s at width 16,
  3.4 s at width 4). Marked tests pad to the next power of two: 3-token
  prompts to 4, ragged batches to their longest prompt's bucket, so padded
  positions stay in every such program. (The dotted target imports the loop
  only in a marked test, not in the xdist controller.)"""
  if request.node.get_closest_marker("big_batch") is not None:
    monkeypatch.setattr("specjax.decode.loop.MIN_PROMPT_BUCKET", 1)


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

# The longest files first: `--dist loadfile` hands files to the workers in
# collection order, and a long file collected last (the 8-device mesh
# worker, the sweep's tiny grid) left one worker running alone for minutes.
# (Ordering every file by its measured duration did no better: 582 s
# against 564 s from a fresh clone, within this box's noise.)
_LONGEST_FIRST = ("test_sharding.py", "test_sweep.py", "test_exactness.py",
                  "test_self_draft.py", "test_sharded_notebook.py",
                  "test_draft_length.py", "test_decode.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session):
  """Fewer cyclic-GC passes. Tracing and lowering allocate many short-lived
  objects, and Python's default thresholds (700, 10, 10) kept running
  collections through them, each also walking the modules the tests
  imported: frozen here, after collection. `SPECJAX_TEST_GC=default` keeps
  the defaults, to measure the difference: `python -m pytest -q -n0
  tests/test_decode.py` took 47.5 s and 46.8 s with them, 45.9 s and
  44.2 s without (alternating runs, 2-core box, 2026-12-05)."""
  del session
  if os.environ.get("SPECJAX_TEST_GC") == "default":
    return
  gc.collect()
  gc.freeze()
  gc.set_threshold(50_000, 20, 100)


def pytest_unconfigure(config):
  del config
  if _OWN_CACHE is not None:  # the process that made it (the controller)
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
