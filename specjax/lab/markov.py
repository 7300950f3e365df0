"""Toy Markov language models for the rejection-sampling lab.

A target and a draft over a tiny vocabulary (8 tokens by default), each a
first-order Markov chain: an initial distribution `[V]` for the first token
and a transition matrix `[V, V]` (row = previous token, column = next token).
Every distribution of the speculative process over such models is small
enough to enumerate exactly, which is what makes the lab an oracle.

Two knobs shape the pair:

  certainty:   sharpness of every row, rows = softmax(certainty * z) with
               z ~ N(0, 1). 0 gives uniform rows; large values (e.g. 1000)
               underflow to exact zeros, i.e. nearly one-hot (greedy-like)
               rows, which exercises the q(x) = 0 and p == q edge cases.
  draft_match: the draft is the mixture draft_match * target
               + (1 - draft_match) * an independent chain of the same
               certainty. 1 means draft == target (zero residual mass),
               0 means an unrelated draft.

Everything here is float64 numpy: the lab is deliberately independent of the
JAX implementation it audits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax import _checks

VOCAB_SIZE = 8
DEFAULT_CERTAINTY = 1.5
DEFAULT_DRAFT_MATCH = 0.8
DEFAULT_SEED = 0

# Row sums must be 1 to this tolerance; float64 normalisation reaches ~1e-16.
_ROW_SUM_TOL = 1e-12


def _check_rows(name: str, rows_xV: np.ndarray, vocab: int) -> np.ndarray:
  rows_xV = _checks.check_array(name, rows_xV, min_rank=1, kind="f")
  rows_xV = np.asarray(rows_xV, dtype=np.float64)
  if rows_xV.shape[-1] != vocab:
    raise ValueError(f"{name} must have {vocab} columns (the vocabulary), got "
                     f"shape {rows_xV.shape}.")
  if not np.all(np.isfinite(rows_xV)) or np.any(rows_xV < 0):
    raise ValueError(f"{name} must be finite and non-negative.")
  worst = float(np.max(np.abs(rows_xV.sum(-1) - 1.0)))
  if worst > _ROW_SUM_TOL:
    raise ValueError(f"{name} rows must sum to 1 (within {_ROW_SUM_TOL}); the "
                     f"worst row is off by {worst:.3g}.")
  return rows_xV


@dataclasses.dataclass(frozen=True, eq=False)
class MarkovPair:
  """A target and a draft first-order Markov chain over V tokens (float64).

  Attributes:
    target_init_V: p(x_1), shape `[V]`.
    target_trans_VxV: p(x_t | x_{t-1}), shape `[V, V]`, rows sum to 1.
    draft_init_V: q(x_1), shape `[V]`.
    draft_trans_VxV: q(x_t | x_{t-1}), shape `[V, V]`.

  Construct directly from arrays (validated: shapes, non-negative, rows sum to
  1 within 1e-12) or from knobs with `make_markov_pair`.
  """
  target_init_V: np.ndarray
  target_trans_VxV: np.ndarray
  draft_init_V: np.ndarray
  draft_trans_VxV: np.ndarray

  def __post_init__(self):
    trans = _checks.check_array("target_trans_VxV", self.target_trans_VxV,
                                rank=2, kind="f")
    vocab = trans.shape[-1]
    if trans.shape != (vocab, vocab) or vocab < 2:
      raise ValueError("target_trans_VxV must be square [V, V] with V >= 2, "
                       f"got shape {tuple(trans.shape)}.")
    for name in ("target_init_V", "draft_init_V"):
      value = _check_rows(name, getattr(self, name), vocab)
      if value.ndim != 1:
        raise ValueError(f"{name} must have shape [{vocab}], got "
                         f"{value.shape}.")
      object.__setattr__(self, name, value)
    for name in ("target_trans_VxV", "draft_trans_VxV"):
      value = _check_rows(name, getattr(self, name), vocab)
      if value.shape != (vocab, vocab):
        raise ValueError(f"{name} must have shape [{vocab}, {vocab}], got "
                         f"{value.shape}.")
      object.__setattr__(self, name, value)

  @property
  def vocab_size(self) -> int:
    return self.target_trans_VxV.shape[-1]

  @property
  def bos(self) -> int:
    """Context index of the start of the sequence in the `_CxV` row tables."""
    return self.vocab_size

  @property
  def target_rows_CxV(self) -> np.ndarray:
    """p(. | context) for C = V + 1 contexts: V previous tokens, then BOS."""
    return np.concatenate([self.target_trans_VxV, self.target_init_V[None]])

  @property
  def draft_rows_CxV(self) -> np.ndarray:
    """q(. | context), same layout as `target_rows_CxV`."""
    return np.concatenate([self.draft_trans_VxV, self.draft_init_V[None]])


def _softmax_rows(logits_xV: np.ndarray) -> np.ndarray:
  shifted_xV = logits_xV - logits_xV.max(axis=-1, keepdims=True)
  unnorm_xV = np.exp(shifted_xV)  # the max entry is exp(0) = 1: never all-zero
  return unnorm_xV / unnorm_xV.sum(axis=-1, keepdims=True)


def _random_chain(rng: np.random.Generator, certainty: float,
                  vocab: int) -> tuple[np.ndarray, np.ndarray]:
  z_CxV = rng.standard_normal((vocab + 1, vocab))
  rows_CxV = _softmax_rows(certainty * z_CxV)
  return rows_CxV[vocab], rows_CxV[:vocab]


# Rows are softmax(certainty * z), z ~ N(0, 1), in float64: past ~1e308 /
# |z| the logits overflow to inf and the rows turn NaN. 1e6 is far from that
# for any normal draw, and far past sharp: at 1000 rows already hold exact
# zeros, and at 1e6 every gap in z above 1e-3 underflows.
MAX_CERTAINTY = 1e6


def check_knobs(certainty, draft_match, seed, vocab_size=VOCAB_SIZE):
  """Validates the lab's model knobs; returns them as (float, float, int, int).

  Raises TypeError / ValueError naming the argument for a non-number, a NaN or
  infinity, certainty outside [0, MAX_CERTAINTY], draft_match outside [0, 1],
  seed < 0, or vocab_size outside [2, 64].
  """
  certainty = _checks.check_float("certainty", certainty)
  if not 0 <= certainty <= MAX_CERTAINTY:
    raise ValueError(f"certainty must be in [0, {MAX_CERTAINTY:g}] (0 = "
                     "uniform rows; rows are one-hot long before the bound, "
                     "and far past it the softmax overflows to NaN), got "
                     f"{certainty:g}.")
  draft_match = _checks.check_float("draft_match", draft_match)
  if not 0.0 <= draft_match <= 1.0:
    raise ValueError(f"draft_match must be in [0, 1] (1 = draft equals "
                     f"target), got {draft_match}.")
  seed = _checks.check_int("seed", seed, low=0)
  vocab_size = _checks.check_int("vocab_size", vocab_size, low=2, high=64)
  return certainty, draft_match, seed, vocab_size


def make_markov_pair(certainty: float = DEFAULT_CERTAINTY,
                     draft_match: float = DEFAULT_DRAFT_MATCH,
                     seed: int = DEFAULT_SEED,
                     vocab_size: int = VOCAB_SIZE) -> MarkovPair:
  """Builds the lab's target and draft chains from knobs.

  Args:
    certainty: >= 0, sharpness of every row (see module docstring).
    draft_match: in [0, 1], the weight of the target in the draft mixture.
    seed: >= 0; the same seed and knobs always give the same pair, and the
      target does not depend on draft_match (so sweeping draft_match moves
      only the draft).
    vocab_size: V, 8 by default.

  Returns:
    A `MarkovPair` of float64 arrays whose rows sum to 1 within 1e-12.
  """
  certainty, draft_match, seed, vocab_size = check_knobs(
      certainty, draft_match, seed, vocab_size)
  # Separate streams for target and noise chain: the target is a function of
  # (certainty, seed) only.
  target_rng, noise_rng = (np.random.default_rng(s) for s in
                           np.random.SeedSequence(seed).spawn(2))
  p_init_V, p_trans_VxV = _random_chain(target_rng, certainty, vocab_size)
  n_init_V, n_trans_VxV = _random_chain(noise_rng, certainty, vocab_size)
  mix = lambda p, n: draft_match * p + (1.0 - draft_match) * n
  q_init_V, q_trans_VxV = mix(p_init_V, n_init_V), mix(p_trans_VxV,
                                                       n_trans_VxV)
  # No renormalisation: a convex mixture of normalised rows already sums to 1
  # up to rounding, and skipping it keeps draft == target bitwise at
  # draft_match = 1 (1.0 * p + 0.0 * n == p), the zero-residual edge case.
  return MarkovPair(p_init_V, p_trans_VxV, q_init_V, q_trans_VxV)
