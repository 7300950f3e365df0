"""Exact enumeration of speculative decoding with an adaptive draft length.

Extends the lab's oracle (`exact.py`) to the rule the decode loop implements
(`specjax.decode.draft_length`): each round the draft proposes up to
`gamma_max` tokens and a stopping rule fixes the row's draft length g from
the drafts; drafts x_1..x_g are judged left to right; at the first rejection
the residual is emitted; if all g are kept and g < gamma_max, the row emits
the coupled output at position g + 1 (x_{g+1} kept with min(1, p/q), else a
residual draw); if g = gamma_max, a bonus token from p.

A stopping rule is a function `stop(i, context, drafts) -> bool` over the
integers: whether to stop after the i-th draft (1-based), given the round's
context token (V for BOS) and the tuple of all gamma_max drafts. A rule that
reads only `drafts[:i]` (and the context) is exact; so, less obviously, is
one that reads x_{i+1}, the draft whose coupling emits the row's last token
(that token is the same whether the row stops or not). A rule that reads
x_{i+2} is not: rows that continue then judge a selected x_{i+2} against a q
it is no longer drawn from. `confidence_rule` (the loop's) and
`peeking_rule(ahead=2)` (the negative control) build one of each from the
draft's own q; `exact_tv` shows the first at 0 and the second positive.

A probe round (the Goodput rule's width 0) is the stop at g = 0: x_1 alone is
judged and the coupled output at position 1 is the round's one token. A
`probe(context) -> bool`, decided before drafting, marks the rounds that
probe.

Every function checks its arguments before enumerating, raising TypeError /
ValueError naming the argument: pair must be a `MarkovPair`; gamma_max an int
in [1, the cap of `exact.round_distribution`] (the enumeration is
(V + 1) * V ** gamma_max blocks: past the cap it would run for hours);
context a token in [0, V - 1] or V (BOS); stop and probe callables;
threshold a probability in [0, 1]; ahead an int >= 0.
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from specjax import _checks
from specjax.lab import exact
from specjax.lab import markov

StopFn = Callable[[int, int, tuple[int, ...]], bool]
ProbeFn = Callable[[int], bool]

# pylint: disable=protected-access
_check_pair = exact._check_pair


def _check_gamma_max(gamma_max, vocab: int) -> int:
  # The cap of exact.round_distribution: every function here enumerates the
  # V ** gamma_max draft blocks, so a larger gamma_max would not finish.
  return exact._check_gamma(gamma_max, vocab, name="gamma_max")


def _check_stop(stop, probe=None) -> None:
  # Neither is called until deep in the enumeration, where a non-callable
  # would fail as "object is not callable", far from the argument.
  if not callable(stop):
    raise TypeError("stop must be a callable stop(i, context, drafts) -> bool"
                    " (e.g. confidence_rule(pair, 0.5)), got "
                    f"{type(stop).__name__}.")
  if probe is not None and not callable(probe):
    raise TypeError("probe must be None or a callable probe(context) -> bool,"
                    f" got {type(probe).__name__}.")


def _check_threshold(threshold) -> float:
  # Checked here, not when the rule first runs deep in an enumeration. It is
  # compared with probabilities: outside [0, 1] it means "never" or "always"
  # stop, which 0 and 1 already say (as specjax.decode.draft_length).
  threshold = _checks.check_float("threshold", threshold)
  if not 0.0 <= threshold <= 1.0:
    raise ValueError(f"threshold is a probability in [0, 1], got {threshold}.")
  return threshold


def confidence_rule(pair: markov.MarkovPair, threshold: float) -> StopFn:
  """Stop after x_i when max q(. | x_{i-1}) < threshold (the loop's rule).

  Refuses a pair that is not a `MarkovPair` and a threshold that is not a
  real number in [0, 1] (a bool, a string, NaN).
  """
  pair = _check_pair(pair)
  threshold = _check_threshold(threshold)
  q_CxV = pair.draft_rows_CxV

  def stop(i, context, drafts):
    previous = context if i == 1 else drafts[i - 2]
    return bool(q_CxV[previous].max() < threshold)
  return stop


def peeking_rule(pair: markov.MarkovPair, threshold: float,
                 ahead: int = 2) -> StopFn:
  """Stop after x_i when the draft `ahead` positions on, x_{i+ahead}, has
  q(x_{i+ahead} | x_{i+ahead-1}) < threshold.

  ahead = 1 reads x_{i+1}, the draft whose coupling emits the row's last
  token: the emitted token there is the same whether the row stops or not,
  so the process stays exact (the lab shows TV 0). ahead = 2 is the negative
  control: the rows that continue past x_{i+1} judge an x_{i+2} selected by
  the rule (no longer distributed as the q it is judged against), and the
  output is no longer distributed as p.

  ahead = 0 reads x_i itself, drafts[:i] only: exact. A negative ahead is
  refused (at i = 1 it would index drafts from the end), as are a non-int
  ahead, a threshold outside [0, 1] and a pair that is not a `MarkovPair`.
  An x_{i+ahead} past the block never stops the row.
  """
  pair = _check_pair(pair)
  threshold = _check_threshold(threshold)
  ahead = _checks.check_int("ahead", ahead, low=0)
  q_CxV = pair.draft_rows_CxV

  def stop(i, context, drafts):
    j = i + ahead - 1  # index of x_{i+ahead} in drafts
    if j >= len(drafts):
      return False
    previous = context if j == 0 else drafts[j - 1]
    return bool(q_CxV[previous, drafts[j]] < threshold)
  return stop


def round_distribution(pair: markov.MarkovPair, gamma_max: int,
                       stop: StopFn, rule: str = "exact",
                       probe: ProbeFn | None = None) -> list[np.ndarray]:
  """Exact law of one round's emitted tokens, by enumerating every draft block.

  `probe(context)` True: that round is a probe (g = 0, module doc).

  Returns gamma_max + 1 arrays in the layout of `exact.round_distribution`:
  `blocks[k - 1]` has shape `[C] + [V] * k` and holds P(the round emits
  exactly y_1..y_k | context).

  Refuses (module doc) a bad pair, gamma_max, stop, rule or probe.
  """
  pair = _check_pair(pair)
  vocab = pair.vocab_size
  gamma_max = _check_gamma_max(gamma_max, vocab)
  _check_stop(stop, probe)
  p_CxV, q_CxV = pair.target_rows_CxV, pair.draft_rows_CxV
  exact.coupling_table(p_CxV, q_CxV, rule)  # validates p, q and the rule
  accept_CxV, fallback_CxV = exact._rule_tables(p_CxV, q_CxV, rule)
  blocks = [np.zeros((vocab + 1,) + (vocab,) * k)
            for k in range(1, gamma_max + 2)]
  for context in range(vocab + 1):
    for drafts in itertools.product(range(vocab), repeat=gamma_max):
      prev = [context] + list(drafts[:-1])
      mass = np.prod([q_CxV[prev[i], drafts[i]] for i in range(gamma_max)])
      if mass == 0:
        continue
      g = 0 if probe is not None and probe(context) else next(
          (i for i in range(1, gamma_max + 1) if stop(i, context, drafts)),
          gamma_max)
      kept = mass
      for j in range(g):  # judge x_{j+1}; on rejection emit the fallback
        a = accept_CxV[prev[j], drafts[j]]
        blocks[j][(context,) + drafts[:j]] += (
            kept * (1 - a) * fallback_CxV[prev[j]])
        kept *= a
      if g == gamma_max:
        blocks[g][(context,) + drafts[:g]] += kept * p_CxV[drafts[g - 1]]
      else:
        # All g kept: the coupled output at position g + 1 is the last token.
        a = accept_CxV[prev[g], drafts[g]]
        last = kept * (1 - a) * fallback_CxV[prev[g]]
        last[drafts[g]] += kept * a
        blocks[g][(context,) + drafts[:g]] += last
  return blocks


def speculative_distribution(pair: markov.MarkovPair, gamma_max: int,
                             stop: StopFn, seq_len: int,
                             rule: str = "exact",
                             probe: ProbeFn | None = None) -> np.ndarray:
  """Exact law of the first `seq_len` tokens with the stopping rule (and
  probe rounds where `probe(context)`); refuses what `round_distribution`
  does, and a seq_len the lab cannot enumerate."""
  pair = _check_pair(pair)
  vocab = pair.vocab_size
  seq_len = exact._check_seq_len(seq_len, vocab)
  blocks = round_distribution(pair, gamma_max, stop, rule, probe)
  return exact.chain_blocks(blocks, vocab, seq_len)


def exact_tv(pair: markov.MarkovPair, gamma_max: int, stop: StopFn,
             seq_len: int, rule: str = "exact",
             probe: ProbeFn | None = None) -> float:
  """TV between the stopped process's and the target's N-token laws."""
  return exact.tv(speculative_distribution(pair, gamma_max, stop, seq_len,
                                           rule, probe),
                  exact.target_distribution(pair, seq_len))


def expected_draft_length(pair: markov.MarkovPair, gamma_max: int,
                          stop: StopFn, context: int) -> float:
  """E[g] in one round from `context`: how much the rule shortens drafts.

  context: the round's context token, in [0, V - 1], or V (`pair.bos`) for
  the start of a sequence. Refuses (module doc) a bad pair, gamma_max, stop
  or context.
  """
  pair = _check_pair(pair)
  gamma_max = _check_gamma_max(gamma_max, pair.vocab_size)
  _check_stop(stop)
  # Context V is BOS (module doc); -1 would index the BOS row silently.
  context = _checks.check_int("context", context, low=0,
                              high=pair.vocab_size)
  q_CxV = pair.draft_rows_CxV
  total = 0.0
  for drafts in itertools.product(range(pair.vocab_size), repeat=gamma_max):
    prev = [context] + list(drafts[:-1])
    mass = np.prod([q_CxV[prev[i], drafts[i]] for i in range(gamma_max)])
    g = next((i for i in range(1, gamma_max + 1)
              if stop(i, context, drafts)), gamma_max)
    total += mass * g
  return total
