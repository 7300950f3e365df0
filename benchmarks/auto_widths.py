r"""What width gamma="auto" drafts on each prompt: counts, no timer.

  python benchmarks/auto_widths.py RESULTS_JSONL [DRAFT] [CALLS] [SAMPLES]
      # results/adaptive_gamma/T1_b1/adaptive_gamma.jsonl
      #     distilled-draft-0.1m@target-3m 16 3

On the quick job's models (DRAFT as in `benchmarks/goodput_costs.py`), batch
1, T = 1, 64 + 128 tokens on the held-out prompts `experiments.adaptive_gamma`
uses: for each of CALLS prompts, SAMPLES samples each, the acceptance and
the draft passes per round of a `Goodput` rule priced as DRAFT's batch-1
row of RESULTS_JSONL was (its c, c_first, overhead and r; a probe at the
width-1 round's cost plus 10%), as the library builds it ("auto": each
row starts from its prompt, teacher-forced, `Goodput.prompt_prior`), with
rows from the prior's 3/4 instead ("auto no prompt"), and warm-started at
alpha .95 (strength 16), beside gamma 8. (Before `switch_cost`, this file
compared "auto before", the 5% margin without it: results/adaptive_gamma/
auto_widths.txt.) Counts only, so the numbers are the same on any machine
and can run beside other work; what the rounds cost is
`experiments.adaptive_gamma`'s to time.
"""

import dataclasses
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from configs import reproduce  # noqa: E402
from experiments import adaptive_gamma  # noqa: E402


def priced_rule(path, draft):
  """The `Goodput` rule of `draft`'s batch-1 row in the jsonl at `path`."""
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  row = next((r for r in rows if r.get("draft") == draft and r["batch"] == 1),
             None)
  if row is None:
    raise ValueError(f"{path} has no batch-1 row of draft {draft!r}.")
  width1 = row["c_first"] + row["r"][0] + row["overhead"]
  return sj.Goodput(c=row["c"], r=tuple(row["r"]), c_first=row["c_first"],
                    overhead=row["overhead"], probe=1.1 * width1)


def main():
  path = sys.argv[1]
  name = sys.argv[2] if len(sys.argv) > 2 else "distilled-draft-0.1m@target-3m"
  calls = int(sys.argv[3]) if len(sys.argv) > 3 else 16
  samples = int(sys.argv[4]) if len(sys.argv) > 4 else 3
  target, (draft,) = drafts_lib.load_models(reproduce.quick_draft(name),
                                            corpus=data.stdlib_corpus())
  auto = priced_rule(path, name)
  variants = {
      "auto": auto,
      "auto no prompt": dataclasses.replace(auto, prompt_prior=0.0),
      "auto warm .95": dataclasses.replace(auto, prior=(15.2, 0.8),
                                           prompt_prior=0.0),
      "gamma=8": 8}
  prompts_Nx1xP = adaptive_gamma.held_out_calls(calls, 1, 64)[1:]
  lengths = np.full((1,), 64, np.int32)
  sampling = sj.SamplingConfig(temperature=1.0)
  print(f"{name}, batch 1, T=1, priced as in {path}: per prompt, acceptance "
        f"and draft passes per round (mean of {samples} samples)")
  totals = {v: [] for v in variants}
  for i, prompts in enumerate(prompts_Nx1xP):
    cells = []
    for v, gamma in variants.items():
      counts = []
      for s in range(samples):
        out = sj.speculative_generate(
            target, draft.model, prompts, lengths,
            jax.random.fold_in(jax.random.key(i), s), gamma=gamma,
            max_new_tokens=128, sampling=sampling).summary()
        counts.append((out["accepted"] / max(1, out["verified"]),
                       out["draft_calls"] / out["rounds"]))
      totals[v] += counts
      alpha, drafts = np.mean(counts, axis=0)
      cells.append(f"{v} {alpha:.3f} {drafts:.2f}")
    print(f"{i:2d}  " + "  |  ".join(cells), flush=True)
  print("all " + "  |  ".join(
      f"{v} {np.mean([c[0] for c in t]):.3f} {np.mean([c[1] for c in t]):.2f}"
      for v, t in totals.items()))


if __name__ == "__main__":
  main()
