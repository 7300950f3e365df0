r"""Does the order of interleaved calls bias a timed ratio? An A/A check.

  python benchmarks/timing_order.py [DRAFT] [TEMPERATURE] [BATCH] [CYCLES] [NEW]
      # defaults: distilled-draft-0.1m@target-3m 1 1 80 128

On the quick job's models (cached by `python -m experiments.reproduce`; DRAFT
may also be self:1 or self:2, the target's own first blocks), 64 + NEW tokens:
six calls timed in cycles, each cycle one call of each. Two of them are the
same call ("fixed 8" and "fixed 8 again": one function, one compiled program),
so their ratio is 1 but for the timing; "goodput 8" is a `Goodput` rule
pinned at width 8 (`draft_length.pinned`: the planned program of every
width 1..8, `gamma="auto"`'s until it planned 1, 2, 4, 8 only, drafting
what fixed 8 does), and "goodput 8, no prompt" the same with `prompt_prior=0` (its
prefill scores no prompt window); "fixed 1" and `generate` run between them,
as other programs do in an experiment's cycle. A NEW that changes a ratio
says whether its cost is per call or per round. Three schedules, one after
the other: the same order every cycle (as
`specjax.harness.measure.interleaved_times`), the order reversed every other cycle
(ABBA), and a seeded shuffle each cycle. Per schedule: the median over
cycles of each pair's ratio, with a 95% bootstrap interval over cycles. The
interval treats cycles as independent, which a drifting machine makes them not:
the A/A row says how far to trust it.
"""

import dataclasses
import os
import random
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.decode import draft_length  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from configs import reproduce  # noqa: E402

SCHEDULES = ("same order", "ABBA", "shuffled")
PAIRS = (("fixed 8 again", "fixed 8"), ("goodput 8", "fixed 8"),
         ("goodput 8", "fixed 8 again"), ("goodput 8, no prompt", "fixed 8"))


def order(names, schedule, cycle, rng):
  if schedule == "ABBA" and cycle % 2:
    return names[::-1]
  if schedule == "shuffled":
    return rng.sample(names, len(names))
  return names


def interval(ratios):
  rng = np.random.default_rng(0)
  medians = [np.median(rng.choice(ratios, len(ratios))) for _ in range(2000)]
  return np.percentile(medians, [2.5, 97.5])


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "distilled-draft-0.1m@target-3m"
  temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
  batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
  cycles = int(sys.argv[4]) if len(sys.argv) > 4 else 80
  new = int(sys.argv[5]) if len(sys.argv) > 5 else 128
  target, (draft,) = drafts_lib.load_models(reproduce.quick_draft(name),
                                          corpus=data.stdlib_corpus())
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, batch, 64, seed=0)
  lengths = np.full((batch,), 64, np.int32)
  sampling = sj.SamplingConfig(temperature=temperature)
  # auto's structure (gamma_max 8, probe rounds), pinned at width 8.
  goodput8 = draft_length.pinned(
      draft_length.Goodput(c=0.0, r=(1.0,) * 8, probe=1.0), 8)

  def spec(gamma):
    return lambda: sj.speculative_generate(
        target, draft.model, prompts, lengths, jax.random.key(0),
        gamma=gamma, max_new_tokens=new, sampling=sampling)
  fixed8 = spec(8)
  fns = {"fixed 8": fixed8, "goodput 8": spec(goodput8),
         "goodput 8, no prompt": spec(dataclasses.replace(goodput8,
                                                          prompt_prior=0.0)),
         "fixed 8 again": fixed8, "fixed 1": spec(1),
         "generate": lambda: sj.generate(target, prompts, lengths,
                                         jax.random.key(0), max_new_tokens=new,
                                         sampling=sampling)}
  for fn in fns.values():
    jax.block_until_ready(fn())
  print(f"{name}, T={temperature:g}, batch {batch}, 64 + {new} tokens, "
        f"{cycles} cycles per "
        "schedule: median ratio of seconds per call [95% over cycles]")
  rng = random.Random(0)
  for schedule in SCHEDULES:
    times = {k: [] for k in fns}
    for cycle in range(cycles):
      for k in order(list(fns), schedule, cycle, rng):
        start = time.perf_counter()
        jax.block_until_ready(fns[k]())
        times[k].append(time.perf_counter() - start)
    cells = []
    for a, b in PAIRS:
      ratios = np.array(times[a]) / np.array(times[b])
      low, high = interval(ratios)
      cells.append(f"{a} / {b} {np.median(ratios):.3f} [{low:.3f}, "
                   f"{high:.3f}]")
    print(f"{schedule:>10}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
  main()
