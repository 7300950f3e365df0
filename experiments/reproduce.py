r"""The main job: train or load the models, sweep, draw every figure and table.

  python -m experiments.reproduce                     # quick, 8-11 min, 2 cores
  python -m experiments.reproduce --config=configs/reproduce.py:full
  python -m experiments.reproduce --config=configs/verifiers.py:sweep

The config (configs/reproduce.py, or a study's sweep preset) says which
models and grid; flags beside --config: --results_dir (default:
config.results_dir), and the distributed and dtype flags of
`specjax.distributed`.

Writes into the config's results_dir (results/quick by default): the sweep
(sweep.jsonl, sweep.csv, metadata.json), the figures (fig_*.png / .pdf), the
Table 3 layout (table3.md) and summary.txt, and prints the summary.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
from absl import logging

from specjax import distributed
from specjax import sharding
from specjax.harness import figures
from specjax.harness import sweep
from experiments import flag_checks

_CONFIG = flag_checks.define_config(
    "reproduce.py:quick", "The sweep's config: configs/reproduce.py:quick, "
    "full or tiny, or a study's sweep (configs/verifiers.py:sweep, "
    "configs/adaptive_gamma.py:sweep).")
flags.declare_key_flag("config")  # in --help, with this file's flags
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", None, "Output directory (default: config.results_dir).")
distributed.define_flags()
distributed.define_dtype_flags()
flag_checks.require_results_dir(optional=True)


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  start = time.time()
  config = flag_checks.loaded_config(_CONFIG)
  results_dir = _RESULTS_DIR.value or config.results_dir
  flag_checks.as_usage_error(sweep.check_config, config, results_dir)
  distributed.initialize_from_flags()
  # SPMD: every process sweeps (sharded over --mesh); process 0 writes.
  with sharding.using(distributed.mesh_from_flags()):
    sweep.run_config(config, distributed.output_dir(results_dir),
                     distributed.dtypes_from_flags())
  if not distributed.is_primary():
    return
  written = figures.make_all(results_dir)
  with open(f"{results_dir}/summary.txt") as fh:
    print(fh.read())
  print("wrote:\n  " + "\n  ".join(written))
  print(f"reproduce ({config.preset}) finished in "
        f"{(time.time() - start) / 60:.1f} min")


if __name__ == "__main__":
  app.run(main)
