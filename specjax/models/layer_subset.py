"""Which of a Transformer's blocks a view keeps: `SelfDraft(layers=...)` and
the `ExitAdapter` made for it read the same argument."""

from __future__ import annotations

from typing import Any

import numpy as np

from specjax import _checks


def normalise_layers(layers: Any, num_layers: int | None,
                     name: str = "SelfDraft layers") -> tuple[int, ...]:
  """`layers` (an int k or block indices) as a strictly increasing tuple.

  `num_layers` None (no target at hand yet) checks all but the upper bound.
  """
  what = (f"{name} must be an int k (the first k blocks) or a sequence of "
          + ("block indices >= 0" if num_layers is None else
             f"block indices in [0, {num_layers})"))
  if isinstance(layers, (bool, np.bool_)):
    raise TypeError(f"{what}, got {layers!r}.")
  if isinstance(layers, (int, np.integer)):
    k = _checks.check_int(name, layers, low=0, high=num_layers)
    return tuple(range(k))
  if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
    raise TypeError(f"{what}, got {layers!r}.")
  top = None if num_layers is None else num_layers - 1
  try:
    kept = [int(_checks.check_int(f"{name}[i]", i, low=0, high=top))
            for i in layers]
  except TypeError as e:
    raise TypeError(f"{what}; {e}") from None
  if sorted(set(kept)) != kept:
    raise ValueError(f"{name} must be strictly increasing block indices "
                     f"(blocks run in order), got {tuple(kept)}.")
  return tuple(kept)
