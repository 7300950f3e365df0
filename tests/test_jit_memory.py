"""Compiled programs against the kernel's memory-map limit (specjax.jit_memory),
and timers that refuse to time a compile (specjax.harness.measure.no_compiles)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import jit_memory
from specjax.harness import measure

pytestmark = pytest.mark.skipif(
    jit_memory.mapping_count() is None or jit_memory.mapping_limit() is None,
    reason="needs Linux's /proc")


@pytest.fixture(name="model", scope="module")
def _model():
  return sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=16, d_model=8, num_layers=1, num_heads=2, max_positions=16), 0)


def _generate(model):
  return sj.generate(model, np.ones((1, 2), np.int32), np.array([2], np.int32),
                     jax.random.key(0), max_new_tokens=3)


@pytest.fixture(name="fake")
def _fake(monkeypatch):
  """A limit of 1,000 mappings and a count the test sets; restores state."""
  counts = {"now": 100, "after_clear": 100}
  cleared = []

  def count():
    return counts["after_clear"] if cleared else counts["now"]

  def clear():
    cleared.append(True)
  monkeypatch.setattr(jit_memory, "mapping_limit", lambda: 1000)
  monkeypatch.setattr(jit_memory, "mapping_count", count)
  monkeypatch.setattr(jit_memory.jax, "clear_caches", clear)
  for key in ("warned", "relieve", "stuck"):
    monkeypatch.setitem(jit_memory._state, key, False)
  return counts, cleared


@pytest.mark.full
def test_compiles_count_compiles_and_loads_not_cache_hits():
  f = jax.jit(lambda x: x * 3 + 1)
  x = jnp.ones(5)
  before, seconds = jit_memory.compiles(), jit_memory.compile_seconds()
  f(x)
  assert jit_memory.compiles() == before + 1
  assert jit_memory.compile_seconds() > seconds
  seconds = jit_memory.compile_seconds()
  f(x)
  assert jit_memory.compiles() == before + 1
  assert jit_memory.compile_seconds() == seconds
  # Out of memory, the program is compiled again or, with JAX's persistent
  # cache on (tests/conftest.py turns it on), loaded from it: both count.
  jax.clear_caches()
  f(x)
  assert jit_memory.compiles() == before + 2


def test_real_counts_are_read():
  assert 0 < jit_memory.mapping_count() < jit_memory.mapping_limit() * 10


def test_a_compile_near_the_limit_warns_and_the_next_call_clears(model, fake):
  counts, cleared = fake
  _generate(model)  # compiled (or cached) far below the limit: nothing
  f = jax.jit(lambda x: x - 2)
  counts["now"] = 850
  with pytest.warns(RuntimeWarning, match="vm.max_map_count=1,000"):
    f(jnp.ones(3))  # a compile past RELIEVE_AT: warned and marked
  assert not cleared  # never inside a compile
  with jit_memory.deferred():  # a timer's calls: held off
    _generate(model)
  assert not cleared
  counts["after_clear"] = 200
  with pytest.warns(RuntimeWarning, match="cleared JAX's compilation caches, "
                    "which held 650 of 850"):
    _generate(model)
  assert len(cleared) == 1
  _generate(model)  # cleared once per crossing
  assert len(cleared) == 1


def test_mappings_that_clearing_does_not_free_stop_the_clearing(model, fake):
  counts, cleared = fake
  counts["now"] = counts["after_clear"] = 900
  with pytest.warns(RuntimeWarning, match="max_map_count"):
    jax.jit(lambda x: x * 5)(jnp.ones(3))
  with pytest.warns(RuntimeWarning, match="will not clear them again"):
    _generate(model)
  jax.jit(lambda x: x * 7)(jnp.ones(3))  # still past the mark: not again
  _generate(model)
  assert len(cleared) == 1


def test_below_half_the_limit_nothing_happens(model, fake):
  counts, cleared = fake
  counts["now"] = 499
  with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    jax.jit(lambda x: x + 11)(jnp.ones(3))
    _generate(model)
  assert not cleared


def test_timers_refuse_a_timed_call_that_compiles():
  f = jax.jit(lambda x: x.sum())
  sizes = iter(range(1, 100))
  # A new shape on every call: each timed call compiles.
  with pytest.raises(RuntimeError, match="compile.*timed calls"):
    measure.interleaved_times({"a": lambda: f(jnp.ones(next(sizes)))}, 2)
  # The same shape: only the warm-up compiles.
  times = measure.interleaved_times({"a": lambda: f(jnp.ones(3))}, 2)
  assert len(times["a"]) == 2


def test_a_timer_clears_before_its_warm_up_not_between_its_calls(fake):
  counts, cleared = fake
  counts["now"] = 850
  with pytest.warns(RuntimeWarning, match="max_map_count"):
    jax.jit(lambda x: x * 13)(jnp.ones(3))
  calls = []

  def fn():
    calls.append(len(cleared))  # clearings seen by each call
    return jnp.ones(2)
  with pytest.warns(RuntimeWarning, match="measure.interleaved_times: cleared"):
    measure.interleaved_times({"a": fn}, 3)
  assert calls == [1, 1, 1, 1]  # cleared before the warm-up, once
