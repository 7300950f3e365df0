r"""Trains a Transformer target or draft on a byte corpus (absl entry point).

  python -m experiments.train --config=configs/train.py:tiny \
      --workdir=/tmp/specjax/tiny

See configs/train.py for the named sizes and the exact commands. All logic
lives in `specjax.train`; this file parses flags and calls `train`.
"""

from __future__ import annotations

import logging as std_logging

from absl import app
from absl import flags
from absl import logging

from specjax import distributed
from specjax import sharding
from specjax import train as train_lib
from specjax.train import trainer
from experiments import flag_checks

_CONFIG = flag_checks.define_config(
    None, "Training config file, e.g. configs/train.py:target-3m.")
flags.declare_key_flag("config")  # in --help, with this file's flags
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints and metrics.jsonl; rerunning "
    "with the same workdir resumes from its latest checkpoint.")
flags.mark_flags_as_required(["config", "workdir"])
distributed.define_flags()
flag_checks.require_results_dir("workdir", optional=True)


def _drop_library_info(record: std_logging.LogRecord) -> bool:
  # Orbax logs every phase of every save at INFO (and JAX its backend probing);
  # keep their warnings only, so the progress bar and our messages stay
  # readable.
  return (record.levelno >= std_logging.WARNING
          or not any(p in record.pathname for p in ("/orbax/", "/jax/_src/")))


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = flag_checks.loaded_config(_CONFIG)
  flag_checks.as_usage_error(trainer.check_model_config, config)
  logging.get_absl_handler().python_handler.addFilter(_drop_library_info)
  distributed.initialize_from_flags()
  # --mesh overrides config.mesh (the config is locked; pass the mesh).
  mesh = distributed.mesh_from_flags()
  if mesh is None and config.get("mesh") is not None:
    try:
      mesh = sharding.make_mesh(config.mesh)
    except ValueError as e:
      raise app.UsageError(f"--config.mesh={config.mesh}: {e}") from None
  model, metrics = train_lib.train(config, _WORKDIR.value, mesh=mesh)
  if not distributed.is_primary():
    return
  final_bpb = (metrics["eval_bpb"][max(metrics["eval_bpb"])]
               if metrics["eval_bpb"] else float("nan"))
  last_loss = (metrics["train_loss"][-1] if len(metrics["train_loss"])
               else float("nan"))
  print(f"{config.model_name}: {model.param_count():,} parameters, "
        f"step {metrics['final_step']}, train loss {last_loss:.4f} nats, "
        f"held-out bits/byte {final_bpb:.4f}, "
        f"{metrics['tokens_per_s']:,.0f} tokens/s -> {_WORKDIR.value}")

if __name__ == "__main__":
  app.run(main)
