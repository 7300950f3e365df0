"""Adaptive draft length: rules that stop a row's drafting early, inside the loop.

A rule is a frozen, hashable dataclass (a static argument of the compiled
generation). Each round, with `gamma_max` static:

1. `rule.plan(stats, active_B, remaining_B)` gives each row a budget `g_B`
   in [1, gamma_max] from the past only (the rows' `RowStats` and the tokens
   each may still generate).
2. The draft proposes tokens one at a time; after the i-th (i = 1, 2, ...)
   with distribution `q_BxV` and token `x_B`, `rule.stop(i, q_BxV, x_B)`
   says which rows stop at i. A row's draft length is the first i at which it
   stops or reaches its budget, else gamma_max. Drafting ends when every
   active row has stopped, so the draft runs `W = max_b g_b` passes.
3. The target scores `[last, x_1..x_W]` in one pass of static width W + 1
   (one compiled branch per W) and row b keeps at most its first `g_b`
   drafts. If it keeps all of them and `g_b < W`, its last token is the
   coupled output at position g_b + 1 (x_{g_b+1} if kept, else the residual
   draw), which is distributed as p there whatever q was: x_{g_b+1} was drawn
   from q after the row's stopping decision, independently of it.

Why this stays exact: a round's output is an exact sample from the target
given anything decided before the verify draws, as long as each draft token
is drawn from the q it reports and the decision to stop at g does not read
x_{g+1} (or anything the target computed this round). `plan` reads only past
rounds, `stop` only the draft's own outputs up to x_i. `specjax.lab.stopping`
checks this by exact enumeration, with a rule that peeks at x_{g+1} as the
negative control.

Rules:
  `Confidence(threshold, gamma_max)`: stop after a draft whose max q is below
    `threshold` (the draft is unsure; the next token is likely rejected).
  `Goodput(c, r, gamma_max, c_first=, overhead=)`: a per-row budget
    maximising expected tokens per unit time,

      (1 - a^(g+1)) / (1 - a) / (c_first + (g - 1) c + r_g + overhead),

    the denominator being one round of the loop in units of a target pass on
    1 token: the draft's first pass (c_first: the 2-token catch-up window of a
    draft with its own cache, 1 token for one that shares the target's),
    g - 1 further draft passes (c), the verify pass on g + 1 tokens (r_g)
    and the round's work outside the passes (overhead: RNG, sampling,
    coupling, commit, loop control). a is the row's running acceptance
    estimate (kept + a0) / (judged + a0 + b0), each judged draft adding to
    `kept` its acceptance probability sum_x min(p, q) (`Goodput.estimator`),
    from a start (a0, b0) read off the row's own prompt, teacher-forced
    (`Goodput.prompt_prior`), or the pseudo-counts (3, 1) (`Goodput.prior`).
    `measure_goodput` times every term on the loop's own shapes
    (`specjax.harness.measure`), at the batch size used.
    With batch > 1 every row pays for the widest row and the batch runs
    until its last row is done, so the rule picks one budget g for all rows,
    minimising cost(g) * max_b remaining_b / tokens_b(g) over the active rows
    (tokens_b(g) the numerator above at row b's estimate, remaining_b the
    tokens row b may still generate). An optional `threshold` adds the
    confidence stop. Without one, the round's length is fixed before any
    drafting, and the loop runs the fixed-length round's own program
    (`adaptive.planned`). Without one, the rule may also plan width 0, an
    off stretch (`probe`): autoregressive steps that leave the draft alone,
    with a probe round (one draft pass, judged by the 1-token target pass)
    every `probe_every` rounds to keep the estimate moving. Where no width
    pays, e.g. a batch waiting for a row its draft predicts badly, that is
    faster than every fixed gamma.

    The cost charges c_first and overhead, not only g c + r_g: both are the
    same for every g, and adding a constant to every g's cost can only move
    the argmax to a longer budget (the ratio of tokens to cost flattens), so
    a rule without them would choose budgets too short wherever the window
    or the per-round overhead is not small next to a target pass (a small
    target: the overhead is a fixed amount of work per round). c and r are
    timed at the loop's own cache capacity, since attention spans every
    slot, masked.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _moved
from specjax.decode import state as state_lib


def _check_gamma_max(gamma_max) -> int:
  return _checks.check_int("gamma_max", gamma_max, low=1, high=64)


def _check_widths(widths, gamma_max: int) -> tuple[int, ...] | None:
  """`widths` as a sorted tuple of distinct ints in [1, gamma_max], or None
  where it is None or every such width (one skeleton for both)."""
  if widths is None:
    return None
  if isinstance(widths, (str, bytes)) or not hasattr(widths, "__iter__"):
    raise TypeError(f"widths must be a sequence of draft lengths in [1, "
                    f"{gamma_max}], e.g. (1, 2, 4, 8), or None; got "
                    f"{widths!r}.")
  widths = tuple(sorted({_checks.check_int("widths[i]", w, low=1,
                                           high=gamma_max) for w in widths}))
  if not widths:
    raise ValueError("widths must hold at least one draft length, or be None "
                     "(every width 1..gamma_max).")
  return None if widths == tuple(range(1, gamma_max + 1)) else widths


def _check_threshold(threshold) -> float | None:
  if threshold is None:
    return None
  threshold = _checks.check_float("threshold", threshold)
  if not 0.0 <= threshold <= 1.0:
    raise ValueError(f"threshold is a probability in [0, 1], got {threshold}.")
  return threshold


class _Traced:
  """Stands in a rule's static skeleton for a field the loop takes traced."""

  def __repr__(self) -> str:
    return "<traced>"


