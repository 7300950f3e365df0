"""Exact (float64) distributions of the speculative process on toy chains.

The oracle. For a `MarkovPair`, `speculative_distribution` returns the exact
probability of every sequence of the first N emitted tokens under the FULL
speculative process:

  each round, from the committed prefix, the draft samples gamma tokens from
  q (all gamma of them, as a real draft does before verification); they are
  checked left to right, x_i kept with probability min(1, p(x_i) / q(x_i));
  the first rejection emits one token from the fallback and ends the round;
  if all gamma are kept a bonus token is drawn from p; the emitted tokens are
  committed and the next round starts; the output is truncated at N tokens.

It is computed in two steps, neither of which assumes the answer:

  1. `round_distribution` enumerates one round literally: the probability of
     every draft block x_1..x_gamma, every accept/reject outcome, and every
     fallback or bonus token, then sums out what is not emitted (drafts after
     the first rejection, the rejected draft itself). Rejection mass and the
     fallback distribution are computed separately, so the residual algebra
     min(p, q) + (p - q)+ = p is *checked* by the result, not built in.
  2. `chain_blocks`, a dynamic program over committed prefixes, chains
     rounds together (the models are first-order Markov, so a round depends
     on the prefix only through its last token) and truncates the last round
     at N. The other verifiers, stopping rules and trees of the lab reduce a
     round to the same blocks and chain them with it.

`_hidden_state_distribution` is a second, independent derivation (a forward
algorithm over "tokens accepted so far in this round"); the audit checks that
both agree.

Rules (the `rule` argument):
  "exact":          fallback is the residual (p - q)+ / sum (p - q)+.
  "wrong_fallback": fallback resamples from p; a negative control, not exact.
  "always_accept":  every draft token is kept; a negative control.
(the controls are defined once, in `specjax.lab.controls`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specjax import _checks
from specjax import sampling
from specjax.lab import controls
from specjax.lab import markov

RULES = ("exact",) + controls.NAMES

# V ** (gamma + 1) * (V + 1) float64 numbers per round table: cap it at
# 2 ** 24 (128 MiB) so a typo in gamma fails fast instead of swapping.
_MAX_TABLE = 2 ** 24
_MAX_SEQUENCES = 2 ** 22
# A block entry below -_NEGATIVE_TOL is not float64 rounding of a 1 - x
# (~1e-16) but a wrong law.
_NEGATIVE_TOL = 1e-12


def _check_rule(rule: str) -> str:
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
  return rule


def _check_pair(pair) -> markov.MarkovPair:
  if not isinstance(pair, markov.MarkovPair):
    raise TypeError("pair must be a specjax.lab.MarkovPair (see "
                    f"make_markov_pair), got {type(pair).__name__}.")
  return pair


def _check_context(context, vocab: int) -> int:
  """The row of `[C, ...]` tables a text after `context` starts from: V (BOS)
  for None, else the token itself, an int in [0, V - 1]. A -1 would index
  the BOS row and a 2.7 truncate to 2, each silently another law."""
  if context is None:
    return vocab
  return _checks.check_int("context", context, low=0, high=vocab - 1)


def _check_gamma(gamma, vocab: int, name: str = "gamma") -> int:
  """`gamma` as an int >= 1 whose round table fits `_MAX_TABLE`; `name` is
  the caller's argument (`specjax.lab.stopping` says gamma_max)."""
  gamma = _checks.check_int(name, gamma, low=1)
  if (vocab + 1) * vocab ** (gamma + 1) > _MAX_TABLE:
    max_gamma = 1
    while (vocab + 1) * vocab ** (max_gamma + 2) <= _MAX_TABLE:
      max_gamma += 1
    raise ValueError(f"{name}={gamma} is too large to enumerate exactly over "
                     f"{vocab} tokens; use {name} <= {max_gamma}.")
  return gamma


def _check_seq_len(seq_len, vocab: int) -> int:
  seq_len = _checks.check_int("seq_len", seq_len, low=1)
  if vocab ** seq_len > _MAX_SEQUENCES:
    raise ValueError(f"seq_len={seq_len} gives {vocab}**{seq_len} sequences, "
                     f"more than the {_MAX_SEQUENCES} the lab enumerates.")
  return seq_len


