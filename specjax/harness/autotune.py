"""Goodput rules priced on this machine: the explicit step before
`speculative_generate(..., gamma=rule)`.

The decoder never times itself. A `Goodput` rule holds a round's costs in
units of one target pass; this module measures them on the loop's own
shapes (`specjax.harness.measure`) and returns the rule, which the caller
passes as `gamma=`:

  rule = autotune.auto_rule(target, draft, prompts, lengths,
                            max_new_tokens=128)
  out = specjax.speculative_generate(target, draft, prompts, lengths, key,
                                     gamma=rule, max_new_tokens=128)

`auto_rule` is what `gamma="auto"` means in the sweep and on the command
line (`experiments.generate --gamma=auto`): `measure_goodput` at the call's
batch size and shapes, planning `doubling_widths(AUTO_GAMMA_MAX)`. Both
memoise per process: a second call at the same shapes measures nothing.

For a device this host cannot time, `roofline_goodput` (and `auto_rule(...,
device=...)`, `experiments.generate --gamma=auto --plan_device=...`) prices
the same rule from the roofline of each pass (`specjax.harness.roofline`)
instead: bytes and FLOPs at the device's bandwidth and peak.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
import warnings

import numpy as np

from specjax import _checks
from specjax import sampling as sampling_lib
from specjax.decode import draft_length
from specjax.decode import validation
from specjax.decode import verifiers as verifiers_lib
from specjax.decode.draft_length import Goodput
from specjax.harness import measure
from specjax.harness import roofline

# gamma="auto": the rule's largest draft length. It plans widths 1, 2, 4,
# ... up to it (`doubling_widths`).
AUTO_GAMMA_MAX = 8

# The relative margin `measure_goodput` gives a batch of more than one row,
# on top of `switch_cost`: the width a batch should run moves with its
# slowest rows, whose acceptance estimates are noisy.
BATCHED_HYSTERESIS = 0.02

# A pass on t tokens costs at most t passes on 1 token (it could be run as
# t of them), up to this factor for timing noise.
_SUBADDITIVE_SLACK = 1.5

# (target, draft, shape, threshold, sampling, calibrate, widths) -> Goodput
_MEASURED: dict[Any, Goodput] = {}


def doubling_widths(gamma_max: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to `gamma_max`, and `gamma_max`: the widths
  gamma="auto" plans (`Goodput.widths`)."""
  gamma_max = draft_length._check_gamma_max(gamma_max)  # pylint: disable=protected-access
  return tuple(sorted({1 << k for k in range(gamma_max.bit_length())}
                      | {gamma_max}))


def monotone_fit(values, low: float = 0.0) -> tuple[float, ...]:
  """The non-decreasing sequence nearest `values` in least squares (pool
  adjacent violators), each at least `low`.

  Timed costs of wider rounds must not fall, but a noisy timing can. A
  running maximum would let one slow timing lift every wider width to it;
  pooling averages a violator with its neighbours instead, so one outlier
  moves the fit by its share. Host-side floats, for measured costs.
  """
  blocks: list[list[float]] = []  # [mean, count] of each pooled run
  for x in values:
    blocks.append([float(x), 1.0])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
      blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
  return tuple(max(m, low) for m, n in blocks for _ in range(int(n)))