TRACED = _Traced()


def split(rule: Rule) -> tuple[Rule, dict[str, np.ndarray]]:
  """`(skeleton, values)`: the rule with its `traced_fields` set to `TRACED`
  (a static, hashable jit argument) and those fields' values as float32
  arrays (a dynamic one). Two rules that differ only in those values share
  one compiled loop: a `warm_start` prior, measured costs, a threshold.
  A field that is None stays None in the skeleton: it changes the program.
  """
  values = {}
  for name in rule.traced_fields:
    value = getattr(rule, name)
    if value is None:
      continue
    with np.errstate(over="ignore", under="ignore"):
      values[name] = np.asarray(value, np.float32)
    # A value that overflows, or a non-zero one that underflows to 0 (a
    # prior of 1e-50: 0 / 0 estimates), would plan from NaN.
    if not np.isfinite(values[name]).all() or np.any(
        (values[name] == 0) & (np.asarray(value, np.float64) != 0)):
      raise ValueError(f"{type(rule).__name__}.{name}={value!r} does not fit "
                       "in float32, in which the loop computes; rescale it.")
  return _with_fields(rule, dict.fromkeys(values, TRACED)), values


def join(skeleton: Rule, values: dict[str, Any]) -> Rule:
  """The rule `split` took apart, its values (e.g. tracers) put back; not
  validated again (they were when the rule was made)."""
  return _with_fields(skeleton, values)


def _with_fields(rule: Rule, fields: dict[str, Any]) -> Rule:
  # Bypasses __init__: its checks need Python numbers, not tracers.
  new = object.__new__(type(rule))
  new.__dict__.update(rule.__dict__)
  new.__dict__.update(fields)
  return new


def widest(budget_B: jax.Array, active_B: jax.Array) -> jax.Array:
  """int32 scalar: the largest budget among the active rows (0 if none), the
  width of a round whose rows draft up to their budgets. A finished row
  counts as 0, the least any rule plans, so that it never lifts an off
  stretch (width 0) of the rows still going to a width-1 round."""
  return jnp.max(jnp.where(active_B, budget_B, 0)).astype(jnp.int32)


