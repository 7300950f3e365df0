r"""Trains a named target or draft on the Python standard library (bytes).

The argument after the colon picks a size from `specjax/train/recipes.py`
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

Recipes (`specjax/train/recipes.py`): 2,000 AdamW steps of 32 x 256 tokens (16.4M
tokens, about half an epoch of the ~30 MB stdlib) with 100 warmup steps and
a cosine decay to 10% of the peak rate. At the throughputs measured on this
project's shared 2-core CPU box (specjax/train/recipes.py) that is about 10 min for
draft-0.1m, 20 min for draft-0.5m, 1 h for draft-2m, 1.3 h for target-3m, 4 h
for target-20m and 28 h for target-85m: the two large targets are meant for
an accelerator (the step is data parallel over all devices as is), or for a
shorter run on CPU, e.g. `--config.num_steps=300 --config.batch_size=8`.
"""

from __future__ import annotations

from ml_collections import config_dict

from specjax.train import recipes


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: a size name, optionally followed by `,runlocal`."""
  parts = (arg or "target-3m").split(",")
  size, flags_ = parts[0], set(parts[1:])
  if not flags_ <= {"runlocal"}:
    raise ValueError(f"configs/train.py argument {arg!r}: expected a size "
                     "name, optionally followed by ',runlocal'.")
  return recipes.train_config(size, runlocal="runlocal" in flags_)
