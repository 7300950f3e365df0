"""Memory mappings per compiled whole-generation program, and what happens
when one process compiles enough of them to near the kernel's limit.

    python -m tools.jit_mappings [PROGRAMS] [--suite] [--auto]   # from the root

Compiles PROGRAMS (default 8) distinct speculative loops: a three-block Llama
target, its first block as a `SelfDraft` and a `Confidence` rule, one
program per max_new_tokens. Prints the process's mappings
(/proc/self/maps) after each, and their mean growth per program. `--suite`
compiles as the test suite does (XLA -O0, loop emitters:
tests/compile_settings.py). Past `specjax.jit_memory.RELIEVE_AT` of
vm.max_map_count the next call clears JAX's caches (a RuntimeWarning says
so) and the count drops; without that, a process crashed at the limit.
`--auto` first prices a `gamma="auto"` rule (`autotune.auto_rule`) and
makes one call with it on the same models (batch 1), and prints the
programs they compiled and the mappings they hold.
Counts mappings only; the compile times it prints are for orientation.
"""

import sys
import time
import warnings

if "--suite" in sys.argv:
  from tests import compile_settings  # pylint: disable=g-import-not-at-top
  compile_settings.apply()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

import specjax as sj
from specjax import jit_memory
from specjax.harness import autotune


def main(argv):
  programs = int(next((a for a in argv[1:] if not a.startswith("-")), 8))
  config = sj.TransformerConfig(vocab_size=64, d_model=32, num_layers=3,
                                num_heads=4, num_kv_heads=2, max_positions=512,
                                flavour="llama")
  target = sj.TransformerLM.create(config, 0)
  draft = sj.SelfDraft(target, layers=1, share_cache=True)
  prompts = np.ones((8, 6), np.int32)
  lengths = np.full((8,), 6, np.int32)
  limit = jit_memory.mapping_limit()
  start = previous = jit_memory.mapping_count()
  print(f"vm.max_map_count {limit}; mappings at start {start}; "
        f"settings: {'the suite' if '--suite' in argv else 'XLA defaults'}")
  if "--auto" in argv:
    before, compiled = jit_memory.mapping_count(), jit_memory.compiles()
    sampling = sj.SamplingConfig(1.0)
    rule = autotune.auto_rule(target, draft, prompts[:1], lengths[:1],
                              max_new_tokens=16, sampling=sampling)
    sj.speculative_generate(target, draft, prompts[:1], lengths[:1],
                            jax.random.key(0), gamma=rule, max_new_tokens=16,
                            sampling=sampling)
    previous = jit_memory.mapping_count()
    print(f"one gamma='auto' call: {jit_memory.compiles() - compiled} "
          f"programs, +{previous - before} mappings")
  growth = []
  warnings.simplefilter("always", RuntimeWarning)
  for i in range(programs):
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
      sj.speculative_generate(
          target, draft, prompts, lengths, jax.random.key(0),
          gamma=sj.Confidence(threshold=0.5, gamma_max=4),
          max_new_tokens=2 + i, sampling=sj.SamplingConfig(1.0))
    now = jit_memory.mapping_count()
    note = "; ".join(str(w.message)[:90] + "..." for w in caught)
    if now > previous:  # not the call that cleared the caches
      growth.append(now - previous)
    print(f"program {i + 1:3d}: {now:6d} mappings (+{now - previous}), "
          f"{time.perf_counter() - t0:5.1f} s" + (f"  [{note}]" if note else ""),
          flush=True)
    previous = now
  t0 = time.perf_counter()
  jit_memory.mapping_count()
  print(f"mean growth per program: {np.mean(growth):.0f} mappings "
        f"({len(growth)} programs); caches cleared {jit_memory.reliefs()} "
        f"time(s); counting {previous} mappings took "
        f"{1e3 * (time.perf_counter() - t0):.1f} ms")


if __name__ == "__main__":
  main(sys.argv)