def measure_goodput(target, draft, *, batch_size: int, gamma_max: int = 8,
                    prompt_len: int = 64, max_new_tokens: int = 128,
                    threshold: float | None = None, sampling: Any = None,
                    seconds: float = 0.05, repeats: int = 3,
                    calibrate: bool = True,
                    widths: Any = None) -> Goodput:
  """A `Goodput` rule with every cost measured on the loop's own shapes.

  The shapes are those `speculative_generate(..., gamma=<rule with
  gamma_max>)` builds for `batch_size` rows of `prompt_len` tokens and
  `max_new_tokens` new ones (`measure.LoopShape`: prompt bucket, cache
  capacity, a fill from the middle of the generation). Timed with
  `specjax.harness.measure`: the draft's first pass (2 tokens, or 1 when it
  shares the target's cache) and its 1-token pass (`pass_seconds`), the
  round's work outside the passes (`null_loop_seconds`, the fixed-gamma_max
  loop with null models), and the target's passes; target pass times that
  break subadditivity are retimed (`_target_passes`).

  With `calibrate` (the default, and what `auto_rule` uses) every width's
  round is priced by the loop's own round of that width, in `generate`
  steps (`measure.loop_round_steps`): r takes up the difference, and the
  probe round is scaled as the width-1 round is. Without a threshold each
  width is timed as the rule's own loop pinned at that width
  (`draft_length.pinned`): one compile for every width, on these shapes,
  which a call with the returned rule then reuses. (With a threshold the
  rule's loop is not one of fixed-width rounds, and gamma_max fixed-gamma
  loops are compiled and timed instead.) With `calibrate=False` the verify
  passes on 2..gamma_max + 1 tokens are timed alone instead: cheaper, but
  passes timed alone miss what the loop's rounds cost, in level and in
  shape.

  With `widths` (a subset of 1..gamma_max, `Goodput.widths`), the rule
  plans only those. Calibrated, only their rounds are timed, and r at the
  other widths is interpolated between them (it is not read).

  Its `hysteresis` is the default (none) at batch 1 and
  `BATCHED_HYSTERESIS` above, where the rows the batch waits for move;
  `switch_cost` is the default at every batch.

  Without a threshold the rule may plan off stretches (width 0): a probe
  round, costed as the first draft pass plus a 1-token target pass plus
  the round's other work, then autoregressive steps (a 1-token pass plus
  that work). Memoised per (model structures, batch, gamma_max, shapes,
  threshold, sampling, calibrate, widths) for this process.
  """
  # pylint: disable=protected-access
  validation.check_pair(target, draft)
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  gamma_max = draft_length._check_gamma_max(gamma_max)
  seconds, repeats = measure.check_timing(seconds, repeats)
  sampling = sampling_lib.SamplingConfig() if sampling is None else sampling
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError(f"sampling must be a specjax.SamplingConfig, got "
                    f"{sampling!r}.")
  shape = measure.LoopShape(batch_size, prompt_len, max_new_tokens, gamma_max)
  if not isinstance(calibrate, bool):
    raise TypeError(f"calibrate must be a bool, got {calibrate!r}.")
  widths = draft_length._check_widths(widths, gamma_max)
  timed_widths = widths or tuple(range(1, gamma_max + 1))
  key = (measure.model_key(target), measure.model_key(draft), shape,
         draft_length._check_threshold(threshold), sampling, calibrate, widths)
  # pylint: enable=protected-access
  if key not in _MEASURED:
    def measured(**costs):
      """The rule at these costs, with the structure of this measurement."""
      return _rule(draft, batch_size=batch_size, gamma_max=gamma_max,
                   threshold=threshold, widths=widths, **costs)

    def times(model, widths):
      # Interleaved: every width sees the same spells of a noisy machine.
      capacity = shape.capacity(model)
      return measure.passes_seconds(
          model, batch_size=batch_size, capacity=capacity,
          passes=[(min(t, capacity), shape.fill(model, t)) for t in widths],
          seconds=seconds, repeats=repeats)
    # Calibrated, the loop's rounds price every width; the passes alone
    # only price the probe round, scaled as the narrowest timed round is.
    narrowest = timed_widths[0]
    base, *verify = _target_passes(
        lambda: times(target, range(1, (narrowest if calibrate else gamma_max)
                                    + 2)))
    # A monotone fit keeps a noisy timing from producing an inverted ratio
    # without letting one slow timing price every wider round.
    r = [1.0, *monotone_fit([t / base for t in verify], low=1.0)]
    # A draft sharing the target's cache feeds 1 token first, else 2.
    shares = bool(getattr(draft, "reads_target_cache", False))
    one, *two = times(draft, (1,) if shares else (1, 2))
    c = max(one / base, 1e-3)
    c_first = max(two[0] / base, c) if two else c
    other, _ = measure.null_loop_seconds(target, draft, shape, sampling,
                                         repeats=repeats)
    overhead = other / base
    probe = c_first + 1.0 + overhead
    if calibrate:
      step = 1.0 + overhead  # a `generate` step, in 1-token target passes
      # The narrowest timed round, its passes timed alone.
      alone = c_first + (narrowest - 1) * c + r[narrowest] + overhead
      # Passes timed alone do not cost what the loop's rounds do (fusion,
      # the round's control flow, cache traffic), so every width is priced
      # by the loop's own round of that width. A rule that only plans is
      # timed as its own loop pinned at each width (`pinned` sets the
      # costs): one compile for every width, which the call that asked for
      # the rule then reuses.
      in_loop = measure.loop_round_steps(
          target, draft, shape, sampling, widths=timed_widths,
          repeats=repeats, rule=None if threshold is not None else measured(
              c=c, r=[1.0] * gamma_max, c_first=c_first, overhead=overhead,
              probe=probe))
      fit = monotone_fit(
          [steps * step - c_first - (g - 1) * c - overhead
           for g, steps in zip(timed_widths, in_loop)], low=1.0)
      # Widths outside `widths` are never planned; interpolated, r stays
      # non-decreasing.
      r = [1.0, *np.interp(np.arange(1, gamma_max + 1), timed_widths, fit)]
      # The probe round is a width-1 round with a 1-token verify: scaled as
      # the narrowest timed round is.
      probe *= in_loop[0] * step / alone
    _MEASURED[key] = measured(c=c, r=r[1:], c_first=c_first,
                              overhead=overhead, probe=probe)
  return _MEASURED[key]


