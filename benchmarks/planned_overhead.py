r"""What a planned loop costs per call, by how many widths it holds.

  python benchmarks/planned_overhead.py [DRAFT] [NEW] [CYCLES] [BATCH]
      # defaults: distilled-draft-0.1m@target-3m 1 200 1

On the quick job's models (cached by `python -m experiments.reproduce`;
DRAFT may also be self:1 or self:2), BATCH rows of 64-byte held-out
prompts, NEW new tokens, T = 1. For gamma_max G in 2, 4, 8: the fixed
gamma = G loop and a `Goodput` rule of gamma_max G pinned at width G
(`draft_length.pinned`, no probe, no prompt scoring), which runs the same
rounds in a planned loop holding one loop per width 1..G; then, at
gamma_max 8, the same rule planning only widths 1, 2, 4, 8 and only width
8 (`Goodput.widths`): four loops and one; and the rule of every width
scoring the prompt: `prompt_prior` 8, 16 and 64 (the prefills then run
both models' last blocks, final norms and LM heads on the prompt's last 8
or 16 positions, or all 64, as the loop scored every prompt before
`Goodput.prompt_window`); last, widths 1, 2, 4, 8 with a probe round (the
loop then also holds the off stretch's loops), without and with the prompt
scored at 8 and 16 positions: with the rule's default `prompt_prior`, the
program `gamma="auto"` compiles. Each of
CYCLES cycles runs every call once, in a seeded random order; per row,
the median seconds of each and the median of their per-cycle difference.
At NEW = 1 a call is one round, so the difference is what the planned
loop costs a call beyond its rounds.
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
from specjax.harness import autotune  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from configs import reproduce  # noqa: E402


def main(argv):
  name = argv[1] if len(argv) > 1 else "distilled-draft-0.1m@target-3m"
  new = int(argv[2]) if len(argv) > 2 else 1
  cycles = int(argv[3]) if len(argv) > 3 else 200
  batch = int(argv[4]) if len(argv) > 4 else 1
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  draft = drafts_lib.make_draft(name, target,
                                config=reproduce.get_config("quick")).model
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, batch, 64, seed=0)
  lengths = np.full((batch,), 64, np.int32)
  sampling = sj.SamplingConfig(temperature=1.0)
  gammas = {}
  rows = {}  # a planned loop's label -> its fixed loop's
  auto = autotune.doubling_widths(8)  # gamma="auto"'s widths
  for g, widths, prior, probe in (
      (2, None, 0.0, None), (4, None, 0.0, None), (8, None, 0.0, None),
      (8, auto, 0.0, None), (8, (8,), 0.0, None), (8, None, 8.0, None),
      (8, None, 16.0, None), (8, None, 64.0, None), (8, auto, 0.0, 1.5),
      (8, auto, 8.0, 1.5), (8, auto, 16.0, 1.5)):
    rule = draft_length.Goodput(c=0.1, r=(1.0,) * g, prompt_prior=prior,
                                widths=widths, probe=probe)
    label = (f"gamma_max {g}"
             + (f", widths {','.join(map(str, widths))}" if widths else "")
             + (", probe" if probe else "")
             + (f", prompt scored ({prior:g})" if prior else ""))
    gammas[f"fixed {g}"] = g
    gammas[label] = draft_length.pinned(rule, g)
    rows[label] = f"fixed {g}"

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
  print(f"{name}, batch {batch}, 64 + {new} tokens, T = 1, {cycles} cycles: "
        "median ms per call")
  pad = max(map(len, rows)) + 1
  for label, fixed_label in rows.items():
    fixed, planned = seconds[fixed_label], seconds[label]
    extra = statistics.median(b - a for a, b in zip(fixed, planned))
    print(f"  {label + ':':{pad}s} fixed {1e3 * statistics.median(fixed):6.2f}, "
          f"planned {1e3 * statistics.median(planned):6.2f}, "
          f"planned - fixed {1e3 * extra:+6.2f}")


if __name__ == "__main__":
  main(sys.argv)
