"""A seeded Monte-Carlo trace of speculative decoding on the toy chains.

One long sequence (96 tokens by default) is generated round by round exactly
as the decode loop does it, with numpy's float64 PCG64 generator, while a
ledger counts target calls (one verification pass per round), draft calls
(gamma per round) and the cost of both. The toy speedup,

  autoregressive cost / speculative cost
    = num_tokens / (target_calls + draft_cost * draft_calls),

sits beside `specjax.accounting.walltime_improvement(alpha, gamma, c)`
evaluated at the trace's mean exact per-position acceptance probability: the
first is what this run cost, the second the i.i.d.-acceptance formula. They
should be close, not equal (acceptance varies with context, the run is
finite, and the last round is truncated).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax import _checks
from specjax import accounting
from specjax.lab import exact
from specjax.lab import markov

DEFAULT_NUM_TOKENS = 96


@dataclasses.dataclass(frozen=True)
class Trace:
  """The outcome and ledger of one seeded speculative run.

  Attributes:
    tokens: int64 `[num_tokens]`, the emitted sequence (truncated at
      num_tokens).
    target_calls: verification passes (= rounds).
    draft_calls: draft steps, gamma per round.
    verified: draft tokens that were checked (up to and including the first
      rejection of each round).
    accepted: draft tokens kept.
    alpha_hat: accepted / verified, the measured acceptance rate.
    one_minus_tv: mean over verified positions of sum_x min(p, q) at that
      position's context: the exact acceptance probability alpha_hat
      estimates.
    tokens_per_target_call: emitted tokens (before truncation) per round.
    toy_speedup: num_tokens / (target_calls + draft_cost * draft_calls).
    estimated_speedup: accounting.walltime_improvement(one_minus_tv, gamma,
      draft_cost).
  """
  tokens: np.ndarray
  target_calls: int
  draft_calls: int
  verified: int
  accepted: int
  alpha_hat: float
  one_minus_tv: float
  tokens_per_target_call: float
  toy_speedup: float
  estimated_speedup: float


def _draw(rng: np.random.Generator, probs_V: np.ndarray) -> int:
  """Inverse-CDF draw that never returns a zero-probability token."""
  cdf_V = np.cumsum(probs_V)
  idx = int(np.searchsorted(cdf_V, rng.random() * cdf_V[-1], side="right"))
  # u * total can round up to the total: fall back to the last token with mass.
  return min(idx, int(np.flatnonzero(probs_V > 0)[-1]))


def run_trace(pair: markov.MarkovPair, gamma: int, draft_cost: float,
              num_tokens: int = DEFAULT_NUM_TOKENS, seed: int = 0,
              rule: str = "exact") -> Trace:
  """Generates `num_tokens` tokens speculatively and returns the ledger.

  Args:
    pair: the target and draft chains.
    gamma: >= 1 draft tokens per round (every round drafts all gamma, the
      last one included, as a fixed-gamma decode loop does).
    draft_cost: c >= 0, the cost of a draft step in target calls.
    num_tokens: >= 1 tokens to emit.
    seed: >= 0; the same seed gives the same trace, bit for bit.
    rule: one of `exact.RULES` (the negative controls run too).

  Returns:
    A `Trace`; `len(trace.tokens) == num_tokens` always.
  """
  if not isinstance(pair, markov.MarkovPair):
    raise TypeError("pair must be a specjax.lab.MarkovPair, got "
                    f"{type(pair).__name__}.")
  gamma = _checks.check_int("gamma", gamma, low=1)
  draft_cost = _checks.check_float("draft_cost", draft_cost)
  if draft_cost < 0:
    raise ValueError(f"draft_cost must be >= 0, got {draft_cost}.")
  num_tokens = _checks.check_int("num_tokens", num_tokens, low=1)
  seed = _checks.check_int("seed", seed, low=0)
  exact._check_rule(rule)  # pylint: disable=protected-access
  p_CxV, q_CxV = pair.target_rows_CxV, pair.draft_rows_CxV
  accept_CxV, fallback_CxV = exact._rule_tables(  # pylint: disable=protected-access
      p_CxV, q_CxV, rule)
  alpha_C = exact.acceptance_rates(pair)
  rng = np.random.default_rng(seed)
  tokens: list[int] = []
  target_calls = draft_calls = verified = accepted = 0
  alpha_sum = 0.0
  context = pair.bos
  while len(tokens) < num_tokens:
    drafts, contexts = [], []
    ctx = context
    for _ in range(gamma):
      x = _draw(rng, q_CxV[ctx])
      drafts.append(x)
      contexts.append(ctx)
      ctx = x
    draft_calls += gamma
    target_calls += 1  # one pass scores [context, x_1..x_gamma]
    emitted = []
    for x, ctx in zip(drafts, contexts):
      verified += 1
      alpha_sum += alpha_C[ctx]
      # u < a(x), drawn for every verified draft (also when a(x) = 1), so
      # the random stream does not depend on the acceptance values.
      if rng.random() < accept_CxV[ctx, x]:
        accepted += 1
        emitted.append(x)
      else:
        emitted.append(_draw(rng, fallback_CxV[ctx]))
        break
    else:
      emitted.append(_draw(rng, p_CxV[drafts[-1]]))
    tokens.extend(emitted)
    context = emitted[-1]
  emitted_total = len(tokens)
  tokens_N = np.asarray(tokens[:num_tokens], dtype=np.int64)
  one_minus_tv = alpha_sum / verified
  return Trace(
      tokens=tokens_N,
      target_calls=target_calls,
      draft_calls=draft_calls,
      verified=verified,
      accepted=accepted,
      alpha_hat=accepted / verified,
      one_minus_tv=float(one_minus_tv),
      tokens_per_target_call=emitted_total / target_calls,
      toy_speedup=num_tokens / (target_calls + draft_cost * draft_calls),
      estimated_speedup=float(accounting.walltime_improvement(
          min(1.0, one_minus_tv), gamma, draft_cost)))
