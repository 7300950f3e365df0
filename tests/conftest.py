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
  most of the run (`python -m tools.prompt_bucket`: 7.1 s at width 16,
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
# are each file's wall time on a worker in a cold run of the fast tier
# (`python -m tools.compile_profile` prints them). Since pytest-xdist
# 3.5 the scheduler orders files by their number of tests instead unless
# run with `--no-loadscope-reorder` (pyproject.toml's addopts). Files whose
# full-tier tests are long but whose fast-tier ones take seconds come first,
# so that in the full tier (`.ci/run`) they do not start late either. Files
# not listed (new ones) run last.
_LONGEST_FIRST = (
    # Long in the full tier only (full-tier seconds).
    "test_draft_length.py",        # 274
    "test_sharding.py",            # 140
    "test_docs.py",                # 70
    "test_experiment_flags.py",    # 51
    "test_sharded_notebook.py",    # 32
    "test_notebook.py",            # 20
    "test_hf_notebook.py",         # 20
    "test_generate_cli.py",        # 22
    "test_verifiers_notebook.py",  # 15
    # The fast tier, longest first (fast-tier seconds).
    "test_verifiers.py",           # 64
    "test_exactness.py",           # 53
    "test_trees.py",               # 39
    "test_self_draft.py",          # 38
    "test_math.py",                # 37
    "test_coupling_stats.py",      # 36
    "test_hf.py",                  # 34
    "test_train.py",               # 34
    "test_sampling.py",            # 33
    "test_decode.py",              # 32
    "test_greedy.py",              # 32
    "test_eagle.py",               # 27
    "test_transformer.py",         # 26
    "test_figures.py",             # 19
    "test_expected_tokens.py",     # 16
    "test_measure.py",             # 14
    "test_nonfinite.py",           # 13
    "test_dtype.py",               # 12
    "test_distill_zoo.py",         # 12
    "test_exit_adapter.py",        # 11
    "test_sweep.py",               # 10
    "test_distortion.py",          # 10
    "test_drafts.py",              # 8
    "test_generation_check.py",    # 7
    "test_draft_registry.py",      # 7
    "test_policy.py",              # 5
    "test_jit_memory.py",          # 2
    "test_stats.py",               # 2
    "test_lab.py",                 # 1
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