def _rule_tables(p_xV: np.ndarray, q_xV: np.ndarray, rule: str):
  """Per-context acceptance probability and fallback distribution.

  Returns (accept_xV, fallback_xV): accept_xV[..., x] is the probability of
  keeping draft token x (the rule's min(1, p/q) or 1), fallback_xV the
  distribution a rejection samples from. The negative controls' tables come
  from their one definition in `specjax.lab.controls`.
  """
  # Divide only where q > p (so the ratio is < 1 and cannot overflow); keep
  # outright where p >= q. q(x) = p(x) = 0: such a draft is never proposed;
  # it is refused, the convention of specjax.coupling (u * q < p).
  over_xV = q_xV > p_xV
  accept_xV = np.where(over_xV, p_xV / np.where(over_xV, q_xV, 1.0),
                       (p_xV > 0).astype(np.float64))
  if rule in controls.CONTROLS:
    return controls.rule_tables(rule, p_xV, accept_xV)
  excess_xV = np.maximum(p_xV - q_xV, 0.0)
  mass_x1 = excess_xV.sum(axis=-1, keepdims=True)
  # Zero residual mass means p == q: rejection cannot happen, so the fallback
  # row is never used; return p there so every row is a distribution.
  residual_xV = np.where(mass_x1 > 0, excess_xV / np.where(
      mass_x1 > 0, mass_x1, 1.0), p_xV)
  return accept_xV, residual_xV


class CouplingTable(NamedTuple):
  """The exact outcome of one accept/reject step, float64, shapes `[..., V]`.

  Attributes:
    accepted: mass of "draft proposes x and it is kept", q(x) a(x).
    rejected: mass of "some draft is rejected and the fallback emits y".
    output: accepted + rejected, the distribution of the emitted token. For
      rule "exact" it equals p up to float64 rounding.
    alpha: `[...]`, probability that the draft token is kept,
      sum_x q(x) a(x) (= 1 - TV(p, q) for "exact").
    reject_mass: `[...]`, 1 - alpha computed as sum_x q(x) (1 - a(x)); for
      "exact" it equals sum_x (p(x) - q(x))+.
  """
  accepted: np.ndarray
  rejected: np.ndarray
  output: np.ndarray
  alpha: np.ndarray
  reject_mass: np.ndarray


def coupling_table(p_xV, q_xV, rule: str = "exact") -> CouplingTable:
  """Exact output distribution of one coupling step, for checking samplers.

  Args:
    p_xV: target probabilities `[..., V]`, V >= 1 (any float dtype;
      computed in float64); every row a law (finite, >= 0, sums to 1).
    q_xV: draft probabilities, broadcastable against p, the same V.
    rule: one of `RULES`.

  Returns:
    A `CouplingTable`. Compare a sampler's empirical token frequencies with
    `.output` and its acceptance rate with `.alpha` (e.g.
    `specjax.coupling_sample` with x ~ q).
  """
  _check_rule(rule)
  p_xV = _checks.check_array("p", p_xV, min_rank=1, kind="f")
  q_xV = _checks.check_array("q", q_xV, min_rank=1, kind="f")
  p_xV = np.asarray(p_xV, dtype=np.float64)
  q_xV = np.asarray(q_xV, dtype=np.float64)
  if p_xV.shape[-1] != q_xV.shape[-1]:
    raise ValueError(f"p and q must share the vocabulary axis: p has "
                     f"{p_xV.shape[-1]} tokens, q has {q_xV.shape[-1]}.")
  # An empty last axis has no law on it; the row-sum check below would pass
  # it (no rows) and the table would claim alpha = 0.
  if p_xV.shape[-1] == 0:
    raise ValueError("p and q need a vocabulary of at least one token (their "
                     f"last axis), got p {p_xV.shape} and q {q_xV.shape}.")
  for name, probs in (("p", p_xV), ("q", q_xV)):
    # An unnormalised row gives an "output" that is not a law at all.
    sampling.check_law_values(name, probs, normalised=True)
  try:
    p_xV, q_xV = np.broadcast_arrays(p_xV, q_xV)
  except ValueError:
    raise ValueError(f"p {p_xV.shape} and q {q_xV.shape} do not broadcast "
                     "against each other.") from None
  accept_xV, fallback_xV = _rule_tables(p_xV, q_xV, rule)
  accepted_xV = q_xV * accept_xV
  reject_mass_x = np.sum(q_xV * (1.0 - accept_xV), axis=-1)
  rejected_xV = reject_mass_x[..., None] * fallback_xV
  return CouplingTable(accepted_xV, rejected_xV, accepted_xV + rejected_xV,
                       accepted_xV.sum(-1), reject_mass_x)


