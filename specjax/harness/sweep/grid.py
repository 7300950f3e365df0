"""The grid of a sweep: its cells, and the checks of its axes and configs.

A sweep measures drafts x temperatures x gamma (x verifier x batch size;
gamma may be "auto"). `plan` lays the axes out as `Cell`s in run order and
names the cells it skips, with the reason; `config_axes` reads the axes of a
sweep config (`configs/reproduce.py`, or a study's sweep preset such as
`configs/verifiers.py:sweep`). Both check every axis, naming it, and load,
decode and time nothing: a bad grid is refused in a second, before the
models it names are loaded or trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import dataclasses
from typing import Sequence

import numpy as np
from ml_collections import config_dict

from specjax import _checks
from specjax import sampling as sampling_lib
from specjax.decode import verifiers as verifiers_lib
from specjax.harness import autotune
from specjax.harness import drafts as drafts_lib


AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Cell:
  """One point of the grid. `gamma` is an int >= 1 or "auto"."""
  draft: drafts_lib.Draft
  temperature: float
  verifier: verifiers_lib.Verifier
  gamma: int | str
  batch_size: int

  @property
  def gamma_max(self) -> int:
    """The loop's static draft length: gamma, or AUTO_GAMMA_MAX for auto."""
    return autotune.AUTO_GAMMA_MAX if self.gamma == AUTO else int(self.gamma)

  def describe(self) -> dict:
    return {"draft": self.draft.name, "temperature": float(self.temperature),
            "verifier": self.verifier.spec, "gamma": self.gamma,
            "batch_size": int(self.batch_size)}


def as_axis(name: str, values, example: str) -> tuple:
  """`values` as a tuple (read once: a generator would run dry after the
  first pass of the grid's loops), refusing a bare value or a string (whose
  letters would be iterated: "token" -> 't', 'o', ...) and an empty axis.
  `name` and `example` go into the message. `io.write` reads its rows with
  it too."""
  if isinstance(values, (str, bytes, Mapping)) or not isinstance(
      values, Iterable):
    raise TypeError(f"{name} must be a sequence, e.g. {example}, got "
                    f"{values!r}.")
  values = tuple(values)
  if not values:
    raise ValueError(f"{name} is empty: give at least one, e.g. {example}.")
  return values


def _refuse_repeats(name: str, keys: Sequence, values: Sequence) -> None:
  """Each key (a value as the cell sees it: 1 and 1.0 are one temperature)
  at most once: a repeat would measure the same cell twice, and
  `figures.load_results` refuses the repeated rows."""
  seen = {}
  for key, value in zip(keys, values):
    if key in seen:
      given = ("" if repr(seen[key]) == repr(value) == repr(key) else
               f" (given as {seen[key]!r} and {value!r})")
      raise ValueError(f"{name} repeats {key!r}{given}; give each value "
                       "once.")
    seen[key] = value


def _check_gammas(gammas) -> tuple:
  gammas = as_axis("gammas", gammas, "(1, 2, 4) or (2, 'auto')")
  out = []
  for g in gammas:
    if g == AUTO:
      out.append(AUTO)
    elif isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 1:
      out.append(int(g))
    else:
      raise ValueError(f"gammas must hold ints >= 1 or 'auto', got {g!r} in "
                       f"{gammas}.")
  _refuse_repeats("gammas", out, gammas)
  return tuple(out)


