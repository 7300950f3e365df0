"""Statistical exactness harness: is a sampler's output distributed as claimed?

Speculative sampling is exact, so its output distribution can be checked
against the target distribution it claims to reproduce. The harness draws many
samples (10^6 for a single position), and decides with two independent tests,
each run at the same significance level (default 1e-6, so that false failures
are essentially impossible while real defects at n = 10^6 are rejected with
p-values far below it):

1. Pearson's chi-square goodness-of-fit test. Cells whose expected count is
   below `min_expected` (5, Cochran's rule) are pooled: they are sorted by
   expected probability and merged greedily into bins of expected count
   >= `min_expected` (a leftover partial bin joins the last pooled bin, or the
   smallest unpooled cell). The partition depends only on the expected
   probabilities, never on the data, so the test stays valid on huge sparse
   outcome spaces (V = 50,000 with most expected counts below 1). Fails when
   the p-value is below the significance level.
2. A total-variation bound. The empirical TV, 0.5 * sum_x |count(x)/n - p(x)|,
   is compared with a bound it exceeds with probability at most the
   significance level under exact sampling:

     E[TV] <= 0.5 * sum_x min(sqrt(p(x)(1 - p(x))/n), 2 p(x)(1 - p(x)))
     TV <= E[TV] + sqrt(log(1/significance) / (2n))   (McDiarmid)

   The first line is Jensen (per cell, E|X - np| <= sqrt(np(1-p))) and the
   triangle inequality over the n draws (E|X - np| <= 2np(1-p)); the second is
   the bounded-differences inequality (one sample moves the TV by <= 1/n).
   This is a distribution-specific refinement of the sqrt(V/n) rate.

In addition, any sample of an outcome with expected probability exactly 0 (or
an id outside [0, V)) is an immediate failure: an exact sampler never emits a
token that top-k / top-p masked out.

Acceptance rates are checked with an exact two-sided binomial test against the
theoretical rate sum_x min(p(x), q(x)); the z-score and standard error
sqrt(r(1-r)/n) are reported alongside.

Outcomes are integer ids in [0, V). To check whole generations, map each
sequence to an id (e.g. mixed radix over the vocabulary) and pass the exact
sequence distribution as `expected_probs`.

The module also holds two deliberately WRONG couplings, the negative controls
that every exactness test must reject: `wrong_fallback_coupling` (resamples
from p instead of the residual on rejection) and `always_accept_coupling`;
both run the decoder's control verifiers on one key (`specjax.get_verifier`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decode import verifiers

DEFAULT_SIGNIFICANCE = 1e-6
MIN_EXPECTED = 5.0

# Tolerance on sum(expected_probs) == 1 (float32 softmax over 50k tokens is
# off by ~1e-6); the probabilities are renormalised in float64 afterwards.
_SUM_TOLERANCE = 1e-4


def _x64():
  """Context manager enabling float64 locally (jax.enable_x64 on new JAX)."""
  enable = getattr(jax, "enable_x64", None)
  if enable is None:  # JAX < 0.7.
    # pylint: disable-next=g-import-not-at-top
    from jax.experimental import enable_x64 as enable
  return enable(True)


def _chi2_sf(statistic: float, dof: int) -> float:
  """P(chi2_dof >= statistic), computed in float64."""
  if dof <= 0:
    return 1.0
  with _x64():
    return float(jax.scipy.special.gammaincc(
        jnp.float64(dof / 2), jnp.float64(statistic / 2)))


def _binomial_two_sided(k: int, n: int, rate: float) -> float:
  """Two-sided exact binomial p-value: 2 * min(P(X >= k), P(X <= k)), <= 1."""
  with _x64():
    betainc = jax.scipy.special.betainc
    upper = 1.0 if k == 0 else float(betainc(
        jnp.float64(k), jnp.float64(n - k + 1), jnp.float64(rate)))
    lower = 1.0 if k == n else float(betainc(
        jnp.float64(n - k), jnp.float64(k + 1), jnp.float64(1 - rate)))
  return min(1.0, 2 * min(upper, lower))


def _check_significance(significance) -> float:
  s = _checks.check_float("significance", significance)
  if not 0.0 < s < 1.0:
    raise ValueError(f"significance must be in (0, 1), got {s}.")
  return s


def _normalised(name: str, probs_V: Any) -> np.ndarray:
  """Validates a probability vector `[V]`; returns it as float64, sum 1."""
  probs_V = _checks.check_array(name, probs_V, rank=1, kind="f")
  probs_V = np.asarray(probs_V, dtype=np.float64)
  if probs_V.shape[0] == 0:
    raise ValueError(f"{name} must have at least one outcome.")
  if not np.all(np.isfinite(probs_V)) or np.any(probs_V < 0):
    raise ValueError(f"{name} must be finite and non-negative.")
  total = probs_V.sum()
  if abs(total - 1.0) > _SUM_TOLERANCE:
    raise ValueError(f"{name} must sum to 1 (up to {_SUM_TOLERANCE}), got sum "
                     f"{total!r}.")
  return probs_V / total


def sampling_tv_bound(expected_probs: Any, n: int, *,
                      significance: float = DEFAULT_SIGNIFICANCE) -> float:
  """High-probability bound on the empirical TV of n exact samples.

  Args:
    expected_probs: float `[V]`, the true distribution (sums to 1).
    n: number of i.i.d. samples, >= 1.
    significance: failure probability of the bound.

  Returns:
    b such that P(0.5 * sum_x |count(x)/n - p(x)| > b) <= significance when
    the samples are exactly distributed as `expected_probs`:
    b = 0.5 * sum_x min(sqrt(p(1-p)/n), 2 p(1-p)) + sqrt(log(1/sig) / (2n)).
  """
  p_V = _normalised("expected_probs", expected_probs)
  n = _checks.check_int("n", n, low=1)
  significance = _check_significance(significance)
  var_V = p_V * (1 - p_V)
  mean_bound = 0.5 * np.sum(np.minimum(np.sqrt(var_V / n), 2 * var_V))
  return float(mean_bound + math.sqrt(math.log(1 / significance) / (2 * n)))


def _pool(expected_K: np.ndarray, observed_K: np.ndarray, min_expected: float):
  """Merges cells of expected count < min_expected; returns (E_B, O_B, pooled).

  Small cells are sorted by expected count and merged greedily, each bin
  closing as soon as its expected count reaches `min_expected`. A partial
  last bin joins the previous pooled bin, else the smallest large cell, else
  stays alone (then every cell is small and there is a single bin).
  """
  small_K = expected_K < min_expected
  big_e, big_o = expected_K[~small_K], observed_K[~small_K]
  order = np.argsort(expected_K[small_K], kind="stable")
  small_e, small_o = expected_K[small_K][order], observed_K[small_K][order]
  num_pooled = int(small_e.size)
  if num_pooled == 0:
    return big_e, big_o, 0
  cum_e = np.cumsum(small_e)
  ends = []  # inclusive index of the last cell of each full bin
  reached = 0.0
  while True:
    j = int(np.searchsorted(cum_e, reached + min_expected, side="left"))
    if j >= cum_e.size:
      break
    ends.append(j)
    reached = cum_e[j]
  if not ends or ends[-1] != cum_e.size - 1:
    if ends:  # fold the partial tail into the last full bin
      ends[-1] = cum_e.size - 1
    elif big_e.size:  # no full bin: fold everything into the smallest big cell
      i = int(np.argmin(big_e))
      big_e, big_o = big_e.copy(), big_o.copy()
      big_e[i] += cum_e[-1]
      big_o[i] += small_o.sum()
      return big_e, big_o, num_pooled
    else:
      ends = [cum_e.size - 1]
  starts = np.concatenate([[0], np.asarray(ends[:-1]) + 1]).astype(np.int64)
  pooled_e = np.add.reduceat(small_e, starts)
  pooled_o = np.add.reduceat(small_o, starts)
  return (np.concatenate([big_e, pooled_e]), np.concatenate([big_o, pooled_o]),
          num_pooled)


def _fmt_p(p: float) -> str:
  return "<1e-300" if p < 1e-300 else f"{p:.3g}"


@dataclasses.dataclass(frozen=True)
class DistributionResult:
  """Outcome of `check_distribution` / `check_counts`.

  Attributes:
    n: number of samples.
    num_outcomes: size V of the outcome space.
    num_bins: chi-square cells after pooling (outcomes of probability 0 are
      excluded; they are covered by `num_impossible`).
    num_pooled: outcomes whose expected count was < min_expected and that were
      merged into pooled bins.
    chi2: Pearson's statistic over the bins.
    dof: num_bins - 1.
    p_value: P(chi2_dof >= chi2), over the outcomes of positive probability
      (impossible outcomes are judged by `num_impossible`, not here).
    tv: empirical total-variation distance to the expected distribution.
    tv_bound: `sampling_tv_bound` at this n and significance.
    num_impossible: samples on outcomes of expected probability 0 or outside
      [0, V).
    significance: the level both tests were run at.
    passed: no impossible outcome, p_value >= significance, tv <= tv_bound.
  """
  n: int
  num_outcomes: int
  num_bins: int
  num_pooled: int
  chi2: float
  dof: int
  p_value: float
  tv: float
  tv_bound: float
  num_impossible: int
  significance: float
  passed: bool

  def __str__(self) -> str:
    verdict = "PASS" if self.passed else "FAIL"
    return (
        f"distribution {verdict}: n={self.n}, V={self.num_outcomes} "
        f"({self.num_bins} chi-square bins, {self.num_pooled} outcomes "
        f"pooled); chi2={self.chi2:.4g} on {self.dof} dof, "
        f"p={_fmt_p(self.p_value)} (reject below {self.significance:g}); "
        f"TV={self.tv:.3g} vs bound {self.tv_bound:.3g}; "
        f"impossible outcomes: {self.num_impossible}")


def check_counts(counts: Any, expected_probs: Any, *,
                 significance: float = DEFAULT_SIGNIFICANCE,
                 min_expected: float = MIN_EXPECTED,
                 num_out_of_range: int = 0) -> DistributionResult:
  """Tests whether outcome counts are consistent with `expected_probs`.

  Args:
    counts: int `[V]`, how often each outcome id occurred (non-negative).
    expected_probs: float `[V]`, the exact distribution (sums to 1 up to
      1e-4; renormalised in float64).
    significance: level of the chi-square test and of the TV bound; each has
      false-failure probability <= significance under exact sampling.
    min_expected: cells with a smaller expected count are pooled.
    num_out_of_range: samples whose id fell outside [0, V) (impossible).

  Returns:
    A `DistributionResult`; `passed` is the decision.
  """
  p_V = _normalised("expected_probs", expected_probs)
  counts = _checks.check_array("counts", counts, rank=1, kind="i")
  counts_V = np.asarray(counts, dtype=np.int64)
  if counts_V.shape != p_V.shape:
    raise ValueError(f"counts has {counts_V.shape[0]} outcomes but "
                     f"expected_probs has {p_V.shape[0]}.")
  if np.any(counts_V < 0):
    raise ValueError("counts must be non-negative.")
  significance = _check_significance(significance)
  min_expected = _checks.check_float("min_expected", min_expected)
  if min_expected <= 0:
    raise ValueError(f"min_expected must be > 0, got {min_expected}.")
  num_out_of_range = _checks.check_int("num_out_of_range", num_out_of_range,
                                       low=0)
  n = int(counts_V.sum()) + num_out_of_range
  if n == 0:
    raise ValueError("no samples: counts are all zero.")

  support_V = p_V > 0
  num_impossible = int(counts_V[~support_V].sum()) + num_out_of_range
  expected_B, observed_B, num_pooled = _pool(
      n * p_V[support_V], counts_V[support_V].astype(np.float64), min_expected)
  chi2 = float(np.sum((observed_B - expected_B) ** 2 / expected_B))
  dof = int(expected_B.size) - 1
  p_value = _chi2_sf(chi2, dof)
  tv = 0.5 * (float(np.sum(np.abs(counts_V / n - p_V)))
              + num_out_of_range / n)
  tv_bound = sampling_tv_bound(p_V, n, significance=significance)
  passed = num_impossible == 0 and p_value >= significance and tv <= tv_bound
  return DistributionResult(
      n=n, num_outcomes=int(p_V.size), num_bins=int(expected_B.size),
      num_pooled=num_pooled, chi2=chi2, dof=dof, p_value=p_value, tv=tv,
      tv_bound=tv_bound, num_impossible=num_impossible,
      significance=significance, passed=bool(passed))


def check_distribution(
    samples: Any, expected_probs: Any, *,
    significance: float = DEFAULT_SIGNIFICANCE,
    min_expected: float = MIN_EXPECTED) -> DistributionResult:
  """Tests whether i.i.d. samples are distributed as `expected_probs`.

  Args:
    samples: int array of any shape (flattened): outcome ids, e.g. tokens, or
      ids the caller assigned to whole sequences. Ids outside [0, V) count as
      impossible outcomes.
    expected_probs: float `[V]`, the exact distribution over the ids.
    significance: see `check_counts`.
    min_expected: see `check_counts`.

  Returns:
    A `DistributionResult` (see the module docstring for the decision rule).
  """
  samples = _checks.check_array("samples", samples, kind="i")
  ids_N = np.asarray(samples).reshape(-1).astype(np.int64)
  num_outcomes = _checks.check_array("expected_probs", expected_probs,
                                     rank=1).shape[0]
  in_range_N = (ids_N >= 0) & (ids_N < num_outcomes)
  counts_V = np.bincount(ids_N[in_range_N], minlength=num_outcomes)
  return check_counts(counts_V, expected_probs, significance=significance,
                      min_expected=min_expected,
                      num_out_of_range=int(ids_N.size - in_range_N.sum()))


@dataclasses.dataclass(frozen=True)
class AcceptanceResult:
  """Outcome of `check_acceptance`.

  Attributes:
    n: number of verified draft tokens.
    accepted: how many were kept.
    rate: accepted / n.
    expected_rate: the theoretical rate, sum_x min(p(x), q(x)).
    standard_error: sqrt(r (1 - r) / n) at r = expected_rate.
    z: (rate - expected_rate) / standard_error (+-inf when the standard error
      is 0 and the rates differ, 0 when they agree).
    p_value: exact two-sided binomial p-value.
    significance: the level of the test.
    passed: p_value >= significance.
  """
  n: int
  accepted: int
  rate: float
  expected_rate: float
  standard_error: float
  z: float
  p_value: float
  significance: float
  passed: bool

  def __str__(self) -> str:
    verdict = "PASS" if self.passed else "FAIL"
    return (f"acceptance {verdict}: rate={self.rate:.5f} vs expected "
            f"{self.expected_rate:.5f} +- {self.standard_error:.2g} (1 s.e., "
            f"n={self.n}); z={self.z:.3g}, p={_fmt_p(self.p_value)} (reject "
            f"below {self.significance:g})")


def check_acceptance(accepted: Any, expected_rate: float, *,
                     significance: float = DEFAULT_SIGNIFICANCE
                     ) -> AcceptanceResult:
  """Tests an observed acceptance indicator against its theoretical rate.

  Args:
    accepted: bool array of any shape, one entry per verified draft token,
      assumed i.i.d. Bernoulli(expected_rate) under the null.
    expected_rate: in [0, 1], e.g. `acceptance_probability(p, q)`.
    significance: the test's level (false-failure probability).

  Returns:
    An `AcceptanceResult` with the exact binomial decision and the z-score.
  """
  accepted = _checks.check_array("accepted", accepted)
  if accepted.dtype != np.bool_:
    raise TypeError(
        f"accepted must be a bool array, got dtype {accepted.dtype}.")
  flat = np.asarray(accepted).reshape(-1)
  n = int(flat.size)
  if n == 0:
    raise ValueError("accepted is empty.")
  r = _checks.check_float("expected_rate", expected_rate)
  if not 0.0 <= r <= 1.0:
    raise ValueError(f"expected_rate must be in [0, 1], got {r}.")
  significance = _check_significance(significance)
  k = int(flat.sum())
  rate = k / n
  se = math.sqrt(r * (1 - r) / n)
  if se > 0:
    z = (rate - r) / se
  else:
    z = 0.0 if rate == r else math.copysign(math.inf, rate - r)
  p_value = _binomial_two_sided(k, n, r)
  return AcceptanceResult(n=n, accepted=k, rate=rate, expected_rate=r,
                          standard_error=se, z=z, p_value=p_value,
                          significance=significance,
                          passed=bool(p_value >= significance))


@dataclasses.dataclass(frozen=True)
class CouplingResult:
  """Outcome of `check_coupling`: the output law and the acceptance rate.

  Attributes:
    output: emitted tokens vs p.
    acceptance: accepted flags vs sum_x min(p(x), q(x)).
    tv_pq: TV(p, q) of the normalised inputs (the theoretical rejection rate).
    passed: both checks passed.
  """
  output: DistributionResult
  acceptance: AcceptanceResult
  tv_pq: float
  passed: bool

  def __str__(self) -> str:
    verdict = "PASS" if self.passed else "FAIL"
    return (f"coupling {verdict} (TV(p, q)={self.tv_pq:.4g})\n  {self.output}"
            f"\n  {self.acceptance}")


def _draw_categorical(key: jax.Array, probs_V: np.ndarray,
                      n: int) -> np.ndarray:
  """n exact i.i.d. draws from float64 `probs_V` (host inverse CDF): int32 [n].

  Uses 53-bit uniforms and numpy's sequential cumsum, so outcomes of
  probability 0 are never drawn and the CDF is monotone.
  """
  bits = np.asarray(jax.random.bits(key, (2, n), jnp.uint32), dtype=np.uint64)
  u_N = ((bits[0] >> np.uint64(5)).astype(np.float64) * 2.0**26
         + (bits[1] >> np.uint64(6)).astype(np.float64)) / 2.0**53
  cdf_V = np.cumsum(probs_V)
  idx_N = np.searchsorted(cdf_V, u_N * cdf_V[-1], side="right")
  last_positive = int(np.flatnonzero(probs_V > 0)[-1])
  return np.minimum(idx_N, last_positive).astype(np.int32)


CouplingFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array],
                      tuple[jax.Array, jax.Array]]


def check_coupling(coupling_fn: CouplingFn, p_V: Any, q_V: Any, *,
                   key: jax.Array, n: int = 10**6,
                   significance: float = DEFAULT_SIGNIFICANCE,
                   min_expected: float = MIN_EXPECTED) -> CouplingResult:
  """Runs a coupling n times at one position and checks it statistically.

  Draws n draft tokens exactly from q (on the host, float64), calls
  `coupling_fn(key, p_V, q_V, draft_N) -> (token_N, accepted_N)` once with p
  and q of shape `[V]` broadcast over the n drafts, and checks that the tokens
  are distributed as p and that the acceptance rate is sum min(p, q).

  Args:
    coupling_fn: e.g. `jax.jit(specjax.coupling_sample)` or a negative control.
    p_V: float `[V]` target probabilities (passed to coupling_fn as given).
    q_V: float `[V]` draft probabilities.
    key: PRNG key; split into the draft key and the coupling key.
    n: number of draft tokens.
    significance: level of every test (see the module docstring).
    min_expected: chi-square pooling threshold.

  Returns:
    A `CouplingResult`; `passed` is the decision.
  """
  p_V = _checks.check_array("p", p_V, rank=1, kind="f")
  q_V = _checks.check_array("q", q_V, rank=1, kind="f")
  if p_V.shape != q_V.shape:
    raise ValueError(f"p and q must have the same vocabulary: shapes "
                     f"{tuple(p_V.shape)} and {tuple(q_V.shape)}.")
  p64_V, q64_V = _normalised("p", p_V), _normalised("q", q_V)
  n = _checks.check_int("n", n, low=1)
  key = _checks.as_single_key("key", key)
  draft_key, coupling_key = jax.random.split(key)
  draft_N = _draw_categorical(draft_key, q64_V, n)
  token_N, accepted_N = coupling_fn(coupling_key, jnp.asarray(p_V),
                                    jnp.asarray(q_V), jnp.asarray(draft_N))
  token_N, accepted_N = np.asarray(token_N), np.asarray(accepted_N)
  if token_N.shape != (n,) or accepted_N.shape != (n,):
    raise ValueError(f"coupling_fn must return token and accepted of shape "
                     f"({n},), got {token_N.shape} and {accepted_N.shape}.")
  output = check_distribution(token_N, p64_V, significance=significance,
                              min_expected=min_expected)
  acceptance = check_acceptance(
      accepted_N, float(np.minimum(p64_V, q64_V).sum()),
      significance=significance)
  tv_pq = float(0.5 * np.abs(p64_V - q64_V).sum())
  return CouplingResult(output=output, acceptance=acceptance, tv_pq=tv_pq,
                        passed=output.passed and acceptance.passed)


# Negative controls: deliberately wrong couplings that exactness tests must
# reject, with the signature and shape rules of `specjax.coupling_sample`
# (single key only): the decoder's own control verifiers
# (`specjax.decode.verifiers.controls`), on one key's uniforms.


def _control(name, key, p_xV, q_xV, draft_token_x):
  p_xV = jnp.asarray(_checks.check_array("p", p_xV, min_rank=1, kind="f"))
  q_xV = jnp.asarray(_checks.check_array("q", q_xV, min_rank=1, kind="f"))
  draft_x = jnp.asarray(_checks.check_array("draft_token", draft_token_x,
                                            kind="i")).astype(jnp.int32)
  u_x2 = jax.random.uniform(_checks.as_single_key("key", key),
                            draft_x.shape + (2,), dtype=p_xV.dtype)
  rule = verifiers.get_verifier(name).coupling_rule
  return rule(u_x2[..., 0], u_x2[..., 1], p_xV, q_xV, draft_x)


def wrong_fallback_coupling(key: jax.Array, p_xV: jax.Array, q_xV: jax.Array,
                            draft_token_x: jax.Array
                            ) -> tuple[jax.Array, jax.Array]:
  """WRONG on purpose: on rejection resamples from p instead of the residual.

  Accepts exactly like `coupling_sample` (so its acceptance rate is right),
  but its output law is min(p, q) + TV(p, q) * p, which differs from p
  unless p == q or p and q have disjoint supports.
  """
  return _control("wrong_fallback", key, p_xV, q_xV, draft_token_x)


def always_accept_coupling(key: jax.Array, p_xV: jax.Array, q_xV: jax.Array,
                           draft_token_x: jax.Array
                           ) -> tuple[jax.Array, jax.Array]:
  """WRONG on purpose: keeps every draft token, so its output law is q."""
  return _control("always_accept", key, p_xV, q_xV, draft_token_x)
