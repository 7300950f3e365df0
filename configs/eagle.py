r"""The EAGLE study's config: the feature-level head against token drafts.

  python -m experiments.eagle                # quick; trains what is missing
  python -m experiments.eagle --config=configs/eagle.py:target600
  python -m experiments.eagle --config=configs/eagle.py:steps1200
  python -m experiments.eagle --config=configs/eagle.py:smoke

quick      (the default; results/eagle) the quick job's target-3m
           (configs/reproduce.py:quick) and, each trained 300 steps of 16 x
           256 bytes like the quick job's distilled draft, the EAGLE head
           eagle-head@target-3m, distilled-draft-0.5m@target-3m (the head's
           size), draft-0.5m and distilled-draft-0.1m@target-3m; 64
           held-out prompts of 64 bytes, 128 new bytes each, gamma 1 and 4,
           T = 0 and 1.
target600  the same against a stronger target, trained 600 steps instead
           of 150, every draft distilled from it (results/eagle/target600).
steps1200  quick with the head and every draft trained 1,200 steps
           (results/eagle/steps1200).
smoke      quick's models on 8 prompts of 32 new bytes: seconds of decoding
           once the models are cached (results/eagle/smoke).

Fields (override any, e.g. `--config.gammas=1,2,4 --config.num_prompts=16`):
gammas and temperatures (tuples); num_prompts (held-out prompts, decoded as
one batch); prompt_len; max_new_tokens; num_steps (training steps of every
draft and of the head); target_steps (None: the quick job's 150); head_workdir
(None: the zoo's head; else the head checkpoint in that training workdir,
e.g. a zoo entry's .partial while it trains) and head_step (with
head_workdir: its checkpoint step, None for the latest); seed (prompts and
decoding keys); cache_dir (the zoo's; None: $SPECJAX_CACHE or
~/.cache/specjax); results_dir (or --results_dir).
"""

from __future__ import annotations

from ml_collections import config_dict

PRESETS = ("quick", "target600", "steps1200", "smoke")


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: one of PRESETS (default quick); see the module docstring."""
  preset = arg or "quick"
  if preset not in PRESETS:
    raise ValueError(f"configs/eagle.py argument {arg!r}: expected one of "
                     f"{', '.join(PRESETS)}.")
  c = config_dict.ConfigDict()
  c.preset = preset
  c.gammas = (1, 4)
  c.temperatures = (0.0, 1.0)
  c.num_prompts = 64
  c.prompt_len = 64
  c.max_new_tokens = 128
  # The quick job's distilled draft is trained as long (300 steps).
  c.num_steps = 300
  c.target_steps = config_dict.placeholder(int)
  c.head_workdir = config_dict.placeholder(str)
  c.head_step = config_dict.placeholder(int)
  c.seed = 0
  c.cache_dir = config_dict.placeholder(str)
  c.results_dir = "results/eagle"
  if preset == "target600":
    c.target_steps = 600
    c.results_dir = "results/eagle/target600"
  elif preset == "steps1200":
    c.num_steps = 1200
    c.results_dir = "results/eagle/steps1200"
  elif preset == "smoke":
    c.num_prompts = 8
    c.max_new_tokens = 32
    c.results_dir = "results/eagle/smoke"
  return c
