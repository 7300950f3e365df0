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


def _no_bools(name, value):
  """Refuses a bool anywhere in `value`: inside a list numpy would read
  [True, 0.5] as [1.0, 0.5] (a bare bool has dtype bool, refused anyway)."""
  if isinstance(value, (list, tuple)) and any(
      isinstance(x, (bool, np.bool_))
      for x in np.asarray(value, dtype=object).reshape(-1)):
    raise TypeError(f"{name} must hold numbers, not bools, got {value!r}.")


def _broadcast(**named):
  """Refuses arguments whose shapes do not broadcast, naming them (numpy's
  own error names none)."""
  try:
    np.broadcast_shapes(*(np.shape(v) for v in named.values()))
  except ValueError:
    shapes = ", ".join(f"{k} {np.shape(v)}" for k, v in named.items())
    raise ValueError(f"the shapes of {shapes} do not broadcast together; "
                     "pass scalars or arrays of one shape.") from None


def _real(name, value):
  """`value` as a numpy array after refusing what numpy would coerce into a
  number by accident (strings such as "0.5", bools, None, objects)."""
  _no_bools(name, value)
  v = np.asarray(value)
  if v.dtype.kind not in "iuf":
    raise TypeError(f"{name} must be a real number or an array of them, got "
                    f"{value!r} (dtype {v.dtype}).")
  return v


def _alpha(alpha):
  a = _real("alpha", alpha).astype(np.float64)
  if np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1)):
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}.")
  return a


def _gamma(gamma):
  _no_bools("gamma", gamma)
  g = np.asarray(gamma)
  if not np.issubdtype(g.dtype, np.integer) or np.any(g < 0):
    raise ValueError(f"gamma must be a non-negative integer (one that fits "
                     f"int64), got {gamma!r}.")
  return g


def _cost(name, value):
  v = _real(name, value).astype(np.float64)
  if np.any(~np.isfinite(v)) or np.any(v < 0):
    raise ValueError(f"{name} must be finite and >= 0, got {value!r}.")
  return v


def _scalar(name, checked):
  """A checked array as a 0-d one, for the functions that take scalars only."""
  if checked.ndim:
    raise ValueError(f"{name} must be a scalar here, got shape "
                     f"{checked.shape}; call once per value (or use "
                     "walltime_improvement, which broadcasts).")
  return checked


def expected_tokens_per_pass(alpha, gamma):
  """(1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 at alpha = 1.

  The expected number of tokens one round emits: the accepted prefix plus the
  residual or bonus token.
  """
  # float64 before g + 1: an integer gamma at its dtype's maximum would wrap.
  a, g = _alpha(alpha), _gamma(gamma).astype(np.float64)
  _broadcast(alpha=a, gamma=g)
  # sum_{k=0}^{gamma} a^k = -expm1((g + 1) log a) / (1 - a). 1 - a is exact
  # for a >= 1/2, and expm1 keeps the numerator's digits as a -> 1, where
  # 1 - a^(g+1) would cancel (relative error ~sqrt(eps) near 1 - 1e-8). A
  # huge gamma gives the finite limit 1 / (1 - a); a = 0 gives 1 (log 0 =
  # -inf, expm1(-inf) = -1).
  d = 1 - a
  with np.errstate(divide="ignore", invalid="ignore"):
    closed = -np.expm1((g + 1) * np.log1p(-d)) / d
  # Rounding may leave the closed form an ulp outside [1, g + 1] (gamma = 0
  # at a = 0.75 gives 0.9999999999999999), where no round can be.
  return np.where(a == 1, g + 1, np.clip(closed, 1.0, g + 1))


def walltime_improvement(alpha, gamma, c, r=1.0):
  """Expected speedup over autoregressive decoding: E[tokens] / (gamma c + r)."""
  c, r = _cost("c", c), _cost("r", r)
  if np.any(r <= 0):
    raise ValueError(f"r must be > 0, got {r!r}.")
  _broadcast(alpha=np.asarray(alpha), gamma=np.asarray(gamma), c=c, r=r)
  tokens = expected_tokens_per_pass(alpha, gamma)
  return tokens / (_gamma(gamma).astype(np.float64) * c + r)


def operations_increase(alpha, gamma, c_hat):
  """Expected arithmetic relative to autoregressive decoding.

  (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), where c_hat is
  the draft's arithmetic per token relative to the target's.
  """
  c_hat = _cost("c_hat", c_hat)
  _broadcast(alpha=np.asarray(alpha), gamma=np.asarray(gamma), c_hat=c_hat)
  tokens = expected_tokens_per_pass(alpha, gamma)
  g = _gamma(gamma).astype(np.float64)  # float64: g + 1 must not wrap
  return (g * c_hat + g + 1) / tokens


# optimal_gamma scores every gamma up to max_gamma: 10^12 would ask for 7 TiB.
_MAX_GAMMA_SEARCHED = 10**6


