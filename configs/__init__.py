"""ml_collections configs (`get_config(arg)`), one file per experiment.

  reproduce.py       the main job (experiments.reproduce, experiments.sweep)
  train.py           one model's training (experiments.train)
  verifiers.py       the verifier study (experiments.verifiers), and its
                     sweep grid (experiments.reproduce / experiments.sweep)
  adaptive_gamma.py  gamma="auto" against fixed gammas
                     (experiments.adaptive_gamma), and its sweep grid
  eagle.py           the EAGLE head against token drafts (experiments.eagle)

Each file's docstring holds the commands that run its presets.
"""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def path(spec: str) -> str:
  """`spec` ('reproduce.py:quick') as a path `--config` takes from any
  working directory: this package's file, wherever it is installed."""
  if not isinstance(spec, str) or not spec.split(":")[0].endswith(".py"):
    raise ValueError(f"spec must name a config file of this package with an "
                     f"optional preset, e.g. 'reproduce.py:quick'; got "
                     f"{spec!r}.")
  return os.path.join(_HERE, spec)