def _rule(draft, *, batch_size, gamma_max, threshold, widths, r, probe,
          **costs) -> Goodput:
  """A priced `Goodput` rule for `draft` at `batch_size`: probe rounds only
  without a threshold, `BATCHED_HYSTERESIS` above one row, and a probe
  every off round for a draft that reads the target's features."""
  return Goodput(
      r=tuple(r), gamma_max=gamma_max, threshold=threshold,
      probe=None if threshold is not None else probe, widths=widths,
      **costs,
      **({"hysteresis": BATCHED_HYSTERESIS} if batch_size > 1 else {}),
      **({"probe_every": 1}
         if getattr(draft, "reads_target_features", False) else {}))


def _target_passes(timed, attempts: int = 3) -> list[float]:
  """The target's pass times on 1, 2, ... tokens from `timed()`, retimed
  while they break subadditivity (a pass on t tokens timed at more than
  `_SUBADDITIVE_SLACK` t single-token passes). Each time is a difference of
  two timings (`measure.passes_seconds`), so one disturbed timing can move
  the 1-token pass, the unit of every cost, against the others, and a rule
  priced from it plans off stretches where speculation pays. Warns if
  every attempt breaks it, and then keeps the attempt that broke it least."""
  tries = []
  for _ in range(attempts):
    seconds = timed()
    base = seconds[0]
    worst = (math.inf if base <= 0 else max(
        s / (t * base) for t, s in enumerate(seconds, start=1)))
    tries.append((worst, seconds))
    if worst <= _SUBADDITIVE_SLACK:
      return seconds
  worst, seconds = min(tries, key=lambda x: x[0])
  if not math.isfinite(worst):
    raise RuntimeError("measure_goodput timed the target's 1-token pass at "
                       "0 s in every attempt; the timer cannot price a round "
                       "on this machine now. Pass gamma=<int> instead of "
                       "'auto', or retry on a quieter machine.")
  warnings.warn(
      f"measure_goodput: the target's pass times break subadditivity in "
      f"{attempts} attempts (a pass on t tokens at up to {worst:.2f} t "
      f"single-token passes); the machine is likely busy, and gamma='auto' "
      f"may plan poorly. Pass gamma=<int>, or retry on a quieter machine.",
      RuntimeWarning, stacklevel=3)
  return seconds


def _roofline_seconds(model, device, *, batch_size: int, num_tokens: int,
                      capacity: int) -> float:
  """The roofline time on `device` of one pass of `model`: the analytic
  count where there is one (`roofline.has_analytic_count`), else XLA's
  cost analysis of the pass on this host."""
  try:
    cost = roofline.count(model, batch_size=batch_size,
                          num_tokens=num_tokens, capacity=capacity)
  except (TypeError, ValueError) as e:
    raise ValueError(
        f"roofline_goodput cannot count a pass of {type(model).__name__} "
        f"({e}); plan this pair with measure_goodput on a machine that "
        f"runs it, or pass an int gamma.") from e
  return device.seconds(cost)