def _axis_shape(ndim: int, axes: tuple[int, ...], sizes: tuple[int, ...]):
  shape = [1] * ndim
  for axis, size in zip(axes, sizes):
    shape[axis] = size
  return tuple(shape)


def round_distribution(pair: markov.MarkovPair, gamma: int,
                       rule: str = "exact") -> list[np.ndarray]:
  """Exact distribution of the tokens one round emits, by literal enumeration.

  Args:
    pair: the target and draft chains.
    gamma: >= 1 draft tokens per round.
    rule: one of `RULES`.

  Returns:
    A list `blocks` of gamma + 1 float64 arrays; `blocks[k - 1]` has shape
    `[C] + [V] * k` (C = V + 1 contexts: V previous tokens, then BOS at index
    V) and holds P(the round emits exactly the k tokens y_1..y_k | context).
    For every context the masses over all k sum to 1 up to rounding.
  """
  pair = _check_pair(pair)
  rule = _check_rule(rule)
  vocab = pair.vocab_size
  gamma = _check_gamma(gamma, vocab)
  num_ctx = vocab + 1
  p_CxV, q_CxV = pair.target_rows_CxV, pair.draft_rows_CxV
  accept_CxV, fallback_CxV = _rule_tables(p_CxV, q_CxV, rule)
  ndim = gamma + 1  # axis 0: context; axis i: draft token x_i

  def pair_table(table_CxV, i):
    """table[x_{i-1}, x_i] broadcast over the (context, x_1..x_gamma) axes."""
    rows = table_CxV if i == 1 else table_CxV[:vocab]
    return rows.reshape(_axis_shape(ndim, (i - 1, i), rows.shape))

  # drafts[c, x_1..x_gamma] = q(x_1 | c) q(x_2 | x_1) ... q(x_gamma | ...).
  drafts = np.ones((num_ctx,) + (1,) * gamma)
  for i in range(1, gamma + 1):
    drafts = drafts * pair_table(q_CxV, i)
  blocks = []
  kept = drafts  # P(draft block, and x_1..x_{i-1} all kept)
  for i in range(1, gamma + 1):
    reject_here = kept * (1.0 - pair_table(accept_CxV, i))
    kept = kept * pair_table(accept_CxV, i)
    # Sum out drafts after x_i (drawn, then discarded), then x_i itself (the
    # rejected token is never emitted): [C, x_1..x_{i-1}].
    prefix = reject_here.sum(axis=tuple(range(i, gamma + 1)))
    fallback = fallback_CxV if i == 1 else fallback_CxV[:vocab]
    fallback = fallback.reshape(_axis_shape(i + 1, (i - 1, i), fallback.shape))
    blocks.append(prefix[..., None] * fallback)
  bonus_rows = p_CxV[:vocab].reshape(_axis_shape(gamma + 2, (gamma, gamma + 1),
                                                 (vocab, vocab)))
  blocks.append(kept[..., None] * bonus_rows)
  return blocks