class Rule:
  """Base class: no budget limit and no early stop (fixed gamma_max)."""
  gamma_max: int

  # Numeric fields (floats or tuples of floats) the compiled loop takes as
  # traced values rather than as part of its static program (`split`): a
  # rule that differs only in them reuses the compiled loop. A subclass
  # that lists none is static whole, as any hashable rule can be.
  traced_fields: ClassVar[tuple[str, ...]] = ()

  @property
  def min_width(self) -> int:
    """The narrowest round the rule plans: 1, or 0 where it may plan a probe
    round (`adaptive.planned`)."""
    return 1

  @property
  def planned_widths(self) -> tuple[int, ...]:
    """The widths `plan` may give, ascending (0: a probe round): the loops a
    rule that only plans compiles (`loop._planned_loop`)."""
    return tuple(range(self.min_width, self.gamma_max + 1))

  # Whether `plan` gives every row the same budget. The planned loop then
  # runs every row to the round's width without planning again inside the
  # round (planning is per-round work, and a small target's round is short).
  # False unless a rule says so: per-row budgets are planned every round.
  plans_one_width: ClassVar[bool] = False

  @property
  def stops_early(self) -> bool:
    """Whether `stop` can end a row's drafting before its budget. A rule that
    cannot fixes the round's length before drafting, and the loop then runs
    the fixed-length round's own program (`adaptive.planned`)."""
    return type(self).stop is not Rule.stop

  def plan(self, stats, active_B: jax.Array,
           remaining_B: jax.Array) -> jax.Array:
    """int32 `[B]` budgets in [min_width, gamma_max], from past rounds only.

    `remaining_B` (int32 `[B]`): tokens each row may still generate."""
    del stats, remaining_B
    return jnp.full(active_B.shape, self.gamma_max, jnp.int32)

  def keeps(self, width: int, stats, active_B: jax.Array,
            remaining_B: jax.Array) -> jax.Array:
    """bool scalar: whether a rule that only plans goes on with rounds of
    `width` (static) draft passes; by default while its plan's width, the
    largest active budget, is `width`. Reads only the past, as `plan`."""
    return widest(self.plan(stats, active_B, remaining_B), active_B) == width

  def stop(self, count: jax.Array, q_BxV: jax.Array,
           x_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """After the `count`-th draft (drawn from q_BxV): `(stop_B, length_B)`.

    length_B is the draft length a stopping row keeps (<= count). A correct
    rule returns `count` (or less, deciding from q's of earlier drafts): it
    must never keep fewer drafts because of the token it just drew.
    """
    del q_BxV, x_B
    return jnp.zeros(count.shape, bool), count


@dataclasses.dataclass(frozen=True)
class Confidence(Rule):
  """Stop after a draft token whose distribution has max q < `threshold`."""
  threshold: float = 0.5
  gamma_max: int = 8

  traced_fields: ClassVar[tuple[str, ...]] = ("threshold",)

  def __post_init__(self):
    if self.threshold is None:  # None is Goodput's "no threshold"
      raise TypeError("Confidence threshold must be a probability in [0, 1] "
                      "(the rule is the threshold), got None.")
    object.__setattr__(self, "threshold", _check_threshold(self.threshold))
    object.__setattr__(self, "gamma_max", _check_gamma_max(self.gamma_max))

  def stop(self, count, q_BxV, x_B):
    del x_B
    return jnp.max(q_BxV, axis=-1) < self.threshold, jnp.broadcast_to(
        count, q_BxV.shape[:1])


@dataclasses.dataclass(frozen=True)
class Goodput(Rule):
  """Per-row budgets maximising expected tokens per unit time (see module doc).

  Attributes (costs in units of a target pass on 1 token, this batch size):
    c: a draft pass on 1 token.
    r: `gamma_max` floats, r[g - 1] = target pass on g + 1 tokens (with
      `measure_goodput(calibrate=True)`: the loop's own round of g drafts,
      less its draft passes and overhead).
    gamma_max: the largest budget; len(r) when omitted.
    threshold: optional confidence stop (as `Confidence`), or None.
    prior: pseudo-counts (accepted, rejected) of the acceptance estimate;
      `warm_start` sets them from an earlier generation. The default (3, 1)
      starts a row at 3/4, optimistic on purpose: a row whose estimate is
      low plans short rounds or off stretches, which judge few drafts, so
      a low start is slow to leave, while a long round that fails judges
      its drafts up to the rejection and the estimate falls at once. The
      price is paid where the draft is bad (off stretches beat every width):
      the optimistic start spends its first rounds learning that.
    c_first: the round's first draft pass; None means c.
    overhead: a round's work outside the model passes (>= 0).
    hysteresis: without a threshold, the loop keeps a round width while its
      expected time to finish is within this fraction of the best width's,
      plus `switch_cost` (see `keeps`). 0 by default; `measure_goodput`
      sets `BATCHED_HYSTERESIS` for a batch of more than one row.
    switch_cost: what a change of width costs, once (target passes on 1
      token): the width is kept while the time it would save is less. The
      default, 0.25, is meant to sit above what a change of width costs at
      batch 1 (the carry passes from one width's loop to another's). A
      fixed cost rather than a `hysteresis` fraction at batch 1: a fraction
      of the time left is several rounds early in a call, so a row whose
      estimate rose from the prior's 3/4 would settle on the first width
      within that fraction of the best, short of the best.
    prompt_prior: the weight, in judged drafts, of each row's prompt: the
      loop scores both models' laws at the prompt's last ceil(prompt_prior)
      positions (`prompt_window`, from their prefills; `RowStats`'
      `prompt_scored`, `prompt_overlap_sum`), and a row that scored n of
      them starts from their mean overlap weighted as min(n, prompt_prior)
      drafts, with `prior` scaled by what is left of the weight
      (`initial_counts`). The default, 16, is `warm_start`'s strength. The
      prompt is the row's own text, so when sampling its overlap is a fair
      start for the row's acceptance. Greedy text is not like its prompt (a
      small model's repeats itself): the prompt's overlap then reads lower
      than the acceptance generating from it, for some rows far lower, and
      a row that starts low leaves slowly (`prior`), so greedy rows start
      from `prior`. So do rows of drafts without prefill logits of their
      own (sharing the target's cache or reading its features), and every
      row under the
      "accepted" estimator. Stopping stays exact: the prompt is known
      before the first round. 0 turns it off.
    probe: the cost of a probe round (one draft pass, the target's pass on 1
      token, the round's other work), or None. With it the rule may plan
      width 0, an off stretch: a probe round, which judges one draft so that
      the estimate can bring speculation back, then autoregressive steps
      (1 + overhead each) that leave the draft alone, one token a round.
      Where no width pays (a batch waiting for a row the draft predicts
      badly), off stretches are the fastest the loop can go.
      `measure_goodput` sets it. Not with a threshold.
    probe_every: rounds per probe in an off stretch (1: probes only; the
      loop uses 1 for a draft that reads the target's features).
    estimator: what a judged draft adds to its row's kept count.
      "overlap" (default): its acceptance probability sum_x min(p, q), the
      Rao-Blackwellised count. Under the exact token verifier a draft is
      kept with exactly that probability, so the estimate has the count's
      mean with far less variance when sampling. Greedy, the overlap is the
      count (p and q are one-hot). "accepted": the drafts kept, for a
      verifier that keeps drafts with other probabilities (the lossy ones);
      the loop refuses "overlap" with such a verifier.
    widths: the draft lengths the rule may plan, a subset of 1..gamma_max
      (any order; kept sorted), or None (default): every one. Without a
      threshold the loop compiles one loop of rounds per planned width
      (`loop._planned_loop`), and every call pays for each of them, planned
      or not: the planned loop's per-call cost over a fixed gamma's grows
      with the number of widths. Fewer widths also compile faster, and
      `measure_goodput(widths=...)` times only them; gamma="auto" plans
      `doubling_widths`. r's entries at other widths are not read. With a
      threshold, only the budgets are restricted.
  """
  c: float
  r: tuple[float, ...]
  gamma_max: int | None = None
  threshold: float | None = None
  prior: tuple[float, float] = (3.0, 1.0)
  c_first: float | None = None
  overhead: float = 0.0
  hysteresis: float = 0.0
  switch_cost: float = 0.25
  prompt_prior: float = 16.0
  probe: float | None = None
  probe_every: int = 8
  estimator: str = "overlap"
  widths: tuple[int, ...] | None = None

  plans_one_width: ClassVar[bool] = True  # one budget for the batch: `plan`
  # Structure stays static: gamma_max, probe_every, estimator, prompt_prior
  # (`prompt_window` decides what the loop scores), widths, and whether
  # threshold and probe are None.
  traced_fields: ClassVar[tuple[str, ...]] = (
      "c", "r", "threshold", "prior", "c_first", "overhead", "hysteresis",
      "switch_cost", "probe")

  def __post_init__(self):
    c = _checks.check_float("c", self.c)
    if c < 0:
      raise ValueError(f"c (draft cost / target cost) must be >= 0, got {c}.")
    try:
      r = tuple(_checks.check_float("r[i]", x) for x in self.r)
    except TypeError:
      raise TypeError("r must be a sequence of gamma_max floats (verify cost "
                      f"ratios), got {self.r!r}.") from None
    if not r and self.gamma_max is None:
      raise ValueError("r must hold one verify cost ratio per draft length "
                       "(r[g-1] for g + 1 tokens), got none.")
    gamma_max = len(r) if self.gamma_max is None else self.gamma_max
    gamma_max = _check_gamma_max(gamma_max)
    if len(r) != gamma_max or any(x <= 0 for x in r):
      raise ValueError(f"r must hold gamma_max={gamma_max} positive cost "
                       f"ratios (r[g-1] for g + 1 tokens), got {r}.")
    try:
      prior = tuple(_checks.check_float("prior[i]", x) for x in self.prior)
    except TypeError:
      raise TypeError("prior must be two positive pseudo-counts (accepted, "
                      f"rejected), e.g. (3.0, 1.0); got {self.prior!r}."
                      ) from None
    if len(prior) != 2 or min(prior) <= 0:
      raise ValueError(f"prior must be two positive pseudo-counts, got {prior}.")
    c_first = c if self.c_first is None else _checks.check_float(
        "c_first", self.c_first)
    overhead = _checks.check_float("overhead", self.overhead)
    if c_first < 0 or overhead < 0:
      raise ValueError(f"c_first and overhead are costs (>= 0), got "
                       f"c_first={c_first}, overhead={overhead}.")
    hysteresis = _checks.check_float("hysteresis", self.hysteresis)
    if hysteresis < 0:
      raise ValueError(f"hysteresis is a relative margin (>= 0), got "
                       f"{hysteresis}.")
    switch_cost = _checks.check_float("switch_cost", self.switch_cost)
    if switch_cost < 0:
      raise ValueError(f"switch_cost is a cost in target passes (>= 0), got "
                       f"{switch_cost}.")
    prompt_prior = _checks.check_float("prompt_prior", self.prompt_prior)
    if prompt_prior < 0:
      raise ValueError(f"prompt_prior is a weight in judged drafts (>= 0; 0 "
                       f"turns it off), got {prompt_prior}.")
    probe = self.probe
    if probe is not None:
      probe = _checks.check_float("probe", probe)
      if probe <= 0:
        raise ValueError(f"probe is a round's cost (> 0), got {probe}.")
      if self.threshold is not None:
        raise ValueError("probe rounds are planned before drafting; a rule "
                         "with a confidence threshold cannot plan them. Pass "
                         "probe=None or threshold=None.")
    if self.estimator not in ESTIMATORS:
      raise ValueError(f"estimator must be one of {ESTIMATORS}, got "
                       f"{self.estimator!r}.")
    for name, value in (("c", c), ("r", r), ("gamma_max", gamma_max),
                        ("probe", probe),
                        ("probe_every", _checks.check_int(
                            "probe_every", self.probe_every, low=1,
                            high=1024)),
                        ("prior", prior), ("c_first", c_first),
                        ("overhead", overhead), ("hysteresis", hysteresis),
                        ("switch_cost", switch_cost),
                        ("prompt_prior", prompt_prior),
                        ("widths", _check_widths(self.widths, gamma_max)),
                        ("threshold", _check_threshold(self.threshold))):
      object.__setattr__(self, name, value)
    # Each field fits float32 (`split`), but a round's cost sums them: an
    # infinite cost makes every width's time infinite, and no plan better.
    with np.errstate(over="ignore"):
      costs = np.asarray(self.round_costs(), np.float32)
    if not np.isfinite(costs).all():
      raise ValueError(
          f"Goodput's round costs (c_first + (g - 1) * c + r[g-1] + "
          f"overhead, in target passes) overflow float32, in which the loop "
          f"plans: c={c}, c_first={c_first}, r={r}, overhead={overhead}. "
          "They are ratios to one target pass; rescale them.")

  def warm_start(self, previous, strength: float = 16.0) -> Goodput:
    """This rule with its acceptance prior taken from a previous generation.

    Each row's estimate then starts at the pooled acceptance of `previous`
    (a `GenerationResult` of the same target and draft, e.g. a pilot call
    on other prompts), weighted as `strength` judged drafts, instead of at
    the default prior's 3/4. A row pays for what it learns, even with exact
    costs, so a start near its acceptance saves time. Pilot on as many
    texts as the calls will see: a pilot on one prompt starts every row at
    that text's acceptance, and where it is low the rows learn slowly
    (short rounds and off stretches judge few drafts). Stopping stays
    exact: the prior is fixed before the call. The returned rule's
    `prompt_prior` is 0: the pilot's acceptance replaces each row's prompt
    as its start.
    """
    if not isinstance(previous, state_lib.GenerationResult):
      raise TypeError("previous must be the GenerationResult of an earlier "
                      "speculative_generate call (its acceptance sets the "
                      f"prior), got {type(previous).__name__}.")
    strength = _checks.check_float("strength", strength)
    if not strength > 0:
      raise ValueError(f"strength is a number of judged drafts (> 0), got "
                       f"{strength}.")
    accepted = int(np.sum(previous.stats.accepted))
    verified = int(np.sum(previous.stats.verified))
    if verified <= 0:
      raise ValueError("previous judged no drafts (a generate call, or a "
                       "speculative one that only ran off stretches); it "
                       "says nothing of the acceptance.")
    # Shrunk by half a draft each way, so that a pilot that kept (or lost)
    # every draft still leaves both pseudo-counts positive.
    alpha = (accepted + 0.5) / (verified + 1.0)
    return dataclasses.replace(
        self, prior=(alpha * strength, (1.0 - alpha) * strength),
        prompt_prior=0.0)

  @property
  def min_width(self) -> int:
    return 0 if self.probe is not None else 1

  @property
  def planned_widths(self) -> tuple[int, ...]:
    if self.widths is None:
      return super().planned_widths
    return (0,) * (self.probe is not None) + self.widths

  def expected_rate(self, alpha_B: jax.Array) -> jax.Array:
    """float32 `[B, W]`: expected tokens per unit time for each width g =
    min_width..G (column 0 is the probe round where there is one)."""
    return (self.expected_tokens(alpha_B)
            / jnp.asarray(self.round_costs(), jnp.float32))

  def round_costs(self) -> tuple[float, ...]:
    """A round's cost for g = min_width..gamma_max, in target passes on 1
    token (g = 0: an off stretch's mean, one probe every `probe_every`)."""
    off = ()
    if self.probe is not None:
      off = ((self.probe + (self.probe_every - 1) * (1.0 + self.overhead))
             / self.probe_every,)
    return off + tuple(
        self.c_first + (g - 1) * self.c + self.r[g - 1] + self.overhead
        for g in range(1, self.gamma_max + 1))

  @property
  def stops_early(self) -> bool:
    return self.threshold is not None

  def expected_tokens(self, alpha_B: jax.Array) -> jax.Array:
    """float32 `[B, W]`: expected tokens per round for g = min_width..G
    (a probe round emits exactly one)."""
    g_W = jnp.arange(self.min_width, self.gamma_max + 1, dtype=jnp.float32)
    a_Bx1 = jnp.clip(alpha_B, 0.0, 1.0 - 1e-6)[:, None]
    tokens_BxW = (1.0 - a_Bx1 ** (g_W + 1)) / (1.0 - a_Bx1)
    return jnp.where(g_W == 0, 1.0, tokens_BxW)

  def row_tokens(self, stats) -> jax.Array:
    """float32 `[B, W]`: each row's expected tokens a round of width g =
    min_width..G, at its running acceptance estimate."""
    return self.expected_tokens(self.alpha(stats))

  @property
  def reads_prompt(self) -> bool:
    """Whether the loop should score the prompt for this rule (static; it
    does when sampling, for a draft with prefill logits of its own)."""
    return self.prompt_prior > 0 and self.estimator == "overlap"

  @property
  def prompt_window(self) -> int:
    """How many of a prompt's last positions the loop scores for this rule
    (static): ceil(prompt_prior), as many as the prompt is weighed as
    (`initial_counts`), so each scored position stands for one judged
    draft; 0 where it reads no prompt."""
    return math.ceil(self.prompt_prior) if self.reads_prompt else 0

  def initial_counts(self, stats) -> tuple[jax.Array, jax.Array]:
    """float32 `[B]` pseudo-counts (kept, not kept) each row starts from.

    A row whose prompt scored n positions of mean overlap o (shrunk by half
    a position each way, as `warm_start` shrinks) weighs it as w = min(n,
    prompt_prior) drafts, and `prior` as the remaining 1 - w / prompt_prior
    of itself: `prior` where nothing was scored, the prompt alone once n
    reaches prompt_prior."""
    a0, b0 = self.prior
    zero_B = jnp.zeros(stats.verified.shape, jnp.float32)
    if not self.reads_prompt:
      return zero_B + a0, zero_B + b0
    n_B = stats.prompt_scored.astype(jnp.float32)
    w_B = jnp.minimum(n_B, self.prompt_prior)
    o_B = (stats.prompt_overlap_sum.astype(jnp.float32) + 0.5) / (n_B + 1.0)
    rest_B = 1.0 - w_B / self.prompt_prior
    return w_B * o_B + rest_B * a0, w_B * (1.0 - o_B) + rest_B * b0

  def alpha(self, stats) -> jax.Array:
    """float32 `[B]`: each row's running acceptance estimate, (kept + a0) /
    (judged + a0 + b0), kept as `estimator` counts it, (a0, b0) the row's
    `initial_counts`."""
    a0_B, b0_B = self.initial_counts(stats)
    kept_B = (stats.overlap_sum if self.estimator == "overlap"
              else stats.accepted)
    return ((kept_B.astype(jnp.float32) + a0_B)
            / (stats.verified.astype(jnp.float32) + a0_B + b0_B))

  def remaining_time(self, stats, active_B, remaining_B) -> jax.Array:
    """float32 `[W]`: the batch's expected time to finish, in target passes,
    if every round from now on had width g = min_width..G (+inf for a width
    outside `widths`).

    Every row waits for every pass, and the batch runs until its last row is
    done: the round's cost times the most rounds an active row still needs
    (remaining / expected tokens). One row: remaining / its rate. Not the
    sum of the rows' rates: that lets well-predicted rows outvote the row
    the batch waits for, and drafts long rounds where short ones are
    fastest.
    """
    rounds_BxG = (remaining_B.astype(jnp.float32)[:, None]
                  / self.row_tokens(stats))
    worst_G = jnp.max(jnp.where(active_B[:, None], rounds_BxG, 0.0), axis=0)
    time_G = worst_G * jnp.asarray(self.round_costs(), jnp.float32)
    if self.widths is None:
      return time_G
    # A width outside `widths` is never planned, nor kept over one in it:
    # its +inf loses even to an allowed width whose time overflowed (capped
    # at float32's largest: a tie at +inf would plan width 1 even outside
    # `widths`, which the planned loop runs no round of, and the loop would
    # never end).
    allowed_G = np.isin(np.arange(self.min_width, self.gamma_max + 1),
                        self.planned_widths)
    return jnp.where(allowed_G,
                     jnp.minimum(time_G, jnp.finfo(jnp.float32).max), jnp.inf)

  def plan(self, stats, active_B, remaining_B):
    best = jnp.argmin(self.remaining_time(stats, active_B, remaining_B))
    return jnp.full(active_B.shape, best.astype(jnp.int32) + self.min_width,
                    jnp.int32)

  def keeps(self, width, stats, active_B, remaining_B):
    # Leave a width only for time saved: more than a change of width costs
    # (`switch_cost`, once) and, with `hysteresis`, more than that fraction
    # of the time left, against the noise of the rows' estimates.
    time_G = self.remaining_time(stats, active_B, remaining_B)
    return (time_G[width - self.min_width]
            <= (1.0 + self.hysteresis) * jnp.min(time_G) + self.switch_cost)

  def stop(self, count, q_BxV, x_B):
    del x_B
    length_B = jnp.broadcast_to(count, q_BxV.shape[:1])
    if self.threshold is None:
      return jnp.zeros(q_BxV.shape[:1], bool), length_B
    return jnp.max(q_BxV, axis=-1) < self.threshold, length_B


# A round cost that no acceptance estimate can make worth planning: a round
# of the pinned width costs 1 and emits at least one token, any other at
# most gamma_max + 1 <= 65 (`_check_gamma_max`).
_UNPLANNED_COST = 1e4


def pinned(rule: Goodput, width: int) -> Goodput:
  """`rule` with numbers that plan, and keep, `width` every round.

  Only the traced values change (`Goodput.traced_fields`): round costs of 1
  for `width` and `_UNPLANNED_COST` for every other width and the probe
  round, no switch cost or margin. So the call runs `rule`'s own compiled
  loop (the same skeleton, `split`), every round a fixed round of `width`.
  `measure_goodput` prices each width this way: one compile serves every
  width and the rule's own calls after it.

  Args:
    rule: a `Goodput` that only plans (no `threshold`).
    width: int in [1, rule.gamma_max], one of the rule's `widths`.
  """
  if not isinstance(rule, Goodput) or rule.stops_early:
    raise TypeError("rule must be a Goodput without a threshold (a rule "
                    "that plans each round's width before drafting), got "
                    f"{rule!r}.")
  width = _checks.check_int("width", width, low=1, high=rule.gamma_max)
  if width not in rule.planned_widths:
    raise ValueError(f"width={width} is not one of the rule's widths "
                     f"{rule.widths}: its loop has no rounds of that width. "
                     "Pin one of them, or pass a rule with widths=None.")
  far = _UNPLANNED_COST
  return dataclasses.replace(
      rule, c=0.0, c_first=0.0, overhead=0.0, hysteresis=0.0,
      switch_cost=0.0,
      r=tuple(1.0 if g == width else far
              for g in range(1, rule.gamma_max + 1)),
      probe=None if rule.probe is None else far)


# What a judged draft adds to a `Goodput` row's kept count (its docstring).
ESTIMATORS = ("overlap", "accepted")


def check_rule(rule: Any) -> Rule:
  if not isinstance(rule, Rule) or not hasattr(rule, "gamma_max"):
    raise TypeError("gamma must be an int >= 1 or a draft-length "
                    "rule (specjax.decode.draft_length.Confidence(...) or "
                    f"Goodput(...)), got {rule!r}.")
  _checks.check_hashable("draft-length rule", rule)
  return rule


# Moved names raise an error naming their new home.
__getattr__ = _moved.module_getattr(__name__, {
    "measure_goodput": "specjax.harness.autotune.measure_goodput",
    "doubling_widths": "specjax.harness.autotune.doubling_widths",
    "monotone_fit": "specjax.harness.autotune.monotone_fit",
    "BATCHED_HYSTERESIS": "specjax.harness.autotune.BATCHED_HYSTERESIS",
})
