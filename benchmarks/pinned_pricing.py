r"""What `gamma="auto"`'s pricing costs a first call, priced two ways.

  python benchmarks/pinned_pricing.py [DRAFT] [BATCH] [TRIALS]
      # defaults: distilled-draft-0.1m@target-3m 1 5

On the quick job's models (cached by `python -m experiments.reproduce`;
DRAFT may also be self:1 or self:2), at `measure_goodput`'s shapes for a
64-token prompt and 128 new tokens, T = 1: every width 1..8 priced by the
loop's own rounds (`measure.loop_round_steps`) two ways:

  fixed   `speculative_generate(gamma=g)` for each g: a loop compiled per
          width (how `measure_goodput` priced the widths before);
  pinned  the `Goodput` rule `measure_goodput` returns, pinned at each width
          (`draft_length.pinned`): one planned loop for every width, the
          program `gamma="auto"` then ran (it now plans widths 1, 2, 4,
          8: `benchmarks/width_set.py`).

First each way from an empty compilation cache (the caches cleared before
each): the wall time of the pricing, its compiles and their seconds, and
then of the first call of the rule itself. Then both side by side, the
programs compiled: TRIALS alternating trials of `loop_round_steps` (one
trial each, 10 calls a width), and per width the median over trials of each
price (in `generate` steps) and of their ratio.
"""

import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import jit_memory  # noqa: E402
from specjax.decode import draft_length  # noqa: E402
from specjax.harness import autotune  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from specjax.harness import measure  # noqa: E402
from configs import reproduce  # noqa: E402


def main(argv):
  name = argv[1] if len(argv) > 1 else "distilled-draft-0.1m@target-3m"
  batch = int(argv[2]) if len(argv) > 2 else 1
  trials = int(argv[3]) if len(argv) > 3 else 5
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  draft = drafts_lib.make_draft(name, target,
                                config=reproduce.get_config("quick")).model
  shape = measure.LoopShape(batch, 64, 128, 8)
  sampling = sj.SamplingConfig(temperature=1.0)
  widths = tuple(range(1, 9))
  # The structure measure_goodput gives this draft and batch (its costs are
  # `pinned`'s).
  rule = draft_length.Goodput(
      c=0.1, r=(1.0,) * 8, probe=1.0,
      hysteresis=autotune.BATCHED_HYSTERESIS if batch > 1 else 0.0,
      probe_every=1 if getattr(draft, "reads_target_features", False) else 8)
  ways = {"fixed": None, "pinned": rule}
  prompts = np.random.default_rng(1).integers(
      0, target.vocab_size, (batch, 64)).astype(np.int32)
  lengths = np.full((batch,), 64, np.int32)
  print(f"quick target, draft {name}, batch {batch}, T = 1, 64 + 128 tokens, "
        f"{os.cpu_count()} cores")
  for way, pinned_to in ways.items():
    jax.clear_caches()
    compiles, seconds = jit_memory.compiles(), jit_memory.compile_seconds()
    start = time.perf_counter()
    measure.loop_round_steps(target, draft, shape, sampling, widths=widths,
                             calls=2, repeats=1, rule=pinned_to)
    priced = time.perf_counter() - start
    print(f"  {way:6s} pricing from cold: {priced:6.1f} s, "
          f"{jit_memory.compiles() - compiles} compiles, "
          f"{jit_memory.compile_seconds() - seconds:5.1f} s of them",
          flush=True)
    compiles, seconds = jit_memory.compiles(), jit_memory.compile_seconds()
    start = time.perf_counter()
    jax.block_until_ready(sj.speculative_generate(
        target, draft, prompts, lengths, jax.random.key(0), gamma=rule,
        max_new_tokens=128, sampling=sampling).tokens)
    print(f"  {'':6s} then the rule's first call: "
          f"{time.perf_counter() - start:6.1f} s, "
          f"{jit_memory.compiles() - compiles} compiles", flush=True)
  prices = {way: [] for way in ways}
  for _ in range(trials):
    for way, pinned_to in ways.items():
      prices[way].append(measure.loop_round_steps(
          target, draft, shape, sampling, widths=widths, repeats=1,
          rule=pinned_to))
  print(f"\n  per width, median over {trials} alternating trials "
        "(generate steps a round):")
  print("  width   fixed  pinned  pinned / fixed")
  for i, g in enumerate(widths):
    fixed = [p[i] for p in prices["fixed"]]
    pinned = [p[i] for p in prices["pinned"]]
    ratio = statistics.median(b / a for a, b in zip(fixed, pinned))
    print(f"  {g:5d}  {statistics.median(fixed):6.2f}  "
          f"{statistics.median(pinned):6.2f}  {ratio:6.3f}")


if __name__ == "__main__":
  main(sys.argv)
