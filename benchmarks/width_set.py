r"""What `Goodput(widths=(1, 2, 4, 8))` saves gamma="auto": first call and after.

  python benchmarks/width_set.py [DRAFT] [BATCH] [CYCLES]
      # defaults: distilled-draft-0.1m@target-3m 1 40

On the quick job's models (cached by `python -m experiments.reproduce`;
DRAFT may also be bigram, self:1 or self:2), BATCH rows of 64-byte held-out
prompts, 128 new tokens, T = 1, two rules:

  every width   `measure_goodput(...)`: a planned loop holding a loop of
                rounds for each width 1..8 (gamma="auto" before it took
                widths 1, 2, 4, 8);
  1,2,4,8       `measure_goodput(..., widths=(1, 2, 4, 8))`: four of them,
                what gamma="auto" runs.

First, from an empty compilation cache and no memoised measurement, each
rule's measurement and then its first call, twice in the order every, 1248,
1248, every: wall seconds, compiles and their seconds. Then the last two
rules side by side, compiled: CYCLES cycles each calling both once, in a
seeded random order, on the cycle's own prompts; the median seconds a call,
the draft passes a round, and the ratio of the total times and the median
of the per-cycle ratio.
"""

import os
import random
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import jit_memory  # noqa: E402
from specjax.harness import autotune  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from experiments import adaptive_gamma  # noqa: E402
from configs import reproduce  # noqa: E402

_WIDTHS = {"every width": None, "1,2,4,8": (1, 2, 4, 8)}


def main(argv):
  name = argv[1] if len(argv) > 1 else "distilled-draft-0.1m@target-3m"
  batch = int(argv[2]) if len(argv) > 2 else 1
  cycles = int(argv[3]) if len(argv) > 3 else 40
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  draft = drafts_lib.make_draft(name, target,
                                config=reproduce.get_config("quick")).model
  sampling = sj.SamplingConfig(temperature=1.0)
  calls = adaptive_gamma.held_out_calls(cycles, batch, 64)
  lengths = np.full((batch,), 64, np.int32)

  def call(rule, prompts_BxP, key):
    return sj.speculative_generate(target, draft, prompts_BxP, lengths, key,
                                   gamma=rule, max_new_tokens=128,
                                   sampling=sampling)

  print(f"quick target, draft {name}, batch {batch}, T = 1, 64 + 128 "
        f"tokens, {os.cpu_count()} cores")
  rules = {}
  for label in ("every width", "1,2,4,8", "1,2,4,8", "every width"):
    jax.clear_caches()
    autotune._MEASURED.clear()  # pylint: disable=protected-access
    compiles, seconds = jit_memory.compiles(), jit_memory.compile_seconds()
    start = time.perf_counter()
    rules[label] = autotune.measure_goodput(
        target, draft, batch_size=batch, prompt_len=64, max_new_tokens=128,
        sampling=sampling, widths=_WIDTHS[label])
    measured = time.perf_counter() - start
    jax.block_until_ready(call(rules[label], calls[0],
                               jax.random.key(0)).tokens)
    print(f"  {label:11s} measured in {measured:5.1f} s, with its first call "
          f"{time.perf_counter() - start:5.1f} s: "
          f"{jit_memory.compiles() - compiles} compiles, "
          f"{jit_memory.compile_seconds() - seconds:5.1f} s of them",
          flush=True)
  for rule in rules.values():  # both compiled (the caches were cleared)
    call(rule, calls[0], jax.random.key(0))
  seconds = {label: [] for label in rules}
  drafts = {label: [0, 0] for label in rules}  # draft passes, rounds
  order = random.Random(0)
  for i, prompts_BxP in enumerate(calls[1:], start=1):
    for label in order.sample(list(rules), len(rules)):
      start = time.perf_counter()
      out = call(rules[label], prompts_BxP, jax.random.key(i))
      jax.block_until_ready(out.tokens)
      seconds[label].append(time.perf_counter() - start)
      s = out.summary()
      drafts[label][0] += s["draft_calls"]
      drafts[label][1] += s["rounds"]
  every, some = seconds["every width"], seconds["1,2,4,8"]
  print(f"\n  compiled, {cycles} cycles: median ms a call, draft passes a "
        "round")
  for label, times in seconds.items():
    print(f"  {label:11s} {1e3 * statistics.median(times):7.2f} ms, "
          f"{drafts[label][0] / drafts[label][1]:.2f} drafts a round")
  print(f"  1,2,4,8 / every width: total time {sum(some) / sum(every):.3f}, "
        f"median per cycle "
        f"{statistics.median(b / a for a, b in zip(every, some)):.3f}")


if __name__ == "__main__":
  main(sys.argv)
