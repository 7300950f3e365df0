"""The optimizer: AdamW with linear warmup, cosine decay and gradient clipping.

One function, `make_optimizer(optim_config, num_steps)`, so the language-model
trainer and draft distillation build the same optimizer from the same config
block (`config.optim` in `configs/train.py`):

  lr              peak learning rate, reached after `warmup_steps` updates.
  warmup_steps    linear warmup from 0 (an integer >= 0).
  end_lr_ratio    the cosine decay ends at `lr * end_lr_ratio` at `num_steps`.
  weight_decay    decoupled (AdamW) decay, applied to matrices only (rank >= 2:
                  kernels and embedding tables); biases and norm scales are
                  not decayed, as in GPT-2 / nanoGPT.
  b1, b2, eps     Adam moments.
  clip_norm       clip the global gradient norm to this before Adam (<= 0
                  disables clipping).

The schedule reads the optimizer's own update count, which is part of the
optimizer state and therefore of every checkpoint: a resumed run continues the
schedule exactly where it stopped.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from specjax import _checks

OPTIM_FIELDS = ("lr", "warmup_steps", "end_lr_ratio", "weight_decay", "b1",
                "b2", "eps", "clip_norm")


def make_schedule(optim_config: Any, num_steps: int) -> Callable[[Any], Any]:
  """Learning rate as a function of the update count: warmup, then cosine.

  Args:
    optim_config: a ConfigDict (or any object) with the fields listed in the
      module docstring.
    num_steps: total number of updates of the run; the cosine reaches
      `lr * end_lr_ratio` there (and stays there if training continues).

  Returns:
    `schedule(count) -> lr`, traceable.
  """
  num_steps = _checks.check_int("config.num_steps", num_steps, low=1)
  lr = _checks.check_float("config.optim.lr", optim_config.lr)
  if lr <= 0:
    raise ValueError(f"config.optim.lr must be > 0, got {lr}.")
  warmup = _checks.check_int("config.optim.warmup_steps",
                             optim_config.warmup_steps, low=0)
  if warmup >= num_steps:
    raise ValueError(
        f"config.optim.warmup_steps ({warmup}) must be smaller than "
        f"config.num_steps ({num_steps}); lower the warmup or train longer.")
  ratio = _checks.check_float("config.optim.end_lr_ratio",
                              optim_config.end_lr_ratio)
  if not 0.0 <= ratio <= 1.0:
    raise ValueError(
        f"config.optim.end_lr_ratio must be in [0, 1], got {ratio}.")
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=lr, warmup_steps=warmup,
      decay_steps=num_steps, end_value=lr * ratio)


def _decay_mask(params):
  # Matrices only: decaying LayerNorm scales towards 0 (rather than 1) and
  # biases hurts small models and is what GPT-2-style recipes avoid.
  return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(optim_config: Any, num_steps: int
                   ) -> tuple[optax.GradientTransformation, Callable]:
  """AdamW + warmup/cosine schedule + global-norm clipping.

  Args:
    optim_config: the `config.optim` block (fields in the module docstring).
    num_steps: total number of updates (the length of the cosine).

  Returns:
    `(optimizer, schedule)`: an optax transformation whose state holds the
    update count the schedule reads, and the schedule itself (for logging).
  """
  missing = [f for f in OPTIM_FIELDS if not hasattr(optim_config, f)]
  if missing:  # a dict or a partial ConfigDict: attribute reads below
    raise TypeError(f"optim_config must be the config.optim block with fields "
                    f"{OPTIM_FIELDS}; {type(optim_config).__name__} lacks "
                    f"{missing}.")
  schedule = make_schedule(optim_config, num_steps)
  for name in ("weight_decay", "b1", "b2", "eps", "clip_norm"):
    _checks.check_float(f"config.optim.{name}", getattr(optim_config, name))
  if not (0.0 <= optim_config.b1 < 1.0 and 0.0 <= optim_config.b2 < 1.0):
    raise ValueError("config.optim.b1 and b2 must be in [0, 1), got "
                     f"{optim_config.b1}, {optim_config.b2}.")
  if optim_config.weight_decay < 0 or optim_config.eps <= 0:
    raise ValueError("config.optim.weight_decay must be >= 0 and eps > 0, got "
                     f"{optim_config.weight_decay}, {optim_config.eps}.")
  adamw = optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2,
                      eps=optim_config.eps,
                      weight_decay=optim_config.weight_decay, mask=_decay_mask)
  # Always a two-stage chain (identity when clipping is off), so the state
  # structure, and hence the checkpoint layout, does not depend on clip_norm.
  clip = (optax.clip_by_global_norm(optim_config.clip_norm)
          if optim_config.clip_norm > 0 else optax.identity())
  # Clipping first, so Adam sees the clipped gradient (nanoGPT order).
  return optax.chain(clip, adamw), schedule