def plan(drafts: Sequence[drafts_lib.Draft], *, temperatures: Sequence[float],
         gammas: Sequence[int | str], verifiers: Sequence[str] = ("token",),
         batch_sizes: Sequence[int] = (1,), num_prompts: int | None = None
         ) -> tuple[list[Cell], list[dict]]:
  """The grid's cells in run order, and the cells it skips with the reason.

  Every verifier is a registry string (`specjax.decode.verifiers`; any
  registered name works, so new verifiers join the axis without a change
  here). A cell is skipped, not run, when its combination is meaningless:
  gamma="auto" with a verifier that judges a block as a whole (block: the
  loop refuses adaptive draft lengths) or with a lossy verifier (the
  adaptive comparison is between exact decoders; a lossy+auto cell would mix
  two effects). Raises ValueError or TypeError (before any model runs),
  naming the argument, for an axis that is empty, not a sequence, or
  repeats a value (temperatures compared as floats, verifiers by their
  normalised spec, "lenient:0.50" = "lenient:0.5", drafts by name), an
  unknown verifier, a bad gamma or temperature, a draft that is not a
  `Draft`, or a batch size that does not divide num_prompts; `plan([], ...)`
  checks the axes alone.
  """
  if isinstance(drafts, (str, bytes, Mapping)) or not isinstance(
      drafts, Iterable):
    raise TypeError(f"drafts must be a sequence of Drafts (drafts.make_draft "
                    f"or drafts.wrap), got "
                    f"{drafts!r}.")
  drafts = tuple(drafts)  # iterated once per temperature and batch size
  for i, d in enumerate(drafts):
    if not isinstance(d, drafts_lib.Draft):
      raise TypeError(f"drafts[{i}] must be a Draft (drafts.wrap(name, kind, "
                      f"model)), got {type(d).__name__} {d!r}.")
  _refuse_repeats("drafts (by name)", [d.name for d in drafts],
                  [d.name for d in drafts])
  gammas = _check_gammas(gammas)
  temperatures = as_axis("temperatures", temperatures, "(1.0,)")
  for t in temperatures:
    sampling_lib.SamplingConfig(temperature=t)  # raises, naming temperature
  _refuse_repeats("temperatures", [float(t) for t in temperatures],
                  temperatures)
  verifiers = as_axis("verifiers", verifiers, "('token',)")
  specs = [verifiers_lib.get_verifier(v) for v in verifiers]
  _refuse_repeats("verifiers", [v.spec for v in specs], verifiers)
  if num_prompts is not None:
    _checks.check_int("num_prompts", num_prompts, low=1)
  batch_sizes = as_axis("batch_sizes", batch_sizes, "(1,)")
  batches = []
  for b in batch_sizes:
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
      raise ValueError(f"batch_sizes must hold ints >= 1, got {b!r}.")
    if num_prompts is not None and num_prompts % int(b):
      raise ValueError(f"batch size {b} does not divide the {num_prompts} "
                       "prompts; use num_prompts a multiple of every batch "
                       "size.")
    batches.append(int(b))
  _refuse_repeats("batch_sizes", batches, batch_sizes)
  # A grid whose every cell is skipped would load and time the models for
  # nothing, and leave no rows to write.
  if not any(g != AUTO or (v.supports_draft_length and v.exact)
             for g in gammas for v in specs):
    raise ValueError(f"every cell of gammas {gammas} x verifiers "
                     f"{tuple(v.spec for v in specs)} would be skipped: "
                     "gamma='auto' runs only with an exact verifier that "
                     "drafts token by token (e.g. 'token'); add one, or a "
                     "fixed gamma.")
  cells, skipped = [], []
  for temperature in temperatures:
    for batch in batches:
      for draft in drafts:
        for v in specs:
          for gamma in gammas:
            cell = Cell(draft, float(temperature), v, gamma, batch)
            reason = None
            if gamma == AUTO and not v.supports_draft_length:
              reason = (f"verifier {v.spec!r} judges the draft block as a "
                        "whole: no adaptive draft length")
            elif gamma == AUTO and not v.exact:
              reason = (f"verifier {v.spec!r} is lossy: gamma='auto' is "
                        "compared among exact verifiers only")
            if reason:
              skipped.append({**cell.describe(), "reason": reason})
            else:
              cells.append(cell)
  return cells, skipped


# Fields a sweep's config must hold (the sweep and `drafts.load_models` read
# them); `config_axes` names any that is missing.
_CONFIG_FIELDS = ("target", "target_overrides", "cache_dir", "drafts",
                  "temperatures", "gammas", "num_prompts", "prompt_len",
                  "max_new_tokens", "seed", "step_seconds", "step_repeats")


def config_axes(config) -> dict:
  """Raises, naming the field, for a bad sweep ConfigDict (with
  `configs/reproduce.py`'s fields); returns the grid's axes (`plan`'s
  keyword arguments but num_prompts).

  Checks every field `run_config` reads, each axis (through `plan`, with no
  drafts) and each draft spec (`drafts.check_config_drafts`), without loading
  a model: the config alone is read.
  """
  if not isinstance(config, config_dict.ConfigDict):
    raise TypeError("config must be a sweep ConfigDict (configs/"
                    "reproduce.py's get_config(preset), or a study's sweep "
                    f"preset), got {type(config).__name__}.")
  missing = [f for f in _CONFIG_FIELDS if f not in config]
  if missing:
    raise ValueError(f"config lacks the field(s) {missing}: it is not a "
                     "sweep config; use configs/reproduce.py:<preset>, or a "
                     "study's sweep preset (configs/verifiers.py:sweep, "
                     "configs/adaptive_gamma.py:sweep).")
  for name in ("num_prompts", "prompt_len", "max_new_tokens", "step_repeats",
               "call_repeats"):
    _checks.check_int(f"config.{name}", config.get(name, 1), low=1)
  _checks.check_int("config.seed", config.seed, low=0)
  if _checks.check_float("config.step_seconds", config.step_seconds) <= 0:
    raise ValueError("config.step_seconds (the time each timed loop aims at) "
                     f"must be > 0, got {config.step_seconds}.")
  axes = dict(temperatures=config.temperatures, gammas=config.gammas,
              verifiers=config.get("verifiers", ("token",)),
              batch_sizes=config.get("batch_sizes", (1,)))
  try:
    plan([], num_prompts=config.num_prompts, **axes)
  except TypeError as e:  # plan names the argument: here, the config field
    raise TypeError(f"config: {e}") from None
  except ValueError as e:
    raise ValueError(f"config: {e}") from None
  drafts_lib.check_config_drafts(config.drafts)
  return axes
