r"""The planned loop's rounds, simulated: draft-length policies on given
acceptances, in counts.

`simulate` runs in numpy the rounds `speculative_generate(gamma=rule)` runs
for a rule that only plans (`loop._planned_loop`, `adaptive.planned`), on
rows whose drafts are kept with given probabilities, and charges each round
its cost in `generate` steps. Nothing is timed: a policy is judged by its
decisions alone, at costs the caller gives, and the numbers are the same on
any machine.

A run is a batch of B rows, each to emit N tokens. Every round runs for the
whole batch, at one width, while any row is active (the loop's rounds do);
a row that is done judges and emits nothing. A round of width w:

  w >= 1     each active row judges its next drafts in order and keeps them
             while each is kept, up to w (a draft is kept with its keep
             probability, as the exact token verifier keeps it with
             probability sum_x min(p, q)). It emits the k it kept and one
             more (the residual's token or the bonus), having judged
             min(k + 1, w). Costs costs_W[w - 1].
  PROBE (0)  one draft judged, one token emitted (the target's 1-token pass
             has no bonus). Costs `probe`.
  STEP (-1)  an autoregressive step: one token, nothing judged. Costs 1,
             the unit.

A row stops at N tokens (what its last round emits past N is cut). A round
whose width is not its run's last round's costs `change` more (the loop
leaves one width's loop for another's); STEP rounds belong to the off
stretch their probe round began and change nothing.

Rows (where keep probabilities come from):
  `Recorded(a_BxT)`  a text per row, e.g. teacher-forced overlaps of real
    models: the draft at text position i is kept with probability
    a_BxT[b, i], and N = T. A row reads its text at the tokens it has
    emitted, so a position whose token was a residual, a bonus or a STEP's
    is never judged, and past its end no draft is kept (its last round
    judges a rejection there). Each round draws one `[B, gamma_max]` block
    of uniforms per going run, whatever its width.
  `Synthetic(alpha, tokens, ...)`  rows of acceptance alpha +- spread, in
    easy and hard stretches, each draft's keep probability optionally
    Beta-distributed about its stretch's: a stream per row that moves on
    one judged draft at a time, drawn one draft at a time. A row's last
    round keeps drafts past its N tokens as any other (the tokens are cut,
    the counts keep them).

Policies (each round's width):
  `Fixed(w)`       w every round.
  `Rule(rule)`     a `draft_length.Goodput`'s own decisions (its jitted
    `plan` and `keeps`, on the rows' counts as the loop's `RowStats` keeps
    them): a width kept while the rule keeps it; an off stretch is a PROBE
    round, then, if the rule still keeps width 0, up to probe_every - 1
    STEPs. Priced with its own costs, which may differ from those charged;
    `rule_in_steps` builds one priced exactly.
  `Oracle()`       each round the width `Goodput.remaining_time` would
    pick from each row's true keep probabilities ahead, or a STEP where
    even the best width is slower: no rule that reads only the past knows
    these. Myopic (each round planned as if every later round had its
    width), so near, not at, the best plan.
  `Estimate(...)`  `Goodput.plan` without margins or probe rounds, in
    float64, replanned every round from a running mean of each row's
    judged drafts' keep probabilities (`estimator="overlap"`), or with
    `half_life` a mean that forgets.

Other rows or policies plug in by the same two methods. Rows:
`start(runs, gamma_max, rng)` returns a stream with `ahead(pos_RxB)` (float
`[R, B, G]`, what an oracle knows) and `judge(going_R, pos_RxB,
drafts_RxB)` (each row judges up to drafts_RxB[r, b] drafts: float
`[R, B, G]` the judged drafts' keep probabilities, int `[R, B]` kept and
judged). Policies: `start(runs, batch, costs_W)` returns a planner with
`choose(View)` (int `[R]`, each run's next width) and `observe(a_RxBxG,
judged_RxB)`.

Two conventions, both kept (the synthetic-row study and the recorded-text
study each use one, and their tables reproduce draw for draw):

  lockstep    `simulate(lockstep=True)` (recorded texts) runs every run at
              once, each round drawing for every going run;
              `lockstep=False` (synthetic rows) runs them one after
              another, each run's draws following the last's in `rng`.
  speedup     `Simulated.mean_speedup`, the mean over runs of N / steps
              (a call's speedup, averaged over calls), or
              `Simulated.speedup_of_mean`, N / (mean steps)
              (all runs' tokens over all their steps).
  off rounds  `Rule` goes off with a PROBE round and STEPs, as the loop
              does; `Oracle` with STEPs alone (it needs no estimate).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decode import draft_length
from specjax.decode import state as state_lib

# Round widths other than a draft length (module doc).
STEP = -1
PROBE = 0
_NO_ROUND = -2  # a run's last width before its first round


@dataclasses.dataclass(frozen=True)
class Simulated:
  """What `simulate` counted for R runs of B rows (widths up to G).

  tokens: N, the tokens each row emitted.
  steps_R: float64 `[R]`, the `generate` steps each run's rounds cost.
  rounds_RxW: int64 `[R, G + 2]`, each run's rounds of width w in column
    w + 1 (column 0: STEP, 1: PROBE).
  changes_R: int64 `[R]`, changes of width (each charged `change`).
  accepted_RxB, verified_RxB: int64, drafts each row kept and judged.
  overlap_RxB: float64, the judged drafts' keep probabilities, summed
    (`RowStats.overlap_sum`).
  """
  tokens: int
  steps_R: np.ndarray
  rounds_RxW: np.ndarray
  changes_R: np.ndarray
  accepted_RxB: np.ndarray
  verified_RxB: np.ndarray
  overlap_RxB: np.ndarray

  def mean_speedup(self) -> float:
    """The mean over runs of N / steps: each run's speedup over `generate`,
    averaged."""
    return float(np.mean(self.tokens / self.steps_R))

  def speedup_of_mean(self) -> float:
    """N / (mean steps over runs): every run's tokens over every run's
    steps."""
    return float(self.tokens / np.mean(self.steps_R))


@dataclasses.dataclass(frozen=True)
class View:
  """What a policy reads before a round (R runs of B rows, widths up to G).

  going_R: bool `[R]`, runs with a row still active.
  active_RxB: bool, rows short of N tokens.
  remaining_RxB: int64, tokens each row may still emit (0 once done).
  accepted_RxB, verified_RxB, overlap_RxB: the rows' counts (`Simulated`).
  ahead: `() -> float64 [R, B, G]`, the keep probabilities of each row's
    next G drafts, as far as the rows know them (an oracle's knowledge).
  """
  going_R: np.ndarray
  active_RxB: np.ndarray
  remaining_RxB: np.ndarray
  accepted_RxB: np.ndarray
  verified_RxB: np.ndarray
  overlap_RxB: np.ndarray
  ahead: Callable[[], np.ndarray]


# Rows.


@dataclasses.dataclass(frozen=True, eq=False)
class Recorded:
  """Rows of recorded keep probabilities: a_BxT[b, i] for the draft at text
  position i of row b (float, in [0, 1]); each row emits T tokens."""
  a_BxT: np.ndarray

  def __post_init__(self):
    a = np.asarray(self.a_BxT, np.float64)
    if a.ndim != 2 or 0 in a.shape:
      raise ValueError(f"a_BxT must be a non-empty [B, T] array of keep "
                       f"probabilities, got shape {a.shape}.")
    if not (np.isfinite(a).all() and (a >= 0).all() and (a <= 1).all()):
      raise ValueError("a_BxT holds keep probabilities: finite, in [0, 1].")
    object.__setattr__(self, "a_BxT", a)

  @property
  def batch(self) -> int:
    return self.a_BxT.shape[0]

  @property
  def tokens(self) -> int:
    return self.a_BxT.shape[1]

  def start(self, runs: int, gamma: int, rng: np.random.Generator):
    return _RecordedStream(self.a_BxT, gamma, rng)


class _RecordedStream:
  """`Recorded`'s rows during one `simulate` call."""

  def __init__(self, a_BxT, gamma, rng):
    batch = a_BxT.shape[0]
    # Past a row's end a draft is never kept (the row is done by then).
    self._padded_BxT = np.concatenate([a_BxT, np.zeros((batch, gamma + 1))],
                                      axis=1)
    self._rows_B = np.arange(batch)
    self._gamma, self._rng = gamma, rng

  def ahead(self, pos_RxB):
    return self._padded_BxT[self._rows_B[None, :, None],
                            pos_RxB[:, :, None] + np.arange(self._gamma)]

  def judge(self, going_R, pos_RxB, drafts_RxB):
    r = np.flatnonzero(going_R)
    ahead_rxBxG = self.ahead(pos_RxB[r])
    u_rxBxG = self._rng.random(ahead_rxBxG.shape)
    kept_rxBxG = ((u_rxBxG < ahead_rxBxG)
                  & (np.arange(1, self._gamma + 1)
                     <= drafts_RxB[r][..., None]))
    # The first draft not kept (a column of False closes each row).
    k_rxB = np.argmin(np.concatenate(
        [kept_rxBxG, np.zeros(kept_rxBxG.shape[:2] + (1,), bool)], axis=2),
        axis=2)
    a_RxBxG = np.zeros(drafts_RxB.shape + (self._gamma,))
    kept_RxB = np.zeros(drafts_RxB.shape, np.int64)
    judged_RxB = np.zeros(drafts_RxB.shape, np.int64)
    a_RxBxG[r], kept_RxB[r] = ahead_rxBxG, k_rxB
    judged_RxB[r] = np.minimum(k_rxB + 1, drafts_RxB[r])
    return a_RxBxG, kept_RxB, judged_RxB


@dataclasses.dataclass(frozen=True)
class Synthetic:
  """Synthetic rows: `batch` rows of `tokens` tokens each.

  Row b keeps each draft with probability alpha_b, uniform in alpha +-
  spread (clipped to [0.01, 0.99]). With `burst`, a row's text alternates
  between easy and hard stretches (alpha_b + burst and alpha_b - burst,
  clipped; a row starts in either with probability 1/2 and each judged
  draft switches with probability `switch`), so its acceptance comes in
  runs at the same mean, as a text's easy and hard passages give it. With
  `overlap_var`, each draft's own keep probability is drawn about its
  stretch's from a Beta of that variance (the keep probability's mean
  stays the stretch's), as a text's drafts differ.

  The stream moves on one judged draft at a time: a bonus token or a STEP
  uses none of it. Draws, from `rng`: at the start, per run, the rows'
  alpha_b (uniform, even at spread 0) and their first stretches; each
  round, run by run, row by row, draft by draft until the row's first
  rejection: a uniform for the switch (even at burst 0), a Beta draw (with
  `overlap_var`), the uniform that keeps or rejects it. An oracle knows each
  row's current stretch's keep probability, not the switches or Beta draws
  ahead.
  """
  alpha: float
  tokens: int
  batch: int = 1
  spread: float = 0.0
  burst: float = 0.0
  switch: float = 0.05
  overlap_var: float = 0.0

  def __post_init__(self):
    for name in ("alpha", "spread", "burst", "switch", "overlap_var"):
      value = _checks.check_float(name, getattr(self, name))
      if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {value}.")
    _checks.check_int("tokens", self.tokens, low=1)
    _checks.check_int("batch", self.batch, low=1)

  def start(self, runs: int, gamma: int, rng: np.random.Generator):
    return _SyntheticStream(self, runs, gamma, rng)


class _SyntheticStream:
  """`Synthetic`'s rows during one `simulate` call."""

  def __init__(self, rows, runs, gamma, rng):
    self._rows, self._gamma, self._rng = rows, gamma, rng
    alpha_RxB = np.empty((runs, rows.batch))
    easy_RxB = np.empty((runs, rows.batch), bool)
    for i in range(runs):
      alpha_RxB[i] = np.clip(
          rows.alpha + rows.spread * rng.uniform(-1.0, 1.0, rows.batch),
          0.01, 0.99)
      easy_RxB[i] = rng.random(rows.batch) < 0.5
    self._alpha_RxB, self._easy_RxB = alpha_RxB, easy_RxB

  def ahead(self, pos_RxB):
    del pos_RxB  # the stream moves by judged drafts, not by position
    burst = np.where(self._easy_RxB, self._rows.burst, -self._rows.burst)
    a_RxB = np.clip(self._alpha_RxB + burst, 0.01, 0.99)
    return np.repeat(a_RxB[..., None], self._gamma, axis=2)

  def _draft(self, i, b):
    """The next judged draft's keep probability for row b of run i."""
    rows, rng = self._rows, self._rng
    if rng.random() < rows.switch:
      self._easy_RxB[i, b] = not self._easy_RxB[i, b]
    burst = rows.burst if self._easy_RxB[i, b] else -rows.burst
    a = min(max(self._alpha_RxB[i, b] + burst, 0.01), 0.99)
    if rows.overlap_var:
      # Beta with mean a and variance overlap_var (concentration kappa).
      kappa = max(a * (1.0 - a) / rows.overlap_var - 1.0, 1e-3)
      a = rng.beta(a * kappa, (1.0 - a) * kappa)
    return a

  def judge(self, going_R, pos_RxB, drafts_RxB):
    del pos_RxB
    a_RxBxG = np.zeros(drafts_RxB.shape + (self._gamma,))
    kept_RxB = np.zeros(drafts_RxB.shape, np.int64)
    judged_RxB = np.zeros(drafts_RxB.shape, np.int64)
    for i in np.flatnonzero(going_R):
      for b in np.flatnonzero(drafts_RxB[i] > 0):
        d, k = drafts_RxB[i, b], 0
        while k < d:
          a = a_RxBxG[i, b, k] = self._draft(i, b)
          if not self._rng.random() < a:
            break
          k += 1
        kept_RxB[i, b], judged_RxB[i, b] = k, min(k + 1, d)
    return a_RxBxG, kept_RxB, judged_RxB


# Policies.


class _Planner:
  """A policy during one `simulate` call: `choose` each round's width
  (int `[R]`; what it says for a run that is not going is ignored), and
  `observe` what the round judged."""

  def choose(self, view: View) -> np.ndarray:
    raise NotImplementedError

  def observe(self, a_RxBxG: np.ndarray, judged_RxB: np.ndarray) -> None:
    del a_RxBxG, judged_RxB


@dataclasses.dataclass(frozen=True)
class Fixed(_Planner):
  """Width `width` (in [1, gamma_max]) every round."""
  width: int

  def start(self, runs, batch, costs_W):
    del runs, batch
    _checks.check_int("width", self.width, low=1, high=len(costs_W))
    return self

  def choose(self, view):
    return np.full(view.going_R.shape, self.width)


@dataclasses.dataclass(frozen=True)
class Rule:
  """A `Goodput` rule that only plans, deciding as the loop does (module
  doc). A rule that reads the prompt (`prompt_prior`) starts every row from
  its `prior` here: the simulated rows have no prompt."""
  rule: draft_length.Goodput

  def start(self, runs, batch, costs_W):
    del runs, batch
    if not isinstance(self.rule, draft_length.Goodput) or (
        self.rule.stops_early):
      raise TypeError(f"rule must be a Goodput without a threshold (it plans "
                      f"each round's width before drafting), got "
                      f"{self.rule!r}.")
    if self.rule.gamma_max > len(costs_W):
      raise ValueError(f"the rule plans widths up to {self.rule.gamma_max}; "
                       f"costs_W prices only 1..{len(costs_W)}.")
    return _RulePlanner(self.rule)


@functools.partial(jax.jit, static_argnames=("rule",))
def _decisions(rule, accepted_RxB, verified_RxB, overlap_RxB, remaining_RxB,
               active_RxB):
  """(int32 `[R]` the width `rule` plans, bool `[R, W]` whether it keeps
  each width min_width..gamma_max), per run, from the rows' counts."""

  def run(accepted_B, verified_B, overlap_B, remaining_B, active_B):
    stats = state_lib.RowStats.zeros(accepted_B.shape[0], 1).replace(
        accepted=accepted_B, verified=verified_B, overlap_sum=overlap_B)
    width = draft_length.widest(rule.plan(stats, active_B, remaining_B),
                                active_B)
    return width, jnp.stack([
        rule.keeps(w, stats, active_B, remaining_B)
        for w in range(rule.min_width, rule.gamma_max + 1)])

  return jax.vmap(run)(accepted_RxB, verified_RxB, overlap_RxB,
                       remaining_RxB, active_RxB)


class _RulePlanner(_Planner):
  """`Rule` during one call: per run, the last round's width and the STEPs
  its off stretch has left."""

  def __init__(self, rule):
    self._rule = rule
    self._prev_R = self._pending_R = None

  def choose(self, view):
    rule = self._rule
    if self._prev_R is None:
      self._prev_R = np.full(view.going_R.shape, _NO_ROUND)
      self._pending_R = np.zeros(view.going_R.shape, np.int64)
    prev_R, pending_R = self._prev_R, self._pending_R
    width_R = np.full(view.going_R.shape, STEP)
    if (view.going_R & (pending_R == 0)).any():
      best_R, keeps_RxW = jax.device_get(_decisions(
          rule, jnp.asarray(view.accepted_RxB, jnp.int32),
          jnp.asarray(view.verified_RxB, jnp.int32),
          jnp.asarray(view.overlap_RxB, jnp.float32),
          jnp.asarray(view.remaining_RxB, jnp.int32),
          jnp.asarray(view.active_RxB)))
      keeps_R = keeps_RxW[np.arange(prev_R.size),
                          np.clip(prev_R - rule.min_width, 0,
                                  keeps_RxW.shape[1] - 1)]
      # After a probe round: the rest of its off stretch, if the rule
      # still keeps width 0 (decided once: STEPs judge nothing).
      if rule.min_width == 0:
        pending_R[:] = np.where((prev_R == PROBE) & keeps_R,
                                rule.probe_every - 1, pending_R)
      stay_R = (prev_R >= 1) & keeps_R
      width_R = np.where(pending_R > 0, STEP,
                         np.where(stay_R, prev_R, best_R))
    going_R = view.going_R
    pending_R[:] = np.where(going_R & (width_R == STEP), pending_R - 1,
                            pending_R)
    prev_R[:] = np.where(going_R, width_R, prev_R)
    return width_R


@dataclasses.dataclass(frozen=True)
class Oracle:
  """Each round, the width `Goodput.remaining_time` picks at the charged
  costs, from each row's true keep probabilities of its next drafts
  (`View.ahead`): a row's expected tokens from width w are
  1 + sum_{j <= w} prod_{i <= j} a_i. Or a STEP, where the most tokens a row
  has left cost less as STEPs than the best width's time."""

  def start(self, runs, batch, costs_W):
    del runs, batch
    return _OraclePlanner(np.asarray(costs_W, np.float64))


class _OraclePlanner(_Planner):

  def __init__(self, costs_W):
    self._costs_W = costs_W

  def choose(self, view):
    tokens_RxBxW = 1.0 + np.cumsum(np.cumprod(view.ahead(), axis=2), axis=2)
    left_RxB = view.remaining_RxB.astype(float)
    time_RxW = (np.max(left_RxB[..., None] / tokens_RxBxW, axis=1)
                * self._costs_W)
    width_R = np.argmin(time_RxW, axis=1) + 1
    return np.where(np.max(left_RxB, axis=1) < time_RxW.min(axis=1), STEP,
                    width_R)


@dataclasses.dataclass(frozen=True, eq=False)
class Estimate:
  """`Goodput.plan` in float64, each round, from running estimates.

  Each row's estimate is kept / judged, from the pseudo-counts `initial`
  (kept, judged: scalars, or float `[B]` per row; default `Goodput`'s
  prior 3 : 1), each judged draft adding its keep probability to kept and
  1 to judged. With `half_life` h, each judged draft first discounts both
  counts (the prior's included) by 2^(-1/h), so the estimate follows the
  text's stretches. The plan: the least (most rounds an active row still
  needs at its estimate) x (round cost) among `widths` (default every
  width), with round costs `plan_costs_W` (default the charged ones): no
  margins (`keeps`), no probe rounds, replanned every round.
  """
  half_life: float | None = None
  widths: Sequence[int] | None = None
  plan_costs_W: Sequence[float] | None = None
  initial: tuple[Any, Any] = (3.0, 4.0)

  def start(self, runs, batch, costs_W):
    gamma = len(costs_W)
    plan_W = np.asarray(costs_W if self.plan_costs_W is None
                        else self.plan_costs_W, np.float64)
    if plan_W.shape != (gamma,):
      raise ValueError(f"plan_costs_W must price widths 1..{gamma}, got "
                       f"{plan_W.shape[0]} costs.")
    allowed_W = np.ones(gamma, bool)
    if self.widths is not None:
      allowed_W = np.isin(np.arange(1, gamma + 1), self.widths)
      if not allowed_W.any():
        raise ValueError(f"widths {self.widths} hold none of 1..{gamma}.")
    keep_rate = 1.0
    if self.half_life is not None:
      half_life = _checks.check_float("half_life", self.half_life)
      if not half_life > 0:
        raise ValueError(f"half_life is in judged drafts (> 0), got "
                         f"{half_life}.")
      keep_rate = 0.5 ** (1.0 / half_life)
    kept0, judged0 = self.initial
    return _EstimatePlanner(
        np.broadcast_to(kept0, (runs, batch)).astype(float),
        np.broadcast_to(judged0, (runs, batch)).astype(float), keep_rate,
        plan_W, allowed_W)


class _EstimatePlanner(_Planner):

  def __init__(self, kept_RxB, judged_RxB, keep_rate, plan_W, allowed_W):
    self._kept_RxB, self._judged_RxB = kept_RxB, judged_RxB
    self._keep_rate, self._plan_W, self._allowed_W = (keep_rate, plan_W,
                                                      allowed_W)

  def choose(self, view):
    w_W = np.arange(1, self._plan_W.size + 1)
    alpha = np.clip(self._kept_RxB / self._judged_RxB, 0.0,
                    1.0 - 1e-9)[..., None]
    tokens_RxBxW = (1.0 - alpha ** (w_W + 1)) / (1.0 - alpha)
    left_RxB = view.remaining_RxB.astype(float)
    time_RxW = (np.max(left_RxB[..., None] / tokens_RxBxW, axis=1)
                * self._plan_W)
    time_RxW = np.where(self._allowed_W, time_RxW, np.inf)
    return np.argmin(time_RxW, axis=1) + 1

  def observe(self, a_RxBxG, judged_RxB):
    k, n = self._kept_RxB, self._judged_RxB
    for j in range(a_RxBxG.shape[2]):  # each judged draft, in order
      on = j < judged_RxB
      k = np.where(on, self._keep_rate * k + a_RxBxG[..., j], k)
      n = np.where(on, self._keep_rate * n + 1.0, n)
    self._kept_RxB, self._judged_RxB = k, n


# The simulation.


def simulate(rows, costs_W: Sequence[float], policy, runs: int,
             rng: np.random.Generator, *, probe: float | None = None,
             change: float = 0.0, lockstep: bool = True) -> Simulated:
  """`runs` simulated runs of `rows` under `policy` (module doc).

  Args:
    rows: `Recorded` or `Synthetic` (B rows of N tokens).
    costs_W: G floats > 0, a round of width w's cost in `generate` steps
      (costs_W[w - 1]); G = gamma_max, the widest round.
    policy: `Fixed`, `Rule`, `Oracle` or `Estimate`.
    runs: int >= 1.
    rng: the draws' generator (consumed as `rows` documents).
    probe: a PROBE round's cost in steps; needed where the policy plans one.
    change: steps each change of width costs (>= 0).
    lockstep: run every run at once (True), or one after another, each
      run's draws following the last's in `rng` (as one call per run).

  Returns:
    `Simulated`. The same arguments and `rng` state give the same counts.
  """
  costs_W = np.asarray(costs_W, np.float64)
  if costs_W.ndim != 1 or not costs_W.size or not (
      np.isfinite(costs_W).all() and (costs_W > 0).all()):
    raise ValueError(f"costs_W must be gamma_max >= 1 positive costs, got "
                     f"{costs_W}.")
  runs = _checks.check_int("runs", runs, low=1)
  if probe is not None:
    probe = _checks.check_float("probe", probe)
    if not probe > 0:
      raise ValueError(f"probe is a round's cost (> 0), got {probe}.")
  change = _checks.check_float("change", change)
  if change < 0:
    raise ValueError(f"change is a cost in steps (>= 0), got {change}.")
  if lockstep:
    return _simulate(rows, costs_W, policy, runs, rng, probe, change)
  parts = [_simulate(rows, costs_W, policy, 1, rng, probe, change)
           for _ in range(runs)]
  return Simulated(tokens=rows.tokens, **{
      f.name: np.concatenate([getattr(p, f.name) for p in parts])
      for f in dataclasses.fields(Simulated) if f.name != "tokens"})


def _simulate(rows, costs_W, policy, runs, rng, probe, change):
  gamma, batch, n = costs_W.size, rows.batch, rows.tokens
  stream = rows.start(runs, gamma, rng)
  planner = policy.start(runs, batch, costs_W)
  # A round's cost by width + 1: STEP, PROBE (inf: never charged unless
  # given; checked below), 1..G.
  cost_K = np.concatenate([[1.0, math.inf if probe is None else probe],
                           costs_W])
  emitted_RxB = np.zeros((runs, batch), np.int64)
  accepted_RxB = np.zeros((runs, batch), np.int64)
  verified_RxB = np.zeros((runs, batch), np.int64)
  overlap_RxB = np.zeros((runs, batch))
  steps_R = np.zeros(runs)
  rounds_RxW = np.zeros((runs, gamma + 2), np.int64)
  changes_R = np.zeros(runs, np.int64)
  last_R = np.full(runs, _NO_ROUND)
  # Every round emits a token for each active row: at most N rounds.
  for _ in range(n + 1):
    active_RxB = emitted_RxB < n
    going_R = active_RxB.any(axis=1)
    if not going_R.any():
      break
    view = View(going_R=going_R, active_RxB=active_RxB,
                remaining_RxB=np.where(active_RxB, n - emitted_RxB, 0),
                accepted_RxB=accepted_RxB, verified_RxB=verified_RxB,
                overlap_RxB=overlap_RxB,
                ahead=functools.partial(stream.ahead, emitted_RxB.copy()))
    # What a policy says for a run that is not going is moot.
    width_R = np.where(going_R, np.asarray(planner.choose(view), np.int64),
                       STEP)
    going_width = width_R[going_R]
    if ((going_width < STEP) | (going_width > gamma)).any():
      raise ValueError(f"the policy planned widths {set(going_width)}, "
                       f"outside STEP (-1), PROBE (0) and 1..{gamma}.")
    if probe is None and (going_width == PROBE).any():
      raise ValueError("the policy plans probe rounds; pass probe= (a probe "
                       "round's cost in steps).")
    # The most drafts each row may keep: a PROBE round judges one.
    drafts_RxB = np.where(active_RxB, np.where(
        width_R >= 1, width_R, (width_R == PROBE).astype(np.int64)
    )[:, None], 0)
    a_RxBxG, kept_RxB, judged_RxB = stream.judge(going_R, emitted_RxB,
                                                 drafts_RxB)
    for j in range(gamma):  # in order, as the loop adds them
      overlap_RxB = np.where(j < judged_RxB, overlap_RxB + a_RxBxG[..., j],
                             overlap_RxB)
    accepted_RxB = accepted_RxB + kept_RxB
    verified_RxB = verified_RxB + judged_RxB
    emit_RxB = np.where((width_R >= 1)[:, None], kept_RxB + 1, 1)
    emitted_RxB = np.where(active_RxB, np.minimum(n, emitted_RxB + emit_RxB),
                           emitted_RxB)
    entered_R = going_R & (width_R != STEP)
    changed_R = entered_R & (last_R != _NO_ROUND) & (width_R != last_R)
    steps_R = steps_R + np.where(changed_R, change, 0.0)
    steps_R = steps_R + np.where(going_R, cost_K[width_R + 1], 0.0)
    last_R = np.where(entered_R, width_R, last_R)
    changes_R += changed_R
    rounds_RxW[np.flatnonzero(going_R), going_width + 1] += 1
    planner.observe(a_RxBxG, judged_RxB)
  else:
    raise AssertionError(f"a run went on past {n} rounds of {n} tokens.")
  return Simulated(tokens=n, steps_R=steps_R, rounds_RxW=rounds_RxW,
                   changes_R=changes_R, accepted_RxB=accepted_RxB,
                   verified_RxB=verified_RxB, overlap_RxB=overlap_RxB)


# Building blocks for the policies' arguments.


def rule_in_steps(costs_W: Sequence[float], probe: float | None = None,
                  **fields) -> draft_length.Goodput:
  """A `Goodput` priced in `generate` steps: a round of width w costs
  costs_W[w - 1], a probe round `probe` (None: the rule plans none), an
  autoregressive step 1 (c = c_first = overhead = 0). With the costs
  `simulate` charges, the rule's only handicap is what it does not know:
  the keep probabilities. `fields`: more of `Goodput`'s."""
  return draft_length.Goodput(c=0.0, r=tuple(costs_W), c_first=0.0,
                              overhead=0.0, probe=probe, **fields)


def warm_rule(rule: draft_length.Goodput, alpha: float,
              judged: int = 10_000) -> draft_length.Goodput:
  """`rule.warm_start` (its default strength) from a pilot whose rows kept
  a fraction `alpha` (clipped to [0.01, 0.99]) of `judged` drafts."""
  alpha = min(max(alpha, 0.01), 0.99)
  stats = state_lib.RowStats.zeros(1, 1).replace(
      accepted=jnp.array([round(alpha * judged)], jnp.int32),
      verified=jnp.array([judged], jnp.int32))
  pilot = state_lib.GenerationResult(tokens=jnp.zeros((1, 1), jnp.int32),
                                     lengths=jnp.ones((1,), jnp.int32),
                                     stats=stats)
  return rule.warm_start(pilot)


def interpolate_costs(widths: Sequence[int], costs: Sequence[float],
                      gamma_max: int) -> np.ndarray:
  """float64 `[gamma_max]`: round costs of widths 1..gamma_max, linear
  between those given at `widths` (ascending), constant past the ends."""
  return np.interp(np.arange(1, gamma_max + 1), widths, costs)


def prompt_counts(overlap_BxK: np.ndarray,
                  window: int) -> tuple[np.ndarray, np.ndarray]:
  """(kept, judged), float64 `[B]`: `Estimate.initial` for rows that start
  from their prompts, as `Goodput.initial_counts` does with prompt_prior =
  `window` once `window` positions are scored: the mean overlap of the
  prompt's last `window` positions (of overlap_BxK's K >= window; shrunk
  by half a position each way), weighed as `window` judged drafts."""
  overlap_BxK = np.asarray(overlap_BxK, np.float64)
  window = _checks.check_int("window", window, low=1,
                             high=overlap_BxK.shape[1])
  overlap_B = (overlap_BxK[:, -window:].sum(1) + 0.5) / (window + 1.0)
  return window * overlap_B, np.full(overlap_BxK.shape[0], float(window))