def roofline_goodput(target, draft, device: roofline.Device | str, *,
                     batch_size: int, gamma_max: int = 8,
                     prompt_len: int = 64, max_new_tokens: int = 128,
                     threshold: float | None = None,
                     overhead_seconds: float = 0.0,
                     widths: Any = None) -> Goodput:
  """A `Goodput` rule priced by the roofline of `device`, timing nothing.

  For a device this host cannot time (a GPU or TPU named in
  `roofline.ACCELERATORS`, or any `roofline.Device`): every pass the rule
  prices is its bytes and FLOPs (`roofline.pass_cost`, or XLA's count for a
  model without an analytic one) at the shapes `speculative_generate`
  builds for `batch_size` rows of `prompt_len` tokens and `max_new_tokens`
  new ones, at `device`'s read bandwidth and peak
  (`roofline.Device.seconds`). Costs are in units of the target's 1-token
  pass, as `measure_goodput`'s are: c and c_first are the draft's 1-token
  pass and its first pass (2 tokens, or 1 when it shares the target's
  cache), r[g - 1] the target's pass on g + 1 tokens, and `overhead` is
  `overhead_seconds` (a round's work outside the passes, on `device`; 0
  unless you know it) over the target's 1-token pass.

  The bytes are those of the models as given (their own dtype): to plan a
  bfloat16 deployment, pass bfloat16 models. A roofline is a lower bound
  on each pass, and a pass far from its bound (a tiny model, where fixed
  per-pass costs dominate) is priced as cheaper than it is.

  Args:
    target, draft: the pair the rule is for.
    device: a `roofline.Device`, or a name in `roofline.ACCELERATORS`.
    batch_size, gamma_max, prompt_len, max_new_tokens, threshold, widths:
      as `measure_goodput`.
    overhead_seconds: a round's work outside the model passes on `device`
      (>= 0).
  """
  # pylint: disable=protected-access
  validation.check_pair(target, draft)
  device = roofline.get_device(device)
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  gamma_max = draft_length._check_gamma_max(gamma_max)
  widths = draft_length._check_widths(widths, gamma_max)
  threshold = draft_length._check_threshold(threshold)
  # pylint: enable=protected-access
  if (isinstance(overhead_seconds, bool)
      or not isinstance(overhead_seconds, (int, float))
      or not math.isfinite(overhead_seconds) or overhead_seconds < 0):
    raise ValueError(f"overhead_seconds must be a finite number >= 0 (a "
                     f"round's work outside the passes, in seconds), got "
                     f"{overhead_seconds!r}.")
  shape = measure.LoopShape(batch_size, prompt_len, max_new_tokens, gamma_max)

  def seconds(model, num_tokens):
    return _roofline_seconds(model, device, batch_size=batch_size,
                             num_tokens=num_tokens,
                             capacity=shape.capacity(model))
  base = seconds(target, 1)
  r = [seconds(target, g + 1) / base for g in range(1, gamma_max + 1)]
  c = max(seconds(draft, 1) / base, 1e-3)  # as measure_goodput floors it
  shares = bool(getattr(draft, "reads_target_cache", False))
  c_first = c if shares else max(seconds(draft, 2) / base, c)
  overhead = overhead_seconds / base
  return _rule(draft, batch_size=batch_size, gamma_max=gamma_max,
               threshold=threshold, widths=widths, r=r, c=c, c_first=c_first,
               overhead=overhead, probe=c_first + 1.0 + overhead)


def auto_rule(target, draft, prompts, prompt_lengths, *,
              max_new_tokens: int,
              sampling: sampling_lib.SamplingConfig | None = None,
              verifier: str | verifiers_lib.Verifier = "token",
              gamma_max: int | None = None,
              device: roofline.Device | str | None = None) -> Goodput:
  """What gamma="auto" means: a `Goodput` rule for these prompts, priced
  on this machine (or from `device`'s roofline), to pass as
  `speculative_generate(..., gamma=rule)`.

  `measure_goodput` at the batch's size, its longest prompt and
  `max_new_tokens`, planning `doubling_widths(gamma_max)` (default
  `AUTO_GAMMA_MAX`): the costs at the middle of the generation, at this
  batch size. Under a verifier that does not keep a draft with probability
  sum_x min(p, q) the rule estimates acceptance from kept drafts
  (`Goodput.estimator="accepted"`). Memoised per shapes, as
  `measure_goodput` is.

  Args:
    target, draft, prompts, prompt_lengths, max_new_tokens, sampling,
      verifier: as the `speculative_generate` call the rule is for.
    gamma_max: the rule's largest draft length (None: `AUTO_GAMMA_MAX`).
    device: None to time this machine (`measure_goodput`), or a device to
      plan for from its roofline without timing (`roofline_goodput`): a
      `roofline.Device` or a name in `roofline.ACCELERATORS`.
  """
  verifier = verifiers_lib.get_verifier(verifier)
  if not verifier.supports_draft_length:
    raise ValueError(
        f"verifier={verifier.spec!r} judges a draft block as a whole and "
        "cannot run with an adaptive draft length (gamma='auto' or a "
        "draft-length rule); use an int gamma, or verifier='token'.")
  gamma_max = draft_length._check_gamma_max(  # pylint: disable=protected-access
      AUTO_GAMMA_MAX if gamma_max is None else gamma_max)
  prompts = np.asarray(prompts)
  if prompts.ndim != 2:
    raise ValueError(f"prompts must be int [B, P], got shape "
                     f"{prompts.shape}.")
  lengths = np.asarray(prompt_lengths)
  if lengths.shape != prompts.shape[:1] or not lengths.size:
    raise ValueError(f"prompt_lengths must be int [B] with B = "
                     f"{prompts.shape[0]} rows, got shape {lengths.shape}.")
  shapes = dict(batch_size=prompts.shape[0], gamma_max=gamma_max,
                prompt_len=int(np.max(lengths)),
                max_new_tokens=max_new_tokens,
                widths=doubling_widths(gamma_max))
  if device is None:
    rule = measure_goodput(target, draft, sampling=sampling, **shapes)
  else:
    rule = roofline_goodput(target, draft, device, **shapes)
  if not verifier.keeps_with_overlap:
    rule = dataclasses.replace(rule, estimator="accepted")
  return rule
