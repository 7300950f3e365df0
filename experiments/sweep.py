r"""Sweeps drafts x temperatures x gamma for one target; writes the results.

  python -m experiments.sweep --config=configs/reproduce.py:quick \
      --results_dir=results/quick
  python -m experiments.sweep --config=configs/adaptive_gamma.py:sweep_tiny \
      --results_dir=/tmp/specjax/adaptive_tiny

Writes into --results_dir (default: the config's): `sweep.jsonl` and
`sweep.csv` (one row per cell, the schema of `specjax.harness.sweep.run`) and
`metadata.json` (config, corpus fingerprint, jax version, device, seed, git
commit). Models come from `specjax.harness.zoo` (trained when missing). All logic is
in `specjax.harness.sweep`; this file parses flags.
"""

from __future__ import annotations

from absl import app
from absl import flags
from absl import logging

from specjax import distributed
from specjax import sharding
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
  config = flag_checks.loaded_config(_CONFIG)
  results_dir = _RESULTS_DIR.value or config.results_dir
  flag_checks.as_usage_error(sweep.check_config, config, results_dir)
  distributed.initialize_from_flags()
  # Every process runs the same sweep (SPMD); with --mesh each generation is
  # one program sharded over all processes' devices. Process 0 writes.
  with sharding.using(distributed.mesh_from_flags()):
    rows = sweep.run_config(config,
                            distributed.output_dir(results_dir),
                            distributed.dtypes_from_flags())
  if not distributed.is_primary():
    return
  print(f"{len(rows)} cells -> {results_dir}/sweep.jsonl")


if __name__ == "__main__":
  app.run(main)
