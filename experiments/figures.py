r"""Redraws every figure and table from a results directory.

  python -m experiments.figures --results_dir=results/quick

See `specjax.harness.figures` for what is drawn; this file parses the flag and prints
the summary.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags

from specjax import distributed
from specjax.harness import figures
from experiments import flag_checks

_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", "results/quick", "Directory holding sweep.jsonl and "
    "metadata.json; the figures and tables are written there too.")
distributed.define_flags()


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.initialize_from_flags()
  if not distributed.is_primary():
    return  # drawing is host work: process 0 alone
  try:  # a missing or corrupt results file: the message names it
    figures.load_results(_RESULTS_DIR.value)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(f"--results_dir={_RESULTS_DIR.value}: {e}") from None
  paths = figures.make_all(_RESULTS_DIR.value)
  with open(os.path.join(_RESULTS_DIR.value, "summary.txt"),
            encoding="utf-8") as fh:
    print(fh.read())
  print("Wrote:\n  " + "\n  ".join(paths))


if __name__ == "__main__":
  app.run(main)
