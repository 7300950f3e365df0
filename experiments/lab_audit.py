r"""The rejection-sampling lab's deterministic audit (seed 004).

Runs `specjax.lab.audit.run_audit` (named checks on the exactness oracle, then
the exact TV over a grid of 1,296 settings by default) and prints its report;
exits non-zero if any check fails. All logic lives in `specjax.lab.audit`.

  python -m experiments.lab_audit
  python -m experiments.lab_audit --certainty=3 --draft_match=0.5 --gamma=3
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

from specjax import distributed
from specjax import lab
from specjax.lab import audit
from specjax.lab import markov
from experiments import flag_checks

FLAGS = flags.FLAGS
flags.DEFINE_float("certainty", lab.DEFAULT_CERTAINTY,
                   "Default setting: sharpness of the rows, in [0, "
                   f"{markov.MAX_CERTAINTY:g}].")
flags.DEFINE_float("draft_match", lab.DEFAULT_DRAFT_MATCH,
                   "Default setting: weight of the target in the draft, [0, 1].")
flags.DEFINE_integer("gamma", 5, "Default setting: draft tokens per round.")
flags.DEFINE_float("draft_cost", 0.1,
                   "Default setting: cost of a draft step in target calls.")
flags.DEFINE_integer("seq_len", 4,
                     "Default setting: N, tokens in the exactly enumerated "
                     "sequences.")
flags.DEFINE_integer("seed", lab.DEFAULT_SEED,
                     "Default setting: model seed (also the trace seed).")
flags.DEFINE_integer("trace_tokens", lab.DEFAULT_NUM_TOKENS,
                     "Tokens in each sampled trace.")
flags.DEFINE_integer("grid_seeds", 2,
                     "Seeds per grid point; the grid has 648 * grid_seeds "
                     "settings.")
flags.DEFINE_integer("min_grid_settings", 1000,
                     "The audit fails if the grid is smaller than this.")
distributed.define_flags()

# Kept importable from here for older callers.
run_audit = audit.run_audit


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  kwargs = dict(certainty=FLAGS.certainty, draft_match=FLAGS.draft_match,
                gamma=FLAGS.gamma, draft_cost=FLAGS.draft_cost,
                seq_len=FLAGS.seq_len, seed=FLAGS.seed,
                trace_tokens=FLAGS.trace_tokens, grid_seeds=FLAGS.grid_seeds,
                min_grid_settings=FLAGS.min_grid_settings)
  # Bad flags become a usage message naming the flag, not a traceback (the
  # audit's arguments are named as its flags), before the distributed
  # runtime starts or waits for its peers.
  try:
    audit.check_arguments(**kwargs)
  except (TypeError, ValueError) as e:
    raise app.UsageError(f"--{e}") from None
  distributed.initialize_from_flags()
  if not distributed.is_primary():
    return  # a host-side numpy audit: process 0 alone
  result = audit.run_audit(**kwargs)
  print(audit.report(result))
  sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
  app.run(main)
