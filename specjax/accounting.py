"""Throughput accounting for speculative decoding (Leviathan et al. 2023, §3).

alpha: per-token acceptance probability (1 - TV averaged over positions).
gamma: draft tokens proposed per round.
c:     cost of one draft step, in target decode steps.
r:     cost of the target's verification pass on gamma + 1 tokens, in target
       decode steps (1 in the papers' memory-bound regime; 1.3 to 2 on CPUs).

These are plain numpy functions that broadcast over array arguments; they
model i.i.d. acceptance, so measured numbers should be compared with them,
not replaced by them.
"""

from __future__ import annotations

import numpy as np

from specjax import _checks


def _alpha(alpha):
  a = np.asarray(alpha, dtype=np.float64)
  if np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1)):
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}.")
  return a


def _gamma(gamma):
  g = np.asarray(gamma)
  if not np.issubdtype(g.dtype, np.integer) or np.any(g < 0):
    raise ValueError(f"gamma must be a non-negative integer, got {gamma!r}.")
  return g


def _cost(name, value):
  v = np.asarray(value, dtype=np.float64)
  if np.any(~np.isfinite(v)) or np.any(v < 0):
    raise ValueError(f"{name} must be finite and >= 0, got {value!r}.")
  return v


def expected_tokens_per_pass(alpha, gamma):
  """(1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 at alpha = 1.

  The expected number of tokens one round emits: the accepted prefix plus the
  residual or bonus token.
  """
  a, g = _alpha(alpha), _gamma(gamma)
  # sum_{k=0}^{gamma} a^k, written so that alpha -> 1 is continuous.
  with np.errstate(divide="ignore", invalid="ignore"):
    closed = (1 - a ** (g + 1)) / (1 - a)
  return np.where(a == 1, g + 1.0, closed)


def walltime_improvement(alpha, gamma, c, r=1.0):
  """Expected speedup over autoregressive decoding: E[tokens] / (gamma c + r)."""
  c, r = _cost("c", c), _cost("r", r)
  if np.any(r <= 0):
    raise ValueError(f"r must be > 0, got {r!r}.")
  return expected_tokens_per_pass(alpha, gamma) / (np.asarray(gamma) * c + r)


def operations_increase(alpha, gamma, c_hat):
  """Expected arithmetic relative to autoregressive decoding.

  (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), where c_hat is
  the draft's arithmetic per token relative to the target's.
  """
  c_hat = _cost("c_hat", c_hat)
  return ((np.asarray(gamma) * c_hat + np.asarray(gamma) + 1)
          / expected_tokens_per_pass(alpha, gamma))


def optimal_gamma(alpha, c, r=1.0, max_gamma: int = 32) -> int:
  """The gamma in [1, max_gamma] that maximises `walltime_improvement`.

  Scalar alpha, c and r. Returns 1 also when no gamma beats autoregressive
  decoding; compare `walltime_improvement` with 1 to know whether to speculate.
  """
  max_gamma = _checks.check_int("max_gamma", max_gamma, low=1)
  gammas = np.arange(1, max_gamma + 1)
  speed = walltime_improvement(float(alpha), gammas, float(c), float(r))
  return int(gammas[int(np.argmax(speed))])