def chain_blocks(blocks, vocab: int, seq_len: int,
                 context: int | None = None) -> np.ndarray:
  """Chains one round's law into the law of the first `seq_len` tokens.

  Rounds run until at least N tokens are committed; the output is truncated
  at N (a round's tokens past position N are summed out).

  Args:
    blocks: `blocks[k - 1]` is float64 `[V + 1] + [V] * k`, P(a round emits
      exactly these k tokens | the context token), BOS context last. Every
      verifier and stopping rule of the lab reduces a round to this.
    vocab: V.
    seq_len: N >= 1.
    context: the token the text so far ends with (a prompt's last token), or
      None for the start of a sequence (the BOS row).

  Returns:
    float64 `[V] * seq_len`, the probability of every N-token sequence.

  Raises:
    TypeError / ValueError naming the argument: blocks not a list or tuple
    of float arrays, empty, of the wrong shapes, with a NaN, inf or negative
    entry (beyond float64 rounding), or whose rows do not each total 1;
    vocab or seq_len not an int >= 1; context not an int in [0, V - 1].
  """
  vocab = _checks.check_int("vocab", vocab, low=1)
  seq_len = _checks.check_int("seq_len", seq_len, low=1)
  start = _check_context(context, vocab)
  if not isinstance(blocks, (list, tuple)):
    raise TypeError("blocks must be a list of arrays, blocks[k - 1] for the "
                    "rounds of k tokens (e.g. round_distribution(pair, "
                    f"gamma)), got {type(blocks).__name__}.")
  if not blocks:
    raise ValueError("blocks is empty: a round emits at least one token.")
  arrays = []
  for k, block in enumerate(blocks, start=1):
    try:
      block = np.asarray(block, np.float64)
    except (TypeError, ValueError):
      raise TypeError(f"blocks[{k - 1}] must be a float array of shape "
                      f"{(vocab + 1,) + (vocab,) * k}, got "
                      f"{type(block).__name__}.") from None
    if block.shape != (vocab + 1,) + (vocab,) * k:
      raise ValueError(f"blocks[{k - 1}] has shape {block.shape}; a round of "
                       f"{k} tokens over V={vocab} needs "
                       f"{(vocab + 1,) + (vocab,) * k}.")
    # Row totals alone let a -1 and a 2 pass as a law (and chain into a
    # "law" with negative mass): every entry is a probability.
    if not np.all(np.isfinite(block)):
      raise ValueError(f"blocks[{k - 1}] holds NaN or inf; every entry is a "
                       "probability.")
    if block.min() < -_NEGATIVE_TOL:
      at = tuple(int(i) for i in np.unravel_index(block.argmin(),
                                                  block.shape))
      raise ValueError(f"blocks[{k - 1}]{list(at)} = {block[at]:g} is "
                       "negative; every entry is a probability (>= 0).")
    arrays.append(block)
  blocks = arrays
  # Each context's rounds, over every length, are one law.
  mass_C = sum(b.reshape(vocab + 1, -1).sum(-1) for b in blocks)
  if not np.all(np.isfinite(mass_C)) or np.max(np.abs(mass_C - 1)) > 1e-6:
    raise ValueError("blocks must hold, for each context row, a law over the "
                     f"rounds (total mass 1); the masses are {mass_C}.")
  final = np.zeros(vocab ** seq_len)
  # boundary[L]: P(some round ends with exactly L committed tokens, and they
  # are this prefix), flattened over the V**L prefixes.
  boundary = {0: np.ones(1)}
  for length in range(seq_len):
    mass = boundary.pop(length, None)
    if mass is None:
      continue
    for k, block in enumerate(blocks, start=1):
      keep = min(k, seq_len - length)
      if keep < k:
        # Truncation at N: sum out the block tokens past position N.
        block = block.reshape(block.shape[:keep + 1] + (-1,)).sum(-1)
      rows = block.reshape(vocab + 1, -1)
      if length == 0:
        grown = rows[start]
      else:  # mass[prefix] * block[last token of prefix, y...], flattened
        grown = (mass.reshape(-1, vocab)[:, :, None]
                 * rows[:vocab][None]).reshape(-1)
      total = length + keep
      if total == seq_len:
        final += grown
      else:
        boundary[total] = boundary.get(total, 0.0) + grown
  return final.reshape((vocab,) * seq_len)


