r"""What `measure_goodput` prices each round width at, timed two ways.

  python benchmarks/goodput_costs.py [DRAFT] [BATCH] [TIMES] [SECONDS REPEATS]
                                     [alone|text]    # distilled... 1 2 0.05 3

On the quick job's models (cached by `python -m experiments.reproduce`; DRAFT
may also be self:1 or self:2, the target's own first blocks),
64 + 128 tokens, gamma_max 8: measures the `Goodput` rule TIMES times in this
process (memo cleared in between), as `gamma="auto"` does on its first call,
from the passes timed alone, and as `measure_goodput(calibrate=True)` does,
from the loop's own round of every width (`measure.loop_round_steps`, on
rows of random tokens: low acceptance, so a call runs many rounds and its
fixed costs spread thin). Prints each measurement's round cost for widths
1..8 in units of the rule's autoregressive step (1 + overhead), and under
it the rule's parts in 1-token target passes (c, c_first, overhead, r), to
see which of them moved. Run it twice to see the spread between processes
too. SECONDS and REPEATS are `measure_goodput`'s timing budget (its
defaults: 0.05 s a timed call, best of 3); `alone` skips the loop's rounds.
`text` instead times the loop's own rounds (`measure.loop_round_steps`)
TIMES times on the random rows the calibration uses and on held-out text
(64-token windows of the corpus: high acceptance, fewer rounds a call),
alternately, to see whether the prompts move the prices beyond the spread.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.harness import autotune  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from specjax.harness import measure  # noqa: E402
from configs import reproduce  # noqa: E402


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "distilled-draft-0.1m@target-3m"
  batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
  times = int(sys.argv[3]) if len(sys.argv) > 3 else 2
  seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
  repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 3
  pricings = (False,) if sys.argv[6:] == ["alone"] else (False, True)
  target, (draft,) = drafts_lib.load_models(reproduce.quick_draft(name),
                                          corpus=data.stdlib_corpus())
  if sys.argv[6:] == ["text"]:
    heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
    shape = measure.LoopShape(batch, 64, 128, 8)
    print(f"{name}, batch {batch}, T=1: the loop's rounds of widths 1..8 in "
          f"generate steps (measure.loop_round_steps, median of 3 trials)")
    for i in range(times):
      for what, prompts in (("random rows", None), ("held-out text",
                            data.prompts(heldout, batch, 64, seed=i))):
        steps = measure.loop_round_steps(
            target, draft.model, shape, sj.SamplingConfig(temperature=1.0),
            widths=range(1, 9), prompts_BxP=prompts)
        print(f"{i} {what:>13}:", " ".join(f"{x:.2f}" for x in steps),
              flush=True)
    return
  print(f"{name}, batch {batch}: round costs of widths 1..8 in "
        f"autoregressive steps (timed calls of {seconds} s, best of "
        f"{repeats})")
  for i in range(times):
    for calibrate in pricings:
      autotune._MEASURED.clear()  # pylint: disable=protected-access
      rule = autotune.measure_goodput(target, draft.model, batch_size=batch,
                                gamma_max=8, prompt_len=64, max_new_tokens=128,
                                calibrate=calibrate, seconds=seconds,
                                repeats=repeats)
      costs = rule.round_costs()[1 - rule.min_width:]  # widths 1..8
      step = 1.0 + rule.overhead
      what = "the loop's rounds" if calibrate else "passes timed alone"
      print(f"{i} {what:>18}:", " ".join(f"{x / step:.2f}" for x in costs),
            flush=True)
      # The parts, in 1-token target passes: which of them moved.
      print(f"{'':>21}c {rule.c:.3f}, c_first {rule.c_first:.3f}, overhead "
            f"{rule.overhead:.3f}, r", " ".join(f"{x:.2f}" for x in rule.r),
            flush=True)


if __name__ == "__main__":
  main()
