r"""Trains a named target or draft on the Python standard library (bytes).

The argument after the colon picks a size from `configs/models.py`
(draft-0.1m, draft-0.5m, draft-2m, target-3m, target-20m, target-85m) or
`tiny` (a 36K-parameter model on 300 KB, done in seconds). Append `,runlocal`
to any size for a 10-step smoke run of that model.

  python -m experiments.train --config=configs/train.py:tiny \
      --workdir=/tmp/specjax/tiny
  python -m experiments.train --config=configs/train.py:target-3m \
      --workdir=/tmp/specjax/target-3m
  python -m experiments.train --config=configs/train.py:draft-0.5m,runlocal \
      --workdir=/tmp/specjax/draft-0.5m-local

Rerunning a command with the same --workdir resumes from its latest
checkpoint. Any field can be overridden, e.g. `--config.num_steps=500`,
`--config.corpus=/path/to/texts` (files, directories or globs),
`--config.model.max_positions=512`.

Recipes (`_RECIPES` below): 2,000 AdamW steps of 32 x 256 tokens (16.4M
tokens, about half an epoch of the ~30 MB stdlib) with 100 warmup steps and
a cosine decay to 10% of the peak rate. At the throughputs measured on this
project's shared 2-core CPU box (configs/models.py) that is about 10 min for
draft-0.1m, 20 min for draft-0.5m, 1 h for draft-2m, 1.3 h for target-3m, 4 h
for target-20m and 28 h for target-85m: the two large targets are meant for
an accelerator (the step is data parallel over all devices as is), or for a
shorter run on CPU, e.g. `--config.num_steps=300 --config.batch_size=8`.
"""

from __future__ import annotations

from ml_collections import config_dict

from configs import models

# Per-size recipe: (batch_size, seq_len, peak lr, num_steps, warmup_steps).
# Smaller models take larger learning rates.
_RECIPES = {
    "draft-0.1m": (32, 256, 3e-3, 2000, 100),
    "draft-0.5m": (32, 256, 3e-3, 2000, 100),
    "draft-2m": (32, 256, 2e-3, 2000, 100),
    "target-3m": (32, 256, 1e-3, 2000, 100),
    "target-20m": (32, 256, 6e-4, 2000, 100),
    "target-85m": (32, 256, 3e-4, 2000, 100),
    "tiny": (8, 64, 3e-3, 30, 5),
}


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: a size name, optionally followed by `,runlocal`."""
  parts = (arg or "target-3m").split(",")
  size, flags_ = parts[0], set(parts[1:])
  if size not in _RECIPES or not flags_ <= {"runlocal"}:
    raise ValueError(f"configs/train.py argument {arg!r}: expected one of "
                     f"{sorted(_RECIPES)}, optionally followed by ',runlocal'.")
  batch_size, seq_len, lr, num_steps, warmup = _RECIPES[size]

  config = config_dict.ConfigDict()
  config.model_name = size
  config.model = models.model_config(size)

  # "stdlib" or comma-separated files / directories / globs of your own text.
  config.corpus = "stdlib"
  config.corpus_max_bytes = config_dict.placeholder(int)  # None: all ~30 MB
  config.heldout_fraction = 0.05

  config.seed = 0
  config.batch_size = batch_size
  config.seq_len = seq_len
  config.num_steps = num_steps

  config.optim = config_dict.ConfigDict()
  config.optim.lr = lr
  config.optim.warmup_steps = warmup
  config.optim.end_lr_ratio = 0.1
  config.optim.weight_decay = 0.1
  config.optim.b1 = 0.9
  config.optim.b2 = 0.95
  config.optim.eps = 1e-8
  config.optim.clip_norm = 1.0

  config.log_every = 10
  config.eval_every = 250           # 0 disables held-out evaluation
  config.eval_batches = 8
  config.eval_batch_size = 32
  config.eval_seed = 0              # same held-out windows for every run
  config.checkpoint_every = 250     # 0: only at the end
  config.max_to_keep = 3
  config.progress = True

  if size == "tiny":
    config.log_every = 5
    config.eval_every = 10
    config.eval_batches = 2
    config.eval_batch_size = 8
    config.checkpoint_every = 10
  if "runlocal" in flags_:
    config.num_steps = 10
    config.optim.warmup_steps = 2
    config.batch_size = min(config.batch_size, 8)
    config.log_every = 2
    config.eval_every = 5
    config.eval_batches = 1
    config.eval_batch_size = 8
    config.checkpoint_every = 5
  return config