def optimal_gamma(alpha, c, r=1.0, max_gamma: int = 32) -> int:
  """The gamma in [1, max_gamma] that maximises `walltime_improvement`.

  Scalar alpha, c and r; max_gamma <= 10^6 (every gamma up to it is
  scored). Returns 1 also when no gamma beats autoregressive decoding;
  compare `walltime_improvement` with 1 to know whether to speculate.
  """
  max_gamma = _checks.check_int("max_gamma", max_gamma, low=1,
                                high=_MAX_GAMMA_SEARCHED)
  gammas = np.arange(1, max_gamma + 1)
  alpha = _scalar("alpha", _alpha(alpha))
  c, r = _scalar("c", _cost("c", c)), _scalar("r", _cost("r", r))
  speed = walltime_improvement(alpha, gammas, c, r)
  return int(gammas[int(np.argmax(speed))])


# -- The decode loop as it runs: a finite budget, a batch, measured costs -----


def rounds_distribution(alpha, gamma, num_tokens) -> np.ndarray:
  """P(a row needs exactly k rounds to emit `num_tokens` tokens), k = 0..N.

  A round keeps A drafts with P(A = a) = alpha^a (1 - alpha) for a < gamma
  and alpha^gamma for a = gamma, and emits A + 1 tokens, except that the
  last round is cut at the budget: it emits min(A + 1, tokens left). That
  truncation is why tokens per target call of a finite generation sit below
  `expected_tokens_per_pass`. Scalar alpha and gamma (gamma = 0 is
  autoregressive decoding: exactly N rounds).

  Returns:
    float64 `[num_tokens + 1]`, summing to 1.
  """
  a = float(_scalar("alpha", _alpha(alpha)))
  g = int(_scalar("gamma", _gamma(gamma)))
  n = _checks.check_int("num_tokens", num_tokens, low=0)
  # A round cut at the budget emits at most n tokens, so keeping n drafts or
  # more is one outcome: gamma beyond n changes nothing (and 2^62 drafts
  # must not size the list below).
  g = min(g, n)
  # emit_J[j] = P(a round emits j + 1 tokens, before the budget cut).
  emit_J = np.array([a ** j * (1 - a) for j in range(g)] + [a ** g])
  out = np.zeros(n + 1)
  if n == 0:
    out[0] = 1.0
    return out
  # band[i] = P(lo + i tokens still to emit after the rounds so far), every
  # lo + i >= 1: only the band where the mass is, not all n + 1 counts each
  # round (that would be O(n^2) over the n rounds).
  band, lo = np.ones(1), n
  for k in range(1, n + 1):
    # A row with m left emits min(j + 1, m): m - j - 1 left, floor 0. c[t]
    # is the mass at m = lo - (g + 1) + t.
    c = np.convolve(band, emit_J[::-1])
    first = lo - len(emit_J)
    done = max(0, 1 - first)  # entries at m <= 0: rows finished this round
    out[k] = c[:done].sum()
    band, lo = c[done:], first + done
    # The tails below 1e-30 are dropped: over every round far less than
    # the 1e-15 of mass the loop stops at.
    kept = np.flatnonzero(band > 1e-30)
    if not kept.size or band.sum() < 1e-15:
      break
    band, lo = band[kept[0]:kept[-1] + 1], lo + kept[0]
  return out


def expected_rounds(alpha, gamma, num_tokens, batch_size: int = 1) -> float:
  """Expected while_loop iterations to emit `num_tokens` per row.

  A batch runs until its slowest row is done, so for B i.i.d. rows this is
  E[max of B draws] of `rounds_distribution` (batch_size = 1: the mean).
  """
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  cdf_K = np.clip(np.cumsum(rounds_distribution(alpha, gamma, num_tokens)),
                  0.0, 1.0)
  # E[X] = sum_{k >= 0} P(X > k) for X on 0..N.
  return float(np.sum(1.0 - cdf_K[:-1] ** batch_size))


def expected_tokens_per_call(alpha, gamma, num_tokens) -> float:
  """`num_tokens` / expected rounds: tokens per target call of a generation
  of `num_tokens` >= 1, the last round's budget truncation counted. Tends
  to `expected_tokens_per_pass(alpha, gamma)` as num_tokens grows."""
  # 0 tokens take 0 rounds: the ratio has no value, so refuse it by name.
  n = _checks.check_int("num_tokens", num_tokens, low=1)
  return n / expected_rounds(alpha, gamma, n)


def loop_speedup(alpha, gamma, num_tokens, c, r, *, c_window=None,
                 overhead=0.0, batch_size: int = 1) -> float:
  """Decode-only speedup of a speculative loop over the autoregressive one.

  All costs are in units of one autoregressive step (the target's T = 1
  pass plus the loop's own per-step work), measured at the batch size in
  question, so batch-dependent c(B) and r(B) enter directly:

    c:        the draft's 1-token pass (gamma - 1 of them per round),
    c_window: the draft's 2-token catch-up pass that opens every round
              (default c),
    r:        the target's (gamma + 1)-token verify pass,
    overhead: the round's work outside the passes (sampling, coupling,
              bookkeeping).

  speedup = N / (E[loop rounds] * (c_window + (gamma - 1) c + r + overhead)),
  with E[loop rounds] from `expected_rounds` (budget truncation, and the
  slowest of `batch_size` rows). Scalars only; num_tokens >= 1.
  """
  n = _checks.check_int("num_tokens", num_tokens, low=1)
  g = int(_scalar("gamma", _gamma(gamma)))
  if g < 1:
    raise ValueError(f"gamma must be >= 1 for a speculative loop, got {gamma}.")
  c = float(_scalar("c", _cost("c", c)))
  r = float(_scalar("r", _cost("r", r)))
  if r <= 0:
    raise ValueError(f"r must be > 0 (a verify pass costs time), got {r}.")
  cw = c if c_window is None else float(_scalar("c_window",
                                                _cost("c_window", c_window)))
  o = float(_scalar("overhead", _cost("overhead", overhead)))
  per_round = cw + (g - 1) * c + r + o
  if per_round <= 0:
    raise ValueError("the round's cost must be > 0.")
  return n / (expected_rounds(alpha, g, n, batch_size) * per_round)


