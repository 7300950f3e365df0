r"""What a planned loop costs per call, by how many widths it holds.

  python benchmarks/planned_overhead.py [DRAFT] [NEW] [CYCLES]
      # defaults: distilled-draft-0.1m@target-3m 1 200

On the quick job's models (cached by `python -m experiments.reproduce`;
DRAFT may also be self:1 or self:2), batch 1, a 64-byte held-out prompt,
NEW new tokens, T = 1. For gamma_max G in 2, 4, 8: the fixed gamma = G loop
and a `Goodput` rule of gamma_max G pinned at width G
(`draft_length.pinned`, no probe, no prompt scoring), which runs the same
rounds in a planned loop holding one loop per width 1..G. Each of CYCLES
cycles runs every call once, in a seeded random order; per G, the median
seconds of each and the median of their per-cycle difference. At NEW = 1 a
call is one round, so the difference is what the planned loop costs a call
beyond its rounds.
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
from specjax import data  # noqa: E402
from specjax.decode import draft_length  # noqa: E402
from experiments import adaptive_gamma  # noqa: E402


def main(argv):
  name = argv[1] if len(argv) > 1 else "distilled-draft-0.1m@target-3m"
  new = int(argv[2]) if len(argv) > 2 else 1
  cycles = int(argv[3]) if len(argv) > 3 else 200
  target, _ = adaptive_gamma._load("quick")  # pylint: disable=protected-access
  draft = adaptive_gamma._draft(name, target)  # pylint: disable=protected-access
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, 1, 64, seed=0)
  lengths = np.full((1,), 64, np.int32)
  sampling = sj.SamplingConfig(temperature=1.0)
  gammas = {}
  for g in (2, 4, 8):
    rule = draft_length.Goodput(c=0.1, r=(1.0,) * g, prompt_prior=0.0)
    gammas[f"fixed {g}"] = g
    gammas[f"planned {g}"] = draft_length.pinned(rule, g)

  def call(gamma):
    jax.block_until_ready(sj.speculative_generate(
        target, draft, prompts, lengths, jax.random.key(0), gamma=gamma,
        max_new_tokens=new, sampling=sampling).tokens)
  for gamma in gammas.values():
    call(gamma)
  seconds = {k: [] for k in gammas}
  rng = random.Random(0)
  for _ in range(cycles):
    for k in rng.sample(list(gammas), len(gammas)):
      start = time.perf_counter()
      call(gammas[k])
      seconds[k].append(time.perf_counter() - start)
  print(f"{name}, batch 1, 64 + {new} tokens, T = 1, {cycles} cycles: "
        "median ms per call")
  for g in (2, 4, 8):
    fixed, planned = seconds[f"fixed {g}"], seconds[f"planned {g}"]
    extra = statistics.median(b - a for a, b in zip(fixed, planned))
    print(f"  gamma_max {g}: fixed {1e3 * statistics.median(fixed):6.2f}, "
          f"planned {1e3 * statistics.median(planned):6.2f}, "
          f"planned - fixed {1e3 * extra:+6.2f}")


if __name__ == "__main__":
  main(sys.argv)
