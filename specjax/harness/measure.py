"""The decode loop's cost model: every part timed on the loop's own shapes.

A speculative round of `specjax.decode.loop` does, for the whole batch:

  draft window   the draft's pass on 2 tokens (it re-reads the last two
                 committed tokens, to catch up after a full accept),
  draft steps    gamma - 1 passes on 1 token,
  verify         the target's pass on gamma + 1 tokens,
  other          everything outside the passes: the round's RNG, the sampling
                 transform, the coupling, the commit, the while_loop itself.

The autoregressive loop (`generate`) runs N rounds of one target pass on 1
token plus its own `other`. Both loops start with prefills, and every call
pays a fixed host cost (argument checks, dispatch).

How each part is timed (`loop_costs`; the shapes are those `_generate`
builds: prompt bucket, cache capacity bucket + max_new_tokens + gamma + 1
rounded up to a multiple of `loop.CACHE_BLOCK` and capped at the model's
max_positions, batch size):

* passes and prefills (`pass_seconds`): jitted `fori_loop`s of n and 2n
  cached passes, each pass fed the argmax of the last (so XLA can neither drop
  nor overlap them) and its cache lengths reset after it (as a rolled-back
  round does); their difference over n is one pass without a call's fixed
  cost. Minimum of interleaved repeats, after a warm-up call (see Noise).
* other and the fixed per-call cost (`null_loop_seconds`): the real
  `speculative_generate` / `generate` with both models replaced by `NullLM`,
  which computes no layers and writes no cache (so nothing a pass timing
  already holds is counted twice), run by one compiled program for two
  numbers of loop iterations (its tables make every draft kept, or every
  draft refused): the difference over the difference in loop iterations is
  one round's other work, and what is left of the shorter call is the fixed
  cost.

Noise: on a shared or virtualised machine, other work only ever ADDS time
to a call, and at sub-millisecond passes it can add as much as the work
itself, from one trial to the next. So every time here, and every call time
of the sweep (`specjax.harness.sweep`, `call_repeats`), is the minimum over
interleaved repeats: an estimate of the cost of the work itself, the same
estimator on the predicted and the measured side of every ratio.

`predict` turns the costs and an acceptance rate into predicted decode-only
and end-to-end speedups (`accounting.expected_rounds` counts the last round's
budget truncation and, for a batch, waiting for the slowest row).
`decompose` sets one measured cell beside its prediction, component by
component, and names the component that is off.

Timings are memoised in a dict keyed by everything that determines a cost:
the model's class, pytree structure (static config included) and array
shapes and dtypes, and the pass's batch, tokens, capacity and fill (for
loops: also gamma, budget and sampling config). Never by `id(model)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks
from specjax import accounting
from specjax import jit_memory
from specjax import sampling as sampling_lib
from specjax import stats
from specjax.decode import draft_length
from specjax.decode import loop as loop_lib
from specjax.decode import validation
from specjax.decode import verifiers as verifiers_lib

# Relative error beyond which `decompose` calls a component off.
TOLERANCE = 0.10


def check_timing(seconds: Any, repeats: Any) -> tuple[float, int]:
  """(seconds, repeats) of a timing, checked: seconds > 0, repeats >= 1."""
  seconds = _checks.check_float("seconds", seconds)
  if seconds <= 0:
    raise ValueError(f"seconds (the time each timed loop aims at) must be "
                     f"> 0, got {seconds}.")
  return seconds, _checks.check_int("repeats", repeats, low=1)


@contextlib.contextmanager
def no_compiles(what: str):
  """Raises if XLA compiled anything inside the block: a timed call that
  compiles times the compilation. (`jit_memory.deferred()` around a timer's
  warm-ups and timed calls keeps specjax's own cache clearing out of it.)"""
  before = jit_memory.compiles()
  yield
  compiled = jit_memory.compiles() - before
  if compiled:
    raise RuntimeError(
        f"{what}: {compiled} XLA compile(s) ran during the timed calls, so "
        "their times include compiling. A timed function must reuse what "
        "its warm-up call compiled: the same shapes, dtypes and static "
        "arguments on every call.")


def interleaved_times(fns: dict[str, Callable[[], Any]], repeats: int, *,
                      min_seconds: float | None = None,
                      outputs: dict | None = None) -> dict[str, list[float]]:
  """Seconds of each call, `repeats` times, the calls taking turns (so a
  slow spell of a shared machine hits all of them), after one warm-up call
  of each. Compilation is never timed: a timed call that compiles raises
  (`no_compiles`).

  `min_seconds`: stop after the first turn by which every call has run
  that long in total (`repeats` is then the most turns): one
  millisecond-long call says more about the timer than the program.
  `outputs`: a dict that receives each warm-up call's result by name."""
  repeats = _checks.check_int("repeats", repeats, low=1)
  times = {name: [] for name in fns}
  # Before the warm-ups compile: a gamma="auto" call runs a dozen timers.
  jit_memory.relieve_if_needed("measure.interleaved_times")
  with jit_memory.deferred():
    for name, fn in fns.items():
      out = jax.block_until_ready(fn())
      if outputs is not None:
        outputs[name] = out
    with no_compiles("measure.interleaved_times"):
      for _ in range(repeats):
        for name, fn in fns.items():
          start = time.perf_counter()
          jax.block_until_ready(fn())
          times[name].append(time.perf_counter() - start)
        if min_seconds is not None and min(
            sum(t) for t in times.values()) >= min_seconds:
          break
  return times


def best_times(fns: dict[str, Callable[[], Any]], repeats: int, *,
               outputs: dict | None = None) -> dict[str, float]:
  """Fewest seconds per call of `interleaved_times`: the cost model's
  estimator (module docstring, "Noise"). `outputs`: as there."""
  return {name: min(t) for name, t in
          interleaved_times(fns, repeats, outputs=outputs).items()}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
  """`(fn(), seconds)` with the result blocked until ready."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def model_key(model) -> tuple:
  """What determines a model's pass cost: class, structure, shapes, dtypes.

  Two models that differ only in their weights' values cost the same, so
  they share timings; a model with another config or size never does.
  """
  leaves, treedef = jax.tree.flatten(model)
  structure = treedef
  try:
    hash(treedef)
  except TypeError:  # a static field that is not hashable
    structure = repr(treedef)
  return (type(model).__module__, type(model).__qualname__, structure,
          tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", "")))
                for x in leaves))


# -- Passes ---------------------------------------------------------------------


def forward_loops(model, batch, tokens, cache_len, fill, seconds):
  """Two calls running n and 2n cached forward passes of `tokens` tokens/row.

  Their time difference / n is one pass without a call's fixed cost
  (dispatch, argument copies, which would swamp a small model's pass).
  n is chosen so that n passes take about `seconds`. Each pass starts at
  `fill` committed positions (the lengths are reset after every pass, as a
  rolled-back round does), so all passes cost the same.
  """
  @jax.jit
  def run(model, cache, first_B, n):
    def body(_, carry):
      cache, token_B = carry
      logits_BxTxV, new_cache = model(
          jnp.broadcast_to(token_B[:, None], (batch, tokens)), cache)
      # Feeding the argmax back makes each pass depend on the last, as in
      # decoding, so XLA can neither drop nor hoist any of it.
      return (new_cache.replace(lengths=cache.lengths),
              jnp.argmax(logits_BxTxV[:, -1], axis=-1).astype(jnp.int32))
    return jax.lax.fori_loop(0, n, body, (cache, first_B))

  cache = model.init_cache(batch, cache_len).replace(
      lengths=jnp.full((batch,), fill, jnp.int32))
  first_B = jnp.zeros((batch,), jnp.int32)
  call = lambda n: run(model, cache, first_B, jnp.int32(n))
  n = 16
  for _ in range(2):  # the first estimate is inflated by the fixed cost
    per_pass = best_times({"": lambda: call(n)}, 1)[""] / n
    n = max(n, int(seconds / max(per_pass, 1e-9)))
  return n, (lambda: call(n)), (lambda: call(2 * n))


def _check_pass(batch_size, num_tokens, capacity, fill):
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  num_tokens = _checks.check_int("num_tokens", num_tokens, low=1)
  capacity = _checks.check_int("capacity", capacity, low=1)
  fill = _checks.check_int("fill", fill, low=0)
  if fill + num_tokens > capacity:
    raise ValueError(f"fill + num_tokens = {fill + num_tokens} exceeds "
                     f"capacity={capacity}.")
  return batch_size, num_tokens, capacity, fill


def pass_seconds(model, *, batch_size: int, num_tokens: int, capacity: int,
                 fill: int, seconds: float = 0.1, repeats: int = 5,
                 memo: dict | None = None) -> float:
  """Seconds of one cached pass of `num_tokens` tokens per row.

  The cache has `capacity` slots (attention spans all of them, masked), of
  which `fill` are committed; the pass writes positions fill .. fill +
  num_tokens - 1. A prefill is the pass with fill = 0 and num_tokens = the
  prompt bucket. See the module docstring for the method.
  """
  validation.check_model("model", model)  # not an AttributeError later
  batch_size, num_tokens, capacity, fill = _check_pass(batch_size, num_tokens,
                                                       capacity, fill)
  check_timing(seconds, repeats)  # before a memo hit hides a bad argument
  key = ("pass", model_key(model), batch_size, num_tokens, capacity, fill)
  if memo is not None and key in memo:
    return memo[key]
  (out,) = passes_seconds(model, batch_size=batch_size,
                          passes=((num_tokens, fill),), capacity=capacity,
                          seconds=seconds, repeats=repeats)
  if memo is not None:
    memo[key] = out
  return out


def passes_seconds(model, *, batch_size: int, passes, capacity: int,
                   seconds: float = 0.1, repeats: int = 5) -> list[float]:
  """`pass_seconds` of several passes, `passes` = ((num_tokens, fill), ...),
  timed interleaved: the calls of every pass take turns, so a change in the
  machine's speed during the measurement hits every pass alike. (Timed one
  after another, a change of speed between them would read as a difference
  in cost, e.g. a 2-token pass priced above two 1-token ones.)"""
  seconds, repeats = check_timing(seconds, repeats)
  passes = tuple(passes)
  if not passes:
    raise ValueError("passes must name at least one (num_tokens, fill).")
  # Every pass checked before the first is timed (seconds each).
  checked = [_check_pass(batch_size, num_tokens, capacity, fill)
             for num_tokens, fill in passes]
  loops, fns = [], {}
  for i, (batch, tokens, cache_len, fill) in enumerate(checked):
    n, once, twice = forward_loops(model, batch, tokens, cache_len, fill,
                                   seconds)
    loops.append(n)
    fns[f"{i}:n"], fns[f"{i}:2n"] = once, twice
  t = best_times(fns, repeats)
  return [max(t[f"{i}:2n"] - t[f"{i}:n"], 0.0) / n
          for i, n in enumerate(loops)]


# -- Shapes of a loop ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoopShape:
  """The static shapes one `speculative_generate` / `generate` call runs.

  gamma = 0 is the autoregressive loop. `buffer_len` and `capacity` mirror
  `decode.loop._generate` and `_prefill`; `fill` is a cache length from the
  middle of the generation (attention over a masked cache costs the same at
  any fill, so one fill stands for all rounds).
  """
  batch_size: int
  prompt_len: int
  max_new_tokens: int
  gamma: int

  def __post_init__(self):
    _checks.check_int("batch_size", self.batch_size, low=1)
    _checks.check_int("prompt_len", self.prompt_len, low=1)
    _checks.check_int("max_new_tokens", self.max_new_tokens, low=1)
    _checks.check_int("gamma", self.gamma, low=0)

  @property
  def width(self) -> int:
    return loop_lib.prompt_bucket(self.prompt_len)

  @property
  def buffer_len(self) -> int:
    return loop_lib._buffer_len(self.width, self.max_new_tokens, self.gamma)

  def capacity(self, model) -> int:
    limit = getattr(model, "max_positions", None)
    return self.buffer_len if limit is None else min(self.buffer_len, limit)

  def fill(self, model, num_tokens: int) -> int:
    mid = self.prompt_len + self.max_new_tokens // 2
    return max(0, min(mid, self.capacity(model) - num_tokens))


# -- The loop's work outside the passes ------------------------------------


class NullCache(struct.PyTreeNode):
  """A cache that stores nothing: only the protocol's `lengths[B]`."""
  lengths: jax.Array
  max_len: int = struct.field(pytree_node=False)


class NullLM(struct.PyTreeNode):
  """A `CausalLM` that computes no layers and writes no cache.

  Its logits are a row of a small `[K, V]` table picked by `token % K`, so
  they depend on the input (XLA cannot hoist the sampling out of the loop),
  and each row is peaked, so a target and draft built from one table agree
  (every draft is accepted) and one built from the negated table disagrees. A loop
  run with NullLMs costs what the real loop costs outside the models' passes.
  """
  table: jax.Array  # float32 [K, V]
  max_positions: int | None = struct.field(pytree_node=False, default=None)
  one_hot_q: bool = struct.field(pytree_node=False, default=False)

  @classmethod
  def like(cls, model, seed: int = 0, rows: int = 64) -> "NullLM":
    """A NullLM with `model`'s vocabulary, context limit and `one_hot_q`."""
    vocab = model.vocab_size
    rows = min(rows, vocab)
    # Peaked rows (one logit 20 above the noise): a twin draft's token has
    # p ~ 1 under any temperature, so it is accepted even when the draft is
    # one_hot_q, and the negated table's argmax has p ~ 0.
    table = jax.random.normal(jax.random.key(seed), (rows, vocab)).at[
        jnp.arange(rows), (7 * jnp.arange(rows) + 1) % vocab].add(20.0)
    return cls(table=table,
               max_positions=getattr(model, "max_positions", None),
               one_hot_q=bool(getattr(model, "one_hot_q", False)))

  @property
  def vocab_size(self) -> int:
    return self.table.shape[1]

  def init_cache(self, batch_size: int, max_len: int) -> NullCache:
    return NullCache(lengths=jnp.zeros((batch_size,), jnp.int32),
                     max_len=max_len)

  def __call__(self, tokens_BxT, cache):
    logits_BxTxV = self.table[tokens_BxT % self.table.shape[0]]
    return logits_BxTxV, cache.replace(
        lengths=cache.lengths + tokens_BxT.shape[1])


def _prompts(shape: LoopShape, vocab_size: int):
  """Filler prompts of `shape` (a null loop's cost reads no token values),
  ids cycling through at most 7 of the vocabulary."""
  prompts_BxP = (jnp.arange(shape.batch_size * shape.prompt_len, dtype=jnp.int32)
                 .reshape(shape.batch_size, shape.prompt_len)
                 % min(7, vocab_size))
  lengths_B = jnp.full((shape.batch_size,), shape.prompt_len, jnp.int32)
  return prompts_BxP, lengths_B


def _check_shape_prompts(shape: LoopShape, prompts_BxP) -> None:
  want = (shape.batch_size, shape.prompt_len)
  if tuple(np.shape(prompts_BxP)) != want:
    raise ValueError(f"prompts_BxP must be [batch_size, prompt_len] = "
                     f"{list(want)} for this shape, got "
                     f"{list(np.shape(prompts_BxP))}.")


def loop_round_steps(target, draft, shape: LoopShape,
                     sampling: sampling_lib.SamplingConfig, *, widths,
                     calls: int = 10, repeats: int = 3,
                     prompts_BxP=None, rule=None) -> list[float]:
  """The loop's own round at each width in `widths`, in `generate` steps.

  `speculative_generate(gamma=g)` for each width and `generate`, on
  `shape`'s batch, prompt length and budget with `prompts_BxP` (int
  `[batch_size, prompt_len]`; None: seeded random prompts, rows of
  unrelated tokens: low acceptance, so a call runs many rounds), `calls`
  calls each, interleaved, `repeats` trials. Per trial: a call's
  median seconds over its loop iterations (its longest row's rounds),
  over `generate`'s median seconds per step; returned: the median over
  trials. This is what the passes timed alone miss (the draft's scan and
  its cache writes, the commit, the loop's carry). Each call's prefill is
  spread over its rounds, which the low acceptance makes many.

  With `rule` (a `Goodput` without a threshold, widths up to its
  gamma_max), width g runs as `gamma=draft_length.pinned(rule, g)`: the
  rule's own planned loop, every round of width g. That is one compile for
  every width, where fixed gammas compile one loop each, and it is the
  program the rule's calls run (its rounds are the fixed loop's, plus the
  rule's planning).
  """
  _check_shape(shape)
  if isinstance(widths, (int, np.integer, str)) or not hasattr(widths,
                                                               "__iter__"):
    raise TypeError(f"widths must be a sequence of round widths, e.g. "
                    f"(1, 2, 4), got {widths!r}.")
  widths = tuple(_checks.check_int("widths[i]", g, low=1) for g in widths)
  if not widths:
    raise ValueError("widths is empty: name the round widths to time.")
  # Before any compile (else repeats=0 would return [] after two).
  calls = _checks.check_int("calls", calls, low=1)
  repeats = _checks.check_int("repeats", repeats, low=1)
  if rule is not None:
    gammas = {g: draft_length.pinned(rule, g) for g in widths}
  else:
    gammas = {g: g for g in widths}
  if prompts_BxP is None:
    prompts_BxP = np.random.default_rng(0).integers(
        0, target.vocab_size, (shape.batch_size, shape.prompt_len),
        dtype=np.int32)
  _check_shape_prompts(shape, prompts_BxP)
  lengths_B = np.full((shape.batch_size,), shape.prompt_len, np.int32)
  key = jax.random.key(0)
  fns = {g: (lambda g=g: loop_lib.speculative_generate(
      target, draft, prompts_BxP, lengths_B, key, gamma=gammas[g],
      max_new_tokens=shape.max_new_tokens, sampling=sampling))
         for g in widths}
  fns[0] = lambda: loop_lib.generate(
      target, prompts_BxP, lengths_B, key,
      max_new_tokens=shape.max_new_tokens, sampling=sampling)
  outputs = {}  # the first trial's warm-up results: each call's rounds
  trials = []
  for _ in range(repeats):
    times = interleaved_times(fns, calls, outputs=None if trials else outputs)
    rounds = {g: max(int(jax.device_get(out.stats.rounds).max()), 1)
              for g, out in outputs.items()}
    per_round = {g: statistics.median(t) / rounds[g] for g, t in times.items()}
    trials.append([per_round[g] / per_round[0] for g in widths])
  return [statistics.median(column) for column in zip(*trials)]


# Logit that makes a NullLM's token certain (or impossible) under any sampling
# config the loop accepts.
_SURE = 1e4


def _check_shape(shape) -> None:
  if not isinstance(shape, LoopShape):
    raise TypeError(f"shape must be a measure.LoopShape(batch_size, "
                    f"prompt_len, max_new_tokens, gamma), got "
                    f"{type(shape).__name__}.")


def null_loop_seconds(target, draft, shape: LoopShape,
                      sampling: sampling_lib.SamplingConfig, *,
                      repeats: int = 5, memo: dict | None = None,
                      verifier="token") -> tuple[float, float]:
  """(seconds per round outside the passes, fixed seconds per call).

  Runs the loop of `shape` with NullLMs in place of `target` and `draft`,
  twice with ONE compiled program and two numbers of loop iterations, and
  takes the per-round cost as the time difference over the iteration
  difference; the fixed cost is what remains of the shorter call (host
  checks, dispatch, output gather).

  Speculative (gamma >= 1): the draft's table is the target's (every draft
  accepted: ceil(N / (gamma + 1)) rounds) or its negation (a greedy draft
  always rejected: N rounds), judged by `verifier` (a registry string or
  `Verifier`: its own work is part of the round's other work; every
  registered verifier keeps a certain draft and refuses an impossible one).
  Autoregressive (gamma = 0, `draft` None): the
  same `generate` program with `eos_id=0`, the table making token 0
  impossible (N rounds) or certain (1 round); the EOS check is a few
  elementwise ops on `[B, 1]`.
  """
  repeats = _checks.check_int("repeats", repeats, low=1)  # before compiling
  _check_shape(shape)
  vocab = target.vocab_size
  one_hot = bool(getattr(draft, "one_hot_q", False)) if draft is not None else None
  verifier = verifiers_lib.get_verifier(verifier)
  key = ("null", shape, sampling, vocab, one_hot,
         getattr(target, "max_positions", None),
         verifier.spec if shape.gamma else None)
  if memo is not None and key in memo:
    return memo[key]
  null_target = NullLM.like(target)
  prompts_BxP, lengths_B = _prompts(shape, vocab)
  rng = jax.random.key(0)
  if shape.gamma == 0:
    no_eos = null_target.table.at[:, 0].set(-_SURE)
    eos = null_target.table.at[:, 0].set(_SURE)

    def call(table):
      return lambda: loop_lib.generate(
          null_target.replace(table=table), prompts_BxP, lengths_B, rng,
          max_new_tokens=shape.max_new_tokens, sampling=sampling, eos_id=0)
    long, short = call(no_eos), call(eos)
  else:
    def call(draft_table):
      null_draft = null_target.replace(table=draft_table, one_hot_q=one_hot)
      return lambda: loop_lib.speculative_generate(
          null_target, null_draft, prompts_BxP, lengths_B, rng,
          gamma=shape.gamma, max_new_tokens=shape.max_new_tokens,
          sampling=sampling, verifier=verifier)
    long, short = call(-null_target.table), call(null_target.table)
  outputs = {}  # the warm-up calls' results: their loop iterations
  t = best_times({"long": long, "short": short}, repeats, outputs=outputs)
  rounds_long, rounds_short = (
      int(jax.device_get(outputs[n].stats.rounds).max())
      for n in ("long", "short"))
  per_round = (max(t["long"] - t["short"], 0.0)
               / max(rounds_long - rounds_short, 1))
  fixed = max(t["short"] - rounds_short * per_round, 0.0)
  if memo is not None:
    memo[key] = (per_round, fixed)
  return per_round, fixed


# -- All costs of one loop ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """Seconds of every part of a speculative loop and of its baseline.

  Speculative (gamma >= 1): draft_window_s, draft_step_s, verify_s, other_s
  per round; target_prefill_s, draft_prefill_s and call_s once per call.
  Autoregressive baseline: ar_step_s (target, 1 token) and ar_other_s per
  step; ar_prefill_s and ar_call_s once per call. The two loops have
  different cache capacities (the speculative one has gamma more slots), so
  each pass is timed at its own.
  """
  batch_size: int
  prompt_len: int
  max_new_tokens: int
  gamma: int
  draft_window_s: float
  draft_step_s: float
  verify_s: float
  other_s: float
  target_prefill_s: float
  draft_prefill_s: float
  call_s: float
  ar_step_s: float
  ar_other_s: float
  ar_prefill_s: float
  ar_call_s: float

  def __post_init__(self):
    for name, low in (("batch_size", 1), ("prompt_len", 1),
                      ("max_new_tokens", 1), ("gamma", 0)):
      object.__setattr__(self, name, _checks.check_int(
          f"LoopCosts.{name}", getattr(self, name), low=low))
    # Finite, any sign: a time difference of two loops can dip below 0 in
    # the noise, and the prediction then says so; a NaN would hide it.
    for field in dataclasses.fields(self)[4:]:
      object.__setattr__(self, field.name, _checks.check_float(
          f"LoopCosts.{field.name}", getattr(self, field.name)))

  @property
  def draft_s(self) -> float:
    """The draft's share of a round: the window plus gamma - 1 steps."""
    return self.draft_window_s + (self.gamma - 1) * self.draft_step_s

  @property
  def round_s(self) -> float:
    return self.draft_s + self.verify_s + self.other_s

  @property
  def ar_round_s(self) -> float:
    return self.ar_step_s + self.ar_other_s

  @property
  def c(self) -> float:
    """The paper's c: draft step / target step, both on 1 token."""
    return self.draft_step_s / self.ar_step_s if self.ar_step_s else math.nan

  @property
  def r(self) -> float:
    """Verify pass (gamma + 1 tokens) / target step (1 token)."""
    return self.verify_s / self.ar_step_s if self.ar_step_s else math.nan

  def as_dict(self) -> dict[str, float]:
    """The fields plus draft_s, round_s, ar_round_s, c and r, and the
    legacy names target_step_s / verify_step_s."""
    out = dataclasses.asdict(self)
    out.update(draft_s=self.draft_s, round_s=self.round_s,
               ar_round_s=self.ar_round_s, c=self.c, r=self.r,
               target_step_s=self.ar_step_s, verify_step_s=self.verify_s)
    return out


def loop_costs(target, draft, *, batch_size: int, prompt_len: int,
               max_new_tokens: int, gamma: int,
               sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
               seconds: float = 0.1, repeats: int = 5,
               memo: dict | None = None, verifier="token") -> LoopCosts:
  """Times every part of `speculative_generate(target, draft, ...)` and of
  `generate(target, ...)` on the shapes those calls build (module docstring).

  `verifier` is the loop's (its work is in the round's other work). A draft
  that reads the target's cache (`SelfDraft(share_cache=True)`) has no
  prefill: the loop skips it, so its draft_prefill_s is 0.

  `memo` (a dict kept across calls) times each distinct pass or null loop
  once, e.g. over a grid of drafts, gammas and temperatures.
  """
  gamma = _checks.check_int("gamma", gamma, low=1)
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError("sampling must be a specjax.SamplingConfig.")
  # Else a pair the loop refuses (another vocabulary, a self-draft of another
  # target) would be priced all the same.
  validation.check_pair(target, draft)
  seconds, repeats = check_timing(seconds, repeats)  # before any compile
  spec = LoopShape(batch_size, prompt_len, max_new_tokens, gamma)
  ar = LoopShape(batch_size, prompt_len, max_new_tokens, 0)
  kw = dict(batch_size=batch_size, seconds=seconds, repeats=repeats,
            memo=memo)

  def at(shape, model, tokens):
    return pass_seconds(model, num_tokens=tokens,
                        capacity=shape.capacity(model),
                        fill=shape.fill(model, tokens), **kw)

  def prefill(shape, model):
    capacity = shape.capacity(model)
    return pass_seconds(model, num_tokens=min(shape.width, capacity),
                        capacity=capacity, fill=0, **kw)

  other, fixed = null_loop_seconds(target, draft, spec, sampling,
                                   repeats=repeats, memo=memo,
                                   verifier=verifier)
  ar_other, ar_fixed = null_loop_seconds(target, None, ar, sampling,
                                         repeats=repeats, memo=memo)
  return LoopCosts(
      batch_size=batch_size, prompt_len=prompt_len,
      max_new_tokens=max_new_tokens, gamma=gamma,
      draft_window_s=at(spec, draft, 2), draft_step_s=at(spec, draft, 1),
      verify_s=at(spec, target, gamma + 1), other_s=other,
      target_prefill_s=prefill(spec, target),
      draft_prefill_s=(0.0 if getattr(draft, "reads_target_cache", False)
                       else prefill(spec, draft)), call_s=fixed,
      ar_step_s=at(ar, target, 1), ar_other_s=ar_other,
      ar_prefill_s=prefill(ar, target), ar_call_s=ar_fixed)


# -- Prediction and its check -----------------------------------------------


def _ratio(num: float, den: float) -> float:
  """num / den, NaN when den is 0: a pass timed at zero (its n and 2n loops
  equal within noise, e.g. a tiny model on a busy machine) makes a
  prediction unknown, not an error."""
  return num / den if den else math.nan


def _check_costs(costs):
  if not isinstance(costs, LoopCosts):
    raise TypeError(f"costs must be a LoopCosts (loop_costs(...)), got "
                    f"{type(costs).__name__}.")


def predict(costs: LoopCosts, alpha: float) -> dict[str, float]:
  """What `costs` and an acceptance rate predict for one call.

  Returns (seconds per call unless named otherwise):
    loop_rounds: expected while_loop iterations (budget truncation of the
      last round; the slowest of batch_size rows);
    tokens_per_round: max_new_tokens / loop_rounds;
    spec_decode_s = loop_rounds * round_s; ar_decode_s = N * ar_round_s;
    spec_call_s, ar_call_s: the same plus prefills and the fixed call cost;
    decode_speedup = ar_decode_s / spec_decode_s
                   = tokens_per_round * ar_round_s / round_s;
    speedup: end to end, ar_call_s / spec_call_s.
  """
  _check_costs(costs)
  n = costs.max_new_tokens
  rounds = accounting.expected_rounds(alpha, costs.gamma, n, costs.batch_size)
  spec_decode = rounds * costs.round_s
  ar_decode = n * costs.ar_round_s
  spec_call = (costs.call_s + costs.target_prefill_s + costs.draft_prefill_s
               + spec_decode)
  ar_call = costs.ar_call_s + costs.ar_prefill_s + ar_decode
  return {"loop_rounds": rounds, "tokens_per_round": n / rounds,
          "spec_decode_s": spec_decode, "ar_decode_s": ar_decode,
          "spec_call_s": spec_call, "ar_call_s": ar_call,
          "decode_speedup": _ratio(ar_decode, spec_decode),
          "speedup": _ratio(ar_call, spec_call)}


# The parts `decompose` can name, in the order a round is built.
COMPONENTS = ("acceptance", "draft", "verify", "round", "baseline")


def decompose(costs: LoopCosts, alpha: float, *, round_s: float,
              ar_round_s: float, loop_rounds: float,
              null_draft_round_s: float | None = None) -> dict[str, Any]:
  """Sets a measured speculative loop beside `predict`, part by part.

  Args:
    costs, alpha: the prediction's inputs.
    round_s: measured seconds per loop round of the speculative call, decode
      only: (call - costs.call_s - both prefills) / its loop rounds.
    ar_round_s: the same per step of the autoregressive call.
    loop_rounds: measured while_loop iterations per speculative call, of
      rows that each generate costs.max_new_tokens tokens (no EOS: the
      autoregressive call is counted as max_new_tokens steps).
    null_draft_round_s: measured seconds per round of the same loop with the
      draft a `NullLM` (verify + other, in the loop). It splits the round's
      measured time into draft (round_s - it) and verify (it - other).
      Without it the round is not split and a gap is named "round".

  Returns a dict of seconds (predicted_/measured_ draft, verify, other,
  round, ar_round), loop rounds, `decode_speedup` = N ar_round_s /
  (loop_rounds round_s) and its prediction, `decode_efficiency`, `factors`
  and `off`. The factors multiply to decode_efficiency exactly:

    acceptance  predicted / measured loop rounds  (tokens per round),
    baseline    measured / predicted autoregressive step,
    draft       predicted round / round with the draft's in-loop time,
    verify      that / measured round (verify's in-loop time; `other` is
                measured in the loop by the null loops, so it cannot be off),
    round       predicted / measured round, when not split.

  Each is > 1 where reality favours speculation more than predicted. `off`
  is the factor furthest from 1 when decode_efficiency or that factor is
  more than TOLERANCE from 1, else "".
  """
  pred = predict(costs, alpha)
  round_s = _checks.check_float("round_s", round_s)
  ar_round_s = _checks.check_float("ar_round_s", ar_round_s)
  loop_rounds = _checks.check_float("loop_rounds", loop_rounds)
  if loop_rounds <= 0:
    raise ValueError(f"loop_rounds (while_loop iterations per call) must be "
                     f"> 0, got {loop_rounds}.")
  if null_draft_round_s is not None:
    null_draft_round_s = _checks.check_float("null_draft_round_s",
                                             null_draft_round_s)
  n = costs.max_new_tokens
  out = {
      "predicted_draft_s": costs.draft_s, "predicted_verify_s": costs.verify_s,
      "predicted_other_s": costs.other_s, "predicted_round_s": costs.round_s,
      "predicted_ar_round_s": costs.ar_round_s,
      "predicted_loop_rounds": pred["loop_rounds"],
      "measured_other_s": costs.other_s, "measured_round_s": round_s,
      "measured_ar_round_s": ar_round_s,
      "measured_loop_rounds": float(loop_rounds),
      "predicted_decode_speedup": pred["decode_speedup"],
      "decode_speedup": _ratio(n * ar_round_s, loop_rounds * round_s),
  }
  out["decode_efficiency"] = _ratio(out["decode_speedup"],
                                   out["predicted_decode_speedup"])
  factors = {"acceptance": pred["loop_rounds"] / loop_rounds,
             "baseline": _ratio(ar_round_s, costs.ar_round_s)}
  if null_draft_round_s is not None:
    out["measured_draft_s"] = round_s - null_draft_round_s
    out["measured_verify_s"] = null_draft_round_s - costs.other_s
    after_draft = costs.round_s - costs.draft_s + out["measured_draft_s"]
    factors["draft"] = _ratio(costs.round_s, after_draft)
    factors["verify"] = _ratio(after_draft, round_s)
  else:
    out["measured_draft_s"] = out["measured_verify_s"] = math.nan
    factors["round"] = _ratio(costs.round_s, round_s)
  out["factors"] = factors
  worst = max(factors, key=lambda k: abs(math.log(max(factors[k], 1e-12))))
  out["off"] = (worst if abs(out["decode_efficiency"] - 1) > TOLERANCE
                or abs(factors[worst] - 1) > TOLERANCE else "")
  return out


def null_draft_round_seconds(target, draft, shape: LoopShape,
                             sampling: sampling_lib.SamplingConfig, *,
                             prompts_BxP, prompt_lengths_B, key,
                             costs: LoopCosts, repeats: int = 3,
                             memo: dict | None = None,
                             verifier="token") -> float:
  """Seconds per round of the real speculative loop with the draft a NullLM.

  The round then holds the target's verify pass, the loop's other work and
  a draft that costs nothing: subtracted from the real round it gives the
  draft's in-loop cost, and minus `costs.other_s` the verify pass's.
  """
  repeats = _checks.check_int("repeats", repeats, low=1)  # before compiling
  _check_shape(shape)
  _check_costs(costs)
  # The memo key holds the shape, not the prompts: a wrong batch would be
  # timed and then served for this shape.
  _check_shape_prompts(shape, prompts_BxP)
  one_hot = bool(getattr(draft, "one_hot_q", False))
  verifier = verifiers_lib.get_verifier(verifier)
  mkey = ("null-draft", model_key(target), shape, sampling, one_hot,
          verifier.spec)
  if memo is not None and mkey in memo:
    return memo[mkey]
  null_draft = NullLM.like(draft)
  call = lambda: loop_lib.speculative_generate(
      target, null_draft, prompts_BxP, prompt_lengths_B, key,
      gamma=shape.gamma, max_new_tokens=shape.max_new_tokens,
      sampling=sampling, verifier=verifier)
  outputs = {}
  seconds = best_times({"": call}, repeats, outputs=outputs)[""]
  rounds = int(jax.device_get(outputs[""].stats.rounds).max())
  out = (seconds - costs.call_s - costs.target_prefill_s) / rounds
  if memo is not None:
    memo[mkey] = out
  return out


# -- One measured cell --------------------------------------------------------


def _tokens_each(results) -> np.ndarray:
  return np.array([int(np.asarray(r.lengths).sum()) for r in results])


def _loop_rounds_each(results) -> np.ndarray:
  return np.array([int(np.asarray(r.stats.rounds).max()) for r in results])


# Resamples of the prompts for a reported statistic's standard error.
BOOTSTRAP_DRAWS = 2000


def _bootstrap_se(statistic: Callable[[np.ndarray], float], n: int
                  ) -> float | None:
  """Standard error of `statistic(indices)` over the n prompts resampled
  with replacement (a fixed seed: the same rows give the same se). It is
  the spread of the number actually reported, a median of ratios or a
  ratio of medians, which no closed form gives. None for fewer than 2."""
  if n < 2:
    return None
  draws = np.random.default_rng(0).integers(0, n, size=(BOOTSTRAP_DRAWS, n))
  return float(np.std([statistic(i) for i in draws], ddof=1))


def held_out_best(seconds_PxG: Any, weights_P: Any = None
                  ) -> tuple[np.ndarray, float]:
  """The fastest of G settings, each unit's pick made on the other units.

  The best of G settings picked and scored on the same timed units is the
  largest of G noisy estimates, so it is biased up (the winner's curse):
  whichever setting's noise ran low wins, and keeps its luck. Here each
  unit p (a prompt, timed under every setting) is scored under the setting
  with the least seconds over the units other than p: a pick that p's own
  noise did not make. That is what tuning on pilot texts gives a user, and
  it is biased down where settings are close (a noisy pick may be the
  worse one); the setting's true best lies between the two.

  Args:
    seconds_PxG: float `[P, G]`, P >= 2 units each timed under all G
      settings (e.g. the fixed gammas), finite and >= 0.
    weights_P: optional int `[P]` >= 0, each unit's copies (a bootstrap
      resample's counts: a unit's copies are all left out of its pick);
      None: one each.

  Returns:
    `(picks_P, seconds)`: int `[P]`, the setting picked for each unit (-1
    where its weight is 0), and the weighted sum over units of the picked
    setting's seconds there.
  """
  seconds_PxG = np.asarray(seconds_PxG, np.float64)
  if seconds_PxG.ndim != 2 or seconds_PxG.shape[0] < 2 or not (
      seconds_PxG.shape[1]):
    raise ValueError("seconds_PxG must be [P, G] with P >= 2 units and G >= "
                     f"1 settings, got shape {seconds_PxG.shape}.")
  if not np.all(np.isfinite(seconds_PxG) & (seconds_PxG >= 0)):
    raise ValueError("seconds_PxG must be finite and >= 0.")
  if weights_P is None:
    weights_P = np.ones(seconds_PxG.shape[0], np.int64)
  weights_P = np.asarray(weights_P)
  if (weights_P.shape != seconds_PxG.shape[:1]
      or not np.issubdtype(weights_P.dtype, np.integer)
      or np.any(weights_P < 0) or np.count_nonzero(weights_P) < 2):
    raise ValueError(f"weights_P must be ints >= 0 of shape "
                     f"{seconds_PxG.shape[:1]} with >= 2 units weighted, "
                     f"got {weights_P!r}.")
  total_G = weights_P @ seconds_PxG
  others_PxG = total_G - weights_P[:, None] * seconds_PxG
  picks_P = np.where(weights_P > 0, np.argmin(others_PxG, axis=1), -1)
  units = np.flatnonzero(weights_P)
  picked = seconds_PxG[units, picks_P[units]]
  return picks_P, float(weights_P[units] @ picked)


def versus_best_fixed(seconds_PxN: Any, fixed: Sequence[int], *,
                      draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> dict:
  """Every decoder against the best of the fixed-gamma ones, with 95%
  bootstrap intervals over the prompts.

  Column 0 is the baseline (`generate`); `fixed` picks the fixed-gamma
  columns. A decoder's speedup is the baseline's total seconds over its
  own. The best fixed gamma is picked on the prompts it is scored on (the
  largest of several noisy speedups: biased up), and again in every
  resample, where each prompt keeps all its repeats (the units every
  decoder was timed in together). Beside it, with P >= 2 prompts, each
  prompt is scored under the fixed gamma the other prompts pick
  (`held_out_best`: biased down where gammas are close), with the same
  resamples.

  Args:
    seconds_PxN: float `[P, N]`, seconds of each of N decoders on each of P
      prompts (summed over repeats), finite and > 0.
    fixed: column indices in [1, N) of the fixed-gamma decoders.
    draws: bootstrap resamples of the prompts.
    seed: the resamples' seed.

  Returns:
    A dict of float64 arrays: `speedup_N`; `best`, the index into `fixed`
    of the best fixed gamma; `vs_best_N` and `vs_best_95_Nx2`, each
    decoder's speedup over the best fixed gamma's and its interval; with P
    >= 2, `held_out_picks_P` (indices into `fixed`), `held_out_speedup`,
    `vs_held_out_N` and `vs_held_out_95_Nx2`.
  """
  seconds_PxN = np.asarray(seconds_PxN, np.float64)
  if seconds_PxN.ndim != 2 or seconds_PxN.shape[1] < 2 or not (
      seconds_PxN.shape[0]):
    raise ValueError("seconds_PxN must be [P, N]: P >= 1 prompts, N >= 2 "
                     "decoders (the baseline first), got shape "
                     f"{seconds_PxN.shape}.")
  if not np.all(np.isfinite(seconds_PxN) & (seconds_PxN > 0)):
    raise ValueError("seconds_PxN must be finite and > 0.")
  num_prompts, num = seconds_PxN.shape
  fixed = [_checks.check_int("fixed[i]", f, low=1, high=num - 1)
           for f in fixed]
  if not fixed:
    raise ValueError("fixed must name at least one fixed-gamma column.")
  draws = _checks.check_int("draws", draws, low=1)
  speedup_N = seconds_PxN[:, 0].sum() / seconds_PxN.sum(0)
  best = int(np.argmax(speedup_N[fixed]))
  draws_KxP = np.random.default_rng(seed).integers(
      0, num_prompts, (draws, num_prompts))
  totals_KxN = seconds_PxN[draws_KxP].sum(1)
  speedup_KxN = totals_KxN[:, :1] / totals_KxN
  best_K = speedup_KxN[:, fixed].max(1)
  out = {"speedup_N": speedup_N, "best": best,
         "vs_best_N": speedup_N / speedup_N[fixed[best]],
         "vs_best_95_Nx2": np.percentile(
             speedup_KxN / best_K[:, None], [2.5, 97.5], axis=0).T}
  if num_prompts >= 2:
    picks_P, held_s = held_out_best(seconds_PxN[:, fixed])
    counts_KxP = np.stack([np.bincount(d, minlength=num_prompts)
                           for d in draws_KxP])
    # A resample of one prompt (its copies) leaves nothing to pick on.
    some_K = np.count_nonzero(counts_KxP, axis=1) >= 2
    held_K = np.array([held_out_best(seconds_PxN[:, fixed], c)[1]
                       for c in counts_KxP[some_K]])
    out.update(
        held_out_picks_P=picks_P,
        held_out_speedup=seconds_PxN[:, 0].sum() / held_s,
        vs_held_out_N=held_s / seconds_PxN.sum(0),
        vs_held_out_95_Nx2=np.percentile(
            held_K[:, None] / totals_KxN[some_K], [2.5, 97.5], axis=0).T)
  return out


# Fields of `compare` that price a loop whose every round drafts costs.gamma:
# the prediction, its decomposition and their ratios. A draft-length rule's
# rounds draft fewer, so under one these are None; what was measured stays.
FIXED_GAMMA_FIELDS = ("predicted_", "efficiency", "decode_efficiency",
                      "factor_", "off", "measured_draft_s",
                      "measured_verify_s")


def compare(costs: LoopCosts, ar_results, ar_seconds, results,
            spec_seconds, null_draft_round_s: float | None = None
            ) -> dict[str, Any]:
  """Measured beside predicted for one loop configuration (a sweep cell).

  `ar_results` / `results` are the generations of the prompts (batch 1 or
  more), `ar_seconds` / `spec_seconds` their call times, taken alternately.
  Every row must run to `costs.max_new_tokens` (no EOS): the prediction and
  the decode split count that many autoregressive steps a call. The results
  must come from a loop of `costs.gamma` (a draft-length rule's gamma_max);
  unless every round drafted that many (a rule's rounds draft fewer), the
  `FIXED_GAMMA_FIELDS` are None.
  A single result may stand for several timed calls of the same inputs and
  key (a benchmark's repeats): its statistics are then counted once and its
  time is the fewest seconds of those calls.
  Statistics come from `specjax.stats.summarize`; the prediction and its
  component-by-component check from `predict` / `decompose`.

  Speedups are medians over prompts, so a burst of load on a shared machine
  moves one ratio, not the cell:
    speedup         end to end: the median of per-prompt ratios of whole
                    calls, tokens/s over tokens/s;
    decode_speedup  prefills and the fixed per-call cost removed, per round:
                    N * ar_round / (loop_rounds * round), the median
                    per-round times of the two loops.
  Their `_se` are bootstrap standard errors of those same statistics over
  the prompts (None for one prompt).
  """
  _check_costs(costs)
  for name, seconds, timed in (("ar_seconds", ar_seconds, ar_results),
                               ("spec_seconds", spec_seconds, results)):
    seconds = np.asarray(seconds)
    # One time per result, or several for a single result (its repeats):
    # else a shorter list would be broadcast over the results.
    if (seconds.ndim != 1 or not seconds.size or seconds.dtype.kind not in "iuf"
        or (len(timed) > 1 and len(seconds) != len(timed))):
      raise ValueError(f"{name} must be one call time per result ({len(timed)}"
                       f"), or any number for a single result; got "
                       f"{seconds!r}.")
    if not np.all(np.isfinite(seconds) & (seconds > 0)):
      raise ValueError(f"{name} must be finite and > 0, got {seconds}.")
  for name, timed in (("ar_results", ar_results), ("results", results)):
    for i, r in enumerate(timed):
      short = np.flatnonzero(np.asarray(r.lengths) != costs.max_new_tokens)
      if short.size:
        # The prediction and the decode split count max_new_tokens steps
        # of the autoregressive loop a call; an EOS-stopped row ran fewer.
        raise ValueError(
            f"{name}[{i}] row {int(short[0])} generated "
            f"{int(np.asarray(r.lengths)[short[0]])} tokens, not "
            f"costs.max_new_tokens = {costs.max_new_tokens}: compare prices "
            "rows that run to their budget. Time generations without eos_id, "
            "with the max_new_tokens of the costs.")
  s = stats.summarize(results)
  for name, g, want in (("ar_results", stats.summarize(ar_results)["gamma"],
                         0), ("results", s["gamma"], costs.gamma)):
    if g != want:
      raise ValueError(f"{name} come from a loop of gamma = {g}, but costs "
                       f"price gamma = {want} (the autoregressive loop: 0): "
                       "pass the costs of the loop that was timed.")
  ar_tokens, tokens = _tokens_each(ar_results), _tokens_each(results)
  ar_rounds, rounds = _loop_rounds_each(ar_results), _loop_rounds_each(results)
  # One result for several timed calls of the same inputs: those calls are
  # repeats of one measurement, which keeps its fewest seconds (see Noise).
  if len(ar_results) == 1:
    ar_seconds = [min(ar_seconds)]
  if len(results) == 1:
    spec_seconds = [min(spec_seconds)]
  ar_fixed = costs.ar_call_s + costs.ar_prefill_s
  spec_fixed = costs.call_s + costs.target_prefill_s + costs.draft_prefill_s
  ar_decode_i = np.asarray(ar_seconds) - ar_fixed
  spec_decode_i = np.asarray(spec_seconds) - spec_fixed
  ratios = (np.asarray(ar_seconds) / ar_tokens) / (np.asarray(spec_seconds)
                                                   / tokens)
  alpha = s["alpha_hat"]
  pred = predict(costs, alpha)
  parts = decompose(
      costs, alpha, round_s=float(np.median(spec_decode_i / rounds)),
      ar_round_s=float(np.median(ar_decode_i / ar_rounds)),
      loop_rounds=float(np.mean(rounds)),
      null_draft_round_s=null_draft_round_s)
  factors = parts.pop("factors")
  speedup = float(np.median(ratios))
  n = ratios.size
  # Each se is the bootstrap spread of the statistic reported beside it:
  # the median of per-prompt ratios, and decompose's ratio of medians.
  ar_step_n, spec_round_n, rounds_n = (np.broadcast_to(x, (n,)) for x in (
      ar_decode_i / ar_rounds, spec_decode_i / rounds, rounds))
  speedup_se = _bootstrap_se(lambda i: np.median(ratios[i]), n)
  decode_se = _bootstrap_se(
      lambda i: costs.max_new_tokens * np.median(ar_step_n[i]) / (
          np.mean(rounds_n[i]) * np.median(spec_round_n[i])), n)
  row = {
      "alpha_hat": alpha, "alpha_se": s["alpha_se"],
      # Per row, prompt by prompt: the figures pool cells over gamma row by
      # row (a greedy text repeats at every gamma).
      "row_accepted": s["row_accepted"], "row_verified": s["row_verified"],
      "one_minus_tv": s["one_minus_tv"],
      "verified": s["verified"], "accepted": s["accepted"],
      "tokens_per_target_call": s["tokens_per_target_call"],
      "tokens_per_target_call_se": s["tokens_per_target_call_se"],
      # The formula with each row's last round cut at its budget.
      "predicted_tokens_per_target_call": s["expected_tokens_per_target_call"],
      "formula_tokens_per_target_call": s["formula_tokens_per_target_call"],
      **costs.as_dict(),
      "ar_tokens_per_s": float(ar_tokens.sum() / np.sum(ar_seconds)),
      "spec_tokens_per_s": float(tokens.sum() / np.sum(spec_seconds)),
      "speedup": speedup, "speedup_se": speedup_se,
      "predicted_speedup": pred["speedup"],
      "efficiency": _ratio(speedup, pred["speedup"]),
      "efficiency_se": (None if speedup_se is None
                        else _ratio(speedup_se, pred["speedup"])),
      **parts,
      "decode_speedup_se": decode_se,
      "decode_efficiency_se": (None if decode_se is None else
                               _ratio(decode_se,
                                      parts["predicted_decode_speedup"])),
      **{f"factor_{k}": v for k, v in factors.items()},
      "accept_hist": s["accept_hist"],
  }
  if np.flatnonzero(s["length_hist"]).tolist() != [costs.gamma]:
    row = {k: (None if k.startswith(FIXED_GAMMA_FIELDS) else v)
           for k, v in row.items()}
  return row
