r"""gamma chosen by a plan-only rule against the same fixed gamma, side by side.

  python benchmarks/planned_loop.py [DRAFT] [TEMPERATURE] [BATCH] [TRIALS]
                                                # bigram 0 1 3

On the quick job's models (cached by `python -m experiments.reproduce`; DRAFT
may also be self:1 or self:2, the target's own first blocks), 64 + 128
tokens: ms per loop round of fixed gamma 1, 4 and 8 and of a rule that
always plans 1, 4 or 8 (gamma_max 4 or 8), i.e. the planned loop
(`loop._planned_loop`) at a constant width; and of `generate` against a rule
that always plans an off stretch (width 0; one probe, then steps that leave
the draft alone), interleaved, TRIALS trials of 10 calls (fewest and median);
and of a `Goodput` rule priced so that width 4 always wins ("goodput 4 of
8"), which plans as `gamma="auto"` does every round, so its row against
"plan 4 of 8" is the cost of the rule's own per-round work; "goodput 8
of 8" is the same rule priced so that width 8 always wins (against "fixed
8": what `gamma="auto"` paid over the fixed loop where it drafts 8, when
it planned every width);
"... each round" is the width-4 rule planning again inside every round,
as the loop did before `Rule.plans_one_width`. "4/8 each round" and
"4/8 each 4" plan 4 and 8 in turn, changing width every round or every 4
rounds: against the mean of "plan 4 of 8" and "plan 8 of 8", the price of
a change of width (before the loops of each width ran in sequence: a
`lax.switch` that copied both caches twice, and a wide catch-up window on
each stretch's first round). The planned rows should cost what the fixed
rows of the same width do, and the off row what a `generate` step does.
"""

import dataclasses
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.decode import draft_length, loop  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from specjax.harness import measure  # noqa: E402
from configs import reproduce  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Plan(draft_length.Rule):
  """Always plans width g (never stops early)."""
  g: int = 4
  gamma_max: int = 8
  # Goodput's default; sets the catch-up window of each stretch's first round.
  probe_every: int = 8

  @property
  def min_width(self):
    return 0

  def plan(self, stats, active_B, remaining_B):
    return jnp.full(active_B.shape, self.g, jnp.int32)


@dataclasses.dataclass(frozen=True)
class Alternate(Plan):
  """Plans width g for `every` rounds, then width h for `every`, and so on:
  a change of width each `every` rounds (the switch `Goodput.keeps` damps)."""
  h: int = 8
  every: int = 1

  def plan(self, stats, active_B, remaining_B):
    phase = (jnp.max(stats.rounds) // self.every) % 2
    return jnp.full(active_B.shape, jnp.where(phase == 0, self.g, self.h),
                    jnp.int32)


@dataclasses.dataclass(frozen=True)
class GoodputEachRound(draft_length.Goodput):
  """`Goodput` planning again inside every round (per-row budgets)."""
  plans_one_width = False


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "bigram"
  temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
  batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
  trials = int(sys.argv[4]) if len(sys.argv) > 4 else 3
  target, (draft,) = drafts_lib.load_models(reproduce.quick_draft(name),
                                          corpus=data.stdlib_corpus())
  sampling = sj.SamplingConfig(temperature=temperature)
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, batch, 64, seed=0)
  lengths = np.full((batch,), 64, np.int32)
  cases = {"fixed 1": 1, "plan 1 of 8": Plan(1, 8),
           "fixed 4": 4, "plan 4 of 4": Plan(4, 4), "plan 4 of 8": Plan(4, 8),
           "fixed 8": 8, "plan 8 of 8": Plan(8, 8), "off of 8": Plan(0, 8),
           "4/8 each round": Alternate(4, 8, h=8, every=1),
           "4/8 each 4": Alternate(4, 8, h=8, every=4),
           # Width 4 costs 1 target pass, any other 50: it always wins.
           "goodput 4 of 8": draft_length.Goodput(
               c=0.0, r=(50.0,) * 3 + (1.0,) + (50.0,) * 4),
           "goodput 8 of 8": draft_length.Goodput(c=0.0,
                                                  r=(50.0,) * 7 + (1.0,)),
           "... each round": GoodputEachRound(
               c=0.0, r=(50.0,) * 3 + (1.0,) + (50.0,) * 4)}
  fns = {k: (lambda g=g: loop.speculative_generate(
      target, draft.model, prompts, lengths, jax.random.key(0), gamma=g,
      max_new_tokens=128, sampling=sampling)) for k, g in cases.items()}
  fns["generate"] = lambda: loop.generate(
      target, prompts, lengths, jax.random.key(0), max_new_tokens=128,
      sampling=sampling)
  rounds = {k: int(np.asarray(f().stats.rounds).max()) for k, f in fns.items()}
  print(f"{name}, T={temperature:g}, batch {batch}: ms per round "
        "(fewest / median)")
  for trial in range(trials):
    t = measure.interleaved_times(fns, 10)
    print(trial, "  ".join(
        f"{k}: {min(v) * 1e3 / rounds[k]:.3f} / "
        f"{statistics.median(v) * 1e3 / rounds[k]:.3f}"
        for k, v in t.items()), flush=True)


if __name__ == "__main__":
  main()