def batch_speedups(alpha, gamma, num_tokens, batch_sizes, c_B, r_B, *,
                   c_window_B=None, overhead_B=None):
  """`loop_speedup` at each batch size, with that batch's measured costs.

  c_B, r_B (and c_window_B, overhead_B) are per batch size, in units of the
  autoregressive step AT THAT BATCH SIZE: as the batch grows a step stops
  being a weight read and becomes arithmetic, so r(B) rises towards gamma + 1
  and speculation's gain falls. Each is one value per batch size or one
  scalar for all; c_B and r_B are required, r_B > 0. batch_sizes are
  integers >= 1. Returns float64 `[len(batch_sizes)]`.
  """
  _no_bools("batch_sizes", batch_sizes)
  sizes = np.asarray(batch_sizes)
  if sizes.ndim != 1:
    # Flattening a grid would pair its cells with c_B / r_B in an order the
    # caller never chose.
    raise ValueError(f"batch_sizes must be a 1-D sequence of batch sizes, got "
                     f"shape {sizes.shape}.")
  if sizes.size and (not np.issubdtype(sizes.dtype, np.integer)
                     or np.any(sizes < 1)):
    # int(2.7) would silently decode a batch of 2.
    raise ValueError(f"batch_sizes must be integers >= 1, got {batch_sizes!r}.")
  b = [int(x) for x in sizes]
  n = len(b)
  def per_batch(name, x, default):
    if x is None:
      if default is None:
        raise TypeError(f"{name} is required: the cost at each batch size, "
                        "in autoregressive steps at that batch size.")
      x = default
    v = _cost(name, x)
    if v.ndim and v.shape != (n,):
      raise ValueError(f"{name} has shape {v.shape} but batch_sizes has {n} "
                       "entries: give one value per batch size (or a scalar).")
    return np.broadcast_to(v, (n,))
  c_B, r_B = per_batch("c_B", c_B, None), per_batch("r_B", r_B, None)
  if np.any(r_B <= 0):
    raise ValueError(f"r_B must be > 0 (a verify pass costs time), got {r_B}.")
  cw_B = per_batch("c_window_B", c_window_B, c_B)
  o_B = per_batch("overhead_B", overhead_B, 0.0)
  return np.array([loop_speedup(alpha, gamma, num_tokens, c_B[i], r_B[i],
                                c_window=cw_B[i], overhead=o_B[i],
                                batch_size=b[i]) for i in range(n)])


def crossover_batch(batch_sizes, speedups) -> float | None:
  """The batch size at which speculation stops paying (speedup falls to 1).

  Linear interpolation in log(batch) between the last batch with speedup
  >= 1 and the next one below 1. None if speculation never stops paying on
  the grid; the smallest batch if it never pays.
  """
  # _real first: float64 coercion would read "4" as 4.0 and True as 1.0.
  b = _real("batch_sizes", batch_sizes).astype(np.float64)
  s = _real("speedups", speedups).astype(np.float64)
  if b.ndim != 1 or b.shape != s.shape or b.size == 0:
    raise ValueError("batch_sizes and speedups must be 1-D of equal length.")
  # A NaN compares False both ways, so it would slip through the order check
  # and the interpolation alike: refuse it (and inf) before either.
  if not np.all(np.isfinite(b)):
    raise ValueError(f"batch_sizes must be finite, got {b}.")
  if not np.all(np.isfinite(s)):
    raise ValueError(f"speedups must be finite, got {s}; drop the batch sizes "
                     "without a measurement.")
  if np.any(np.diff(b) <= 0) or np.any(b <= 0) or np.any(b != np.round(b)):
    raise ValueError(f"batch_sizes must be increasing integers >= 1, got {b}.")
  if np.any(s <= 0):  # as batch_speedups returns them: ratios of times
    raise ValueError(f"speedups must be > 0 (autoregressive time over "
                     f"speculative time), got {s}.")
  below = np.flatnonzero(s < 1.0)
  if below.size == 0:
    return None
  i = int(below[0])
  if i == 0:
    return float(b[0])
  lo, hi = np.log(b[i - 1]), np.log(b[i])
  frac = (s[i - 1] - 1.0) / (s[i - 1] - s[i])
  return float(np.exp(lo + frac * (hi - lo)))
