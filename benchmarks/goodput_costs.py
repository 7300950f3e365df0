r"""How much `measure_goodput`'s costs move between measurements.

  python benchmarks/goodput_costs.py [DRAFT] [BATCH] [TIMES]  # distilled... 1 3

On the quick job's models (cached by `python -m experiments.reproduce`),
64 + 128 tokens, gamma_max 8: measures the `Goodput` rule TIMES times in this
process (memo cleared in between), as `gamma="auto"` does on its first call,
and prints each measurement's r and its round costs for widths 1, 4 and 8
in units of the rule's autoregressive step (1 + overhead). Then, in the
same process, the loop's own rounds: fixed gamma 1, 4 and 8 against
`generate` on held-out prompts (greedy, 64 + 128 tokens;
`measure.loop_round_steps`), interleaved, 3 trials of 10 calls, each
round's median time over a `generate` step's, so the estimate and what it
estimates sit side by side. Run it twice to see
the spread between processes too.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import data, measure, sweep  # noqa: E402
from specjax.decode import draft_length  # noqa: E402
from configs import reproduce  # noqa: E402


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "distilled-draft-0.1m@target-3m"
  batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
  times = int(sys.argv[3]) if len(sys.argv) > 3 else 3
  config = reproduce.get_config("quick")
  config.drafts = [d for d in config.drafts if d.name == name]
  target, (draft,) = sweep.load_models(config, data.stdlib_corpus())
  print(f"{name}, batch {batch}: r (g + 1 tokens over 1) and round costs of "
        "widths 1, 4, 8 in autoregressive steps")
  for i in range(times):
    draft_length._MEASURED.clear()  # pylint: disable=protected-access
    rule = sj.measure_goodput(target, draft.model, batch_size=batch,
                              gamma_max=8, prompt_len=64, max_new_tokens=128)
    costs = rule.round_costs()[1 - rule.min_width:]  # widths 1..8
    step = 1.0 + rule.overhead
    print(i, "r", " ".join(f"{x:.2f}" for x in rule.r), "| rounds",
          " ".join(f"{costs[g - 1] / step:.2f}" for g in (1, 4, 8)),
          flush=True)

  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, batch, 64, seed=0)
  shape = measure.LoopShape(batch, 64, 128, 8)
  print("the loop's rounds of widths 1, 4, 8 in generate steps (medians)")
  for trial in range(3):
    steps = measure.loop_round_steps(target, draft.model, shape, sj.GREEDY,
                                     widths=(1, 4, 8), repeats=1,
                                     prompts_BxP=prompts)
    print(trial, "rounds", " ".join(f"{x:.2f}" for x in steps), flush=True)


if __name__ == "__main__":
  main()