def speculative_distribution(pair: markov.MarkovPair, gamma: int,
                             seq_len: int, rule: str = "exact") -> np.ndarray:
  """Exact distribution of the first `seq_len` tokens the process emits.

  Args:
    pair: the target and draft chains.
    gamma: >= 1 draft tokens per round.
    seq_len: N >= 1; rounds continue until at least N tokens are committed and
      the output is truncated at N.
    rule: one of `RULES`.

  Returns:
    float64 `[V] * seq_len`: the probability of every N-token sequence. For
    rule "exact" it equals `target_distribution(pair, seq_len)` up to float64
    rounding; it sums to 1 up to rounding for every rule.
  """
  pair = _check_pair(pair)
  vocab = pair.vocab_size
  seq_len = _check_seq_len(seq_len, vocab)
  blocks = round_distribution(pair, gamma, rule)
  return chain_blocks(blocks, vocab, seq_len)


def _hidden_state_distribution(pair: markov.MarkovPair, gamma: int,
                               seq_len: int, rule: str = "exact"):
  """Same result as `speculative_distribution`, derived independently.

  A forward algorithm emitting one token at a time with the hidden state j =
  drafts kept so far in this round: from (j < gamma, context c) the next token
  is a kept draft with mass q(x|c) a(x|c) (-> j + 1) or a fallback token with
  mass [sum_x q(x|c)(1 - a(x|c))] f(y|c) (-> 0); from (gamma, c) it is a bonus
  token from p(.|c) (-> 0).
  """
  vocab = pair.vocab_size
  p_CxV = pair.target_rows_CxV
  table = coupling_table(p_CxV, pair.draft_rows_CxV, rule)
  # forward[s, j]: P(emitted sequence s, hidden state j); start: BOS, j = 0.
  forward = np.zeros((1, gamma + 1))
  forward[0, 0] = 1.0
  ctx = np.array([vocab])
  for _ in range(seq_len):
    accepted_xV = table.accepted[ctx]
    new = np.zeros((forward.shape[0], vocab, gamma + 1))
    new[:, :, 1:] = forward[:, None, :gamma] * accepted_xV[:, :, None]
    new[:, :, 0] = (forward[:, :gamma].sum(1)[:, None] * table.rejected[ctx]
                    + forward[:, gamma][:, None] * p_CxV[ctx])
    forward = new.reshape(-1, gamma + 1)
    ctx = np.tile(np.arange(vocab), forward.shape[0] // vocab)
  return forward.sum(-1).reshape((vocab,) * seq_len)


def target_distribution(pair: markov.MarkovPair, seq_len: int) -> np.ndarray:
  """Exact target distribution of N-token sequences, float64 `[V] * seq_len`.

  p(x_1) p(x_2 | x_1) ... p(x_N | x_{N-1}): what autoregressive sampling from
  the target emits.
  """
  pair = _check_pair(pair)
  vocab = pair.vocab_size
  seq_len = _check_seq_len(seq_len, vocab)
  probs = pair.target_init_V
  for _ in range(seq_len - 1):
    probs = (probs.reshape(-1, vocab)[:, :, None]
             * pair.target_trans_VxV[None]).reshape(-1)
  return probs.reshape((vocab,) * seq_len)


def tv(a, b) -> float:
  """Total variation 0.5 * sum |a - b| over all entries, in float64."""
  a = np.asarray(a, dtype=np.float64)
  b = np.asarray(b, dtype=np.float64)
  if a.shape != b.shape:
    raise ValueError(f"a {a.shape} and b {b.shape} must have the same shape.")
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    raise ValueError("tv needs finite a and b (a NaN would make it NaN).")
  return 0.5 * float(np.abs(a - b).sum())


def exact_tv(pair: markov.MarkovPair, gamma: int, seq_len: int,
             rule: str = "exact") -> float:
  """TV between the process's and the target's N-token distributions.

  0 up to float64 rounding (~1e-16) for rule "exact"; positive for the
  negative controls whenever the draft differs from the target where it
  matters.
  """
  return tv(speculative_distribution(pair, gamma, seq_len, rule),
            target_distribution(pair, seq_len))


def acceptance_rates(pair: markov.MarkovPair) -> np.ndarray:
  """alpha(c) = sum_x min(p(x|c), q(x|c)) for the C = V + 1 contexts, `[C]`.

  The last entry is the BOS context (the first token).
  """
  pair = _check_pair(pair)
  return np.minimum(pair.target_rows_CxV, pair.draft_rows_CxV).sum(-1)
