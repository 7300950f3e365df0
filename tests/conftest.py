"""Puts the repository root on sys.path: `configs/` and `experiments/` are
top-level folders of the checkout, not part of the installed package."""

import gc
import logging
import os
import pathlib
import sys

import compile_settings  # tests/, beside this file
import xla_cache  # tests/, beside this file

# The suite's XLA settings (-O0, loop emitters), set by environment so the
# subprocesses (mesh worker, notebook kernels) inherit them.
compile_settings.apply()
# One compilation cache, shared by the workers, every subprocess (set before
# the workers start, so they inherit it) and later runs: a program that
# several files, or an earlier run, compiled is loaded, not compiled again.
# It lives in the model cache's xla-tests/ ($SPECJAX_CACHE, else
# ~/.cache/specjax: `specjax.harness.zoo.resolve_cache_dir`'s rule, spelled out here
# because the environment is set before anything imports jax);
# JAX_COMPILATION_CACHE_DIR overrides it (.ci/run points
# it at an empty directory, so CI times a cold run). Entries are keyed by the
# program, the flags and the jax version, so a stale one is never used.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
      os.path.expanduser(os.environ.get("SPECJAX_CACHE")
                         or os.path.join("~", ".cache", "specjax")),
      "xla-tests")
  if "PYTEST_XDIST_WORKER" not in os.environ:  # once, in the controller
    xla_cache.prune(os.environ["JAX_COMPILATION_CACHE_DIR"])
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


def host_devices_env(devices: int) -> dict:
  """This environment for a subprocess with `devices` CPU devices that
  imports this checkout. It drops the suite's persistent compilation cache:
  sharded programs loaded from it deadlocked in XLA:CPU's collectives (see
  `specjax.distributed.use_compilation_cache`)."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={devices}")
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
  env["JAX_PLATFORMS"] = "cpu"
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  return env

# A deliberately damaged checkpoint leaves orbax's async reads with futures
# whose (expected) errors asyncio logs at interpreter exit, after pytest's
# summary; they say nothing the test has not already asserted.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

# CI runs the same hypothesis examples every time, so a red run is
# reproducible; locally hypothesis keeps exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
  settings.load_profile("ci")

# The longest files first (longest-processing-time order): `--dist
# loadfile` hands whole files to the workers as they come free, so a long
# file started late leaves the other workers idle at the end. The seconds
# are each file's wall time on a worker in a full run (`python
# benchmarks/compile_profile.py` prints them; 2-core box, 2026-12-05). Since
# pytest-xdist 3.5 the scheduler orders files by their number of tests
# instead unless run with `--no-loadscope-reorder` (pyproject.toml's
# addopts): without it this order never applied, and test_exactness.py
# (245 s) started after 466 s and ran alone to the end. Files not listed
# (new ones) run last.
_LONGEST_FIRST = (
    "test_draft_length.py",   # 274 s
    "test_exactness.py",      # 245
    "test_self_draft.py",     # 213
    "test_sharding.py",       # 135
    "test_sweep.py",          # 108
    "test_decode.py",         # 87
    "test_eagle.py",          # 74
    "test_trees.py",          # 70
    "test_verifiers.py",      # 66
    "test_train.py",          # 65
    "test_math.py",           # 63
    "test_distill_zoo.py",    # 63
    "test_hf.py",             # 62
    "test_sampling.py",       # 56
    "test_coupling_stats.py", # 55
    "test_measure.py",        # 43
    "test_figures.py",        # 36
    "test_transformer.py",    # 36
    "test_expected_tokens.py",  # 34
    "test_lab.py",            # 32
    "test_nonfinite.py",      # 31
    "test_dtype.py",          # 31
    "test_sharded_notebook.py",   # 26
    "test_verifiers_notebook.py",  # 21
    "test_experiment_flags.py",   # 20
    "test_notebook.py",       # 19
    "test_generate_cli.py",   # 19
    "test_hf_notebook.py",    # 19
    "test_readme.py",         # 15
    "test_jit_memory.py",     # 14
    "test_exit_adapter.py",   # 13
)


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

