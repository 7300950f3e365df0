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

Outcomes are integer ids in [0, V). Whole generations are checked the same
way, over the outcomes "these K tokens after this prompt":
`generation_law` enumerates all V**K continuations and scores them with the
model's own forward pass (`__call__` from an empty cache) under the sampling
transform, `generation_ids` maps sequences to ids (cut after the first EOS),
and `check_generation` runs both tests on generated rows against that law.
`toy_transformer` builds the tiny Transformers with peaked laws such checks
need: under a near-uniform law every rule looks exact.

The module also holds two deliberately WRONG couplings, the negative controls
that every exactness test must reject: `wrong_fallback_coupling` (resamples
from p instead of the residual on rejection) and `always_accept_coupling`;
both run the decoder's control verifiers on one key (`specjax.get_verifier`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import sampling as sampling_lib
from specjax.decode import verifiers
from specjax.models import transformer

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


# Whole generations: the exact law of K tokens after a prompt, by enumeration.

# Continuations `generation_law` enumerates by default at most: 4**10 (V = 4,
# K = 10) or 16**5, each scored at K positions; beyond that, enumerating is
# the wrong tool (check a position or a pair of positions at a time).
MAX_SEQUENCES = 1 << 20

# Rows per forward pass of the enumeration: one compiled program per
# (model, prompt length, K) whatever the number of continuations.
_CHUNK_ROWS = 1 << 14


def _check_vocab_size(vocab_size) -> int:
  return _checks.check_int("vocab_size", vocab_size, low=1)


def _check_eos(eos_id, vocab_size: int) -> int | None:
  if eos_id is None:
    return None
  return _checks.check_int("eos_id", eos_id, low=0, high=vocab_size - 1)


def _radix(vocab_size: int, eos_id: int | None) -> int:
  """Digits per position: the tokens, and with an EOS a padding digit V."""
  return vocab_size + (eos_id is not None)


def _check_id_range(name: str, vocab_size: int, eos_id: int | None,
                    num_tokens: int) -> None:
  radix = _radix(vocab_size, eos_id)
  if radix ** num_tokens > np.iinfo(np.int64).max:
    digits = (f"vocab_size + 1 = {radix} (the padding digit after eos_id)"
              if eos_id is not None else f"vocab_size = {radix}")
    raise ValueError(
        f"{name}: {num_tokens} tokens in radix {digits} overflow int64 "
        "outcome ids; check fewer tokens at a time.")


def generation_ids(tokens_NxK: Any, vocab_size: int, *,
                   eos_id: int | None = None) -> np.ndarray:
  """Maps each generated row to one outcome id: int64 `[N]`.

  The row is read as a number in radix V (V = vocab_size), first token most
  significant. With `eos_id`, the radix is V + 1 and every position after
  the row's first EOS reads as the padding digit V, whatever it holds, so
  sequences that differ only past their EOS are one outcome (the decoder
  fills them with `pad_id`). A row holding an id outside [0, V) before its
  first EOS (at any position without `eos_id`) gets id -1, which no law
  gives positive probability: `check_distribution` counts it impossible.

  Args:
    tokens_NxK: int `[N, K]` (K >= 1), e.g. `GenerationResult.tokens`.
    vocab_size: V, the model's vocabulary (>= 1).
    eos_id: None, or the id in [0, V) that ends a row.

  Returns:
    int64 `[N]` ids in [0, radix**K), or -1 (see above). Ids of the same
    (vocab_size, K, eos_id) are comparable with `generation_law`'s.
  """
  tokens_NxK = _checks.check_array("tokens_NxK", tokens_NxK, rank=2, kind="i")
  vocab_size = _check_vocab_size(vocab_size)
  eos_id = _check_eos(eos_id, vocab_size)
  num_tokens = tokens_NxK.shape[1]
  if num_tokens < 1:
    raise ValueError("tokens_NxK must hold at least one token per row, got "
                     f"shape {tuple(tokens_NxK.shape)}.")
  _check_id_range("tokens_NxK", vocab_size, eos_id, num_tokens)
  radix = _radix(vocab_size, eos_id)
  tokens_NxK = np.asarray(tokens_NxK, np.int64)
  if eos_id is not None:
    # Positions after the first EOS: the cumulative count of EOS before them
    # is positive.
    is_eos_NxK = tokens_NxK == eos_id
    after_NxK = (np.cumsum(is_eos_NxK, axis=1) - is_eos_NxK) > 0
    tokens_NxK = np.where(after_NxK, vocab_size, tokens_NxK)
    real_NxK = ~after_NxK
  else:
    real_NxK = np.ones(tokens_NxK.shape, bool)
  bad_N = (real_NxK & ((tokens_NxK < 0) | (tokens_NxK >= vocab_size))).any(1)
  weights_K = radix ** np.arange(num_tokens - 1, -1, -1, dtype=np.int64)
  ids_N = np.where(bad_N[:, None], 0, tokens_NxK) @ weights_K
  return np.where(bad_N, -1, ids_N).astype(np.int64)


@functools.partial(jax.jit, static_argnames=("first",))
def _scored_logits(model, tokens_BxT, first):
  """`model`'s logits at new positions >= first, from an empty cache."""
  cache = model.init_cache(tokens_BxT.shape[0], tokens_BxT.shape[1])
  logits_BxTxV, _ = model(tokens_BxT, cache)
  return logits_BxTxV[:, first:]


def _check_model(model) -> int:
  """The vocabulary of a `CausalLM` (see `specjax.models.protocol`)."""
  if not (callable(model) and callable(getattr(model, "init_cache", None))
          and hasattr(model, "vocab_size")):
    raise TypeError(
        "model must be a CausalLM (vocab_size, init_cache(batch_size, "
        "max_len) and __call__(tokens_BxT, cache) -> (logits, cache)), got "
        f"{type(model).__name__}.")
  return _checks.check_int("model.vocab_size", model.vocab_size, low=1)


def _check_law_args(model, prompt_P, num_tokens, sampling, eos_id,
                    max_sequences):
  """Validated (vocab_size, prompt_P, num_tokens, sampling, eos_id)."""
  vocab_size = _check_model(model)
  prompt_P = _checks.check_array("prompt_P", prompt_P, rank=1, kind="i")
  if prompt_P.shape[0] < 1:
    raise ValueError("prompt_P must hold at least one token: the first "
                     "generated token is scored at its last position.")
  _checks.check_token_range("prompt_P", prompt_P, vocab_size)
  num_tokens = _checks.check_int("num_tokens", num_tokens, low=1)
  if sampling is None:
    sampling = sampling_lib.SamplingConfig()
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError("sampling must be a specjax.SamplingConfig or None (T = "
                    f"1), got {type(sampling).__name__}.")
  sampling.check_vocab(vocab_size)
  eos_id = _check_eos(eos_id, vocab_size)
  max_sequences = _checks.check_int("max_sequences", max_sequences, low=1)
  if vocab_size ** num_tokens > max_sequences:
    raise ValueError(
        f"generation_law enumerates vocab_size**num_tokens = {vocab_size}**"
        f"{num_tokens} = {vocab_size ** num_tokens:,} continuations, more "
        f"than max_sequences={max_sequences:,}: lower num_tokens, use a "
        "model with a smaller vocabulary, or raise max_sequences.")
  _check_id_range("num_tokens", vocab_size, eos_id, num_tokens)
  width = prompt_P.shape[0] + num_tokens - 1
  limit = getattr(model, "max_positions", None)
  if limit is not None and width > limit:
    raise ValueError(
        f"prompt_P ({prompt_P.shape[0]} tokens) and num_tokens={num_tokens} "
        f"need {width} positions; the model has max_positions={limit}.")
  return (vocab_size, np.asarray(prompt_P, np.int32), num_tokens, sampling,
          eos_id)


def generation_law(model: Any, prompt_P: Any, num_tokens: int,
                   sampling: sampling_lib.SamplingConfig | None = None, *,
                   eos_id: int | None = None,
                   max_sequences: int = MAX_SEQUENCES
                   ) -> tuple[np.ndarray, np.ndarray]:
  """The exact law of `num_tokens` tokens sampled from `model` after a prompt.

  Enumerates all V**K continuations (V = model.vocab_size, K = num_tokens),
  scores each with the model's own forward pass (`__call__` on prompt +
  continuation from an empty `init_cache`, jitted, in chunks of rows), turns
  the logits into probabilities with `specjax.sampling.probabilities` (the
  transform the decoder samples), and multiplies each sequence's K
  per-position probabilities in float64. With `eos_id`, a sequence ends at
  its first EOS: later positions contribute no factor and sequences that
  differ only past their EOS are one outcome (`generation_ids`). This is
  the target's law, which any exact decoder (`specjax.generate`, or
  `specjax.speculative_generate` with an exact verifier) must sample.

  Args:
    model: a `CausalLM` (e.g. `toy_transformer(...)`), pure and jit-able.
    prompt_P: int `[P]` (P >= 1) token ids in [0, V).
    num_tokens: K >= 1, the generated tokens the law covers.
    sampling: the `SamplingConfig` the generation used (temperature,
      top-k, top-p); None is `SamplingConfig()` (T = 1), the decoder's
      default.
    eos_id: None, or the id in [0, V) that ends a row.
    max_sequences: the most continuations (V**K) to enumerate; more is
      refused with a ValueError before any work.

  Returns:
    `(ids_M, law_M)`: int64 `[M]` sorted outcome ids (`generation_ids` of
    the continuations: M = V**K without EOS, fewer with it) and float64
    `[M]` their probabilities (summing to 1 up to float32 rounding of the
    model's probabilities; outcomes the sampling transform masks have 0).
  """
  vocab_size, prompt_P, num_tokens, sampling, eos_id = _check_law_args(
      model, prompt_P, num_tokens, sampling, eos_id, max_sequences)
  num_seqs, num_prompt = vocab_size ** num_tokens, prompt_P.shape[0]
  # Continuation m is m's digits in radix V (itertools.product order).
  weights_K = vocab_size ** np.arange(num_tokens - 1, -1, -1, dtype=np.int64)
  seqs_MxK = ((np.arange(num_seqs, dtype=np.int64)[:, None] // weights_K)
              % vocab_size).astype(np.int32)
  # The last token is scored, never fed: P + K - 1 positions per row.
  inputs_MxT = np.concatenate(
      [np.broadcast_to(prompt_P, (num_seqs, num_prompt)), seqs_MxK[:, :-1]],
      axis=1)
  rows = min(num_seqs, _CHUNK_ROWS)
  probs_MxK = np.empty((num_seqs, num_tokens))
  for start in range(0, num_seqs, rows):
    chunk_CxT = inputs_MxT[start:start + rows]
    num_real = chunk_CxT.shape[0]
    if num_real < rows:  # the last chunk, padded to the compiled shape
      chunk_CxT = np.concatenate([chunk_CxT, np.broadcast_to(
          chunk_CxT[:1], (rows - num_real, chunk_CxT.shape[1]))])
    logits_CxKxV = _scored_logits(model, jnp.asarray(chunk_CxT),
                                  first=num_prompt - 1)
    # Eagerly: refuses NaN or +inf logits, naming the row.
    p_CxKxV = np.asarray(sampling_lib.probabilities(logits_CxKxV, sampling),
                         np.float64)[:num_real]
    probs_MxK[start:start + num_real] = np.take_along_axis(
        p_CxKxV, seqs_MxK[start:start + num_real, :, None], axis=2)[..., 0]
  if eos_id is not None:
    is_eos_MxK = seqs_MxK == eos_id
    after_MxK = (np.cumsum(is_eos_MxK, axis=1) - is_eos_MxK) > 0
    probs_MxK = np.where(after_MxK, 1.0, probs_MxK)
  law_M = probs_MxK.prod(axis=1)
  # Continuations that differ only past their EOS share an id and a
  # probability (their factors past it are 1): keep one of each.
  ids_M, first_M = np.unique(generation_ids(seqs_MxK, vocab_size,
                                            eos_id=eos_id),
                             return_index=True)
  return ids_M, law_M[first_M]


def check_generation(tokens_NxK: Any, model: Any, prompt_P: Any,
                     sampling: sampling_lib.SamplingConfig | None = None, *,
                     eos_id: int | None = None,
                     significance: float = DEFAULT_SIGNIFICANCE,
                     min_expected: float = MIN_EXPECTED,
                     max_sequences: int = MAX_SEQUENCES
                     ) -> DistributionResult:
  """Tests whether generated rows are exact samples of `model` after a prompt.

  Each row must be an independent generation of K tokens continuing the
  same `prompt_P` (e.g. `speculative_generate(...).tokens` on N copies of
  it, or one prompt's rows of a ragged batch). The rows' `generation_ids`
  are tested with `check_distribution` against `generation_law(model,
  prompt_P, K, sampling, eos_id=eos_id)`; a row outside the law's outcomes
  (e.g. a padding id before its EOS) counts as an outcome of probability 0,
  so a single one fails the check. Generate with a `pad_id` outside [0, V)
  so that a row cut short without an EOS is such a row, not a sequence of
  real tokens.

  Args:
    tokens_NxK: int `[N, K]` (N, K >= 1) generated tokens, padded after EOS.
    model: the target: the `CausalLM` whose law the rows must follow.
    prompt_P: int `[P]`, the prompt every row continues.
    sampling: the `SamplingConfig` the rows were generated with (None:
      `SamplingConfig()`, T = 1).
    eos_id: the EOS the generation stopped rows at, or None.
    significance: see `check_counts`.
    min_expected: see `check_counts`.
    max_sequences: see `generation_law`.

  Returns:
    A `DistributionResult` over the law's outcomes plus one impossible
    outcome; `passed` is the decision.
  """
  tokens_NxK = _checks.check_array("tokens_NxK", tokens_NxK, rank=2, kind="i")
  if min(tokens_NxK.shape) < 1:
    raise ValueError("tokens_NxK must hold at least one row of at least one "
                     f"token, got shape {tuple(tokens_NxK.shape)}.")
  significance = _check_significance(significance)
  min_expected = _checks.check_float("min_expected", min_expected)
  if min_expected <= 0:
    raise ValueError(f"min_expected must be > 0, got {min_expected}.")
  num_tokens = tokens_NxK.shape[1]
  vocab_size, *_ = _check_law_args(model, prompt_P, num_tokens, sampling,
                                   eos_id, max_sequences)
  ids_N = generation_ids(tokens_NxK, vocab_size, eos_id=eos_id)
  ids_M, law_M = generation_law(model, prompt_P, num_tokens, sampling,
                                eos_id=eos_id, max_sequences=max_sequences)
  # Each sample's index among the law's outcomes; an id outside them goes to
  # an extra outcome of probability 0.
  pos_N = np.clip(np.searchsorted(ids_M, ids_N), 0, len(ids_M) - 1)
  index_N = np.where(ids_M[pos_N] == ids_N, pos_N, len(ids_M))
  return check_distribution(index_N, np.append(law_M, 0.0),
                            significance=significance,
                            min_expected=min_expected)


def toy_transformer(vocab_size: int, seed: int = 0, *, flavour: str = "gpt2",
                    embed_scale: float = 4.0, d_model: int = 16,
                    num_layers: int = 1, num_heads: int = 2,
                    num_kv_heads: int | None = None,
                    max_positions: int = 32,
                    dtype: str = "float32") -> transformer.TransformerLM:
  """A tiny random `TransformerLM` whose next-token laws are peaked.

  Random initialisation gives nearly uniform next-token laws, under which
  target and draft nearly agree and every verification rule looks exact: a
  statistical check (`check_generation`) cannot tell a wrong rule from a
  right one. Multiplying every embedding table (the token embedding, and
  gpt2's learned positions) by `embed_scale` peaks the gpt2 flavour's laws,
  so two such models differ enough for a wrong rule's output law to show.
  The llama flavour's RMSNorm undoes most of the scale: its laws stay close
  to uniform, and it still differs from a gpt2 model. The same arguments
  give the same weights.

  Args:
    vocab_size: V, small enough for `generation_law` to enumerate V**K.
    seed: the initialisation seed (`TransformerLM.create`).
    flavour: "gpt2" or "llama" (`TransformerConfig.flavour`).
    embed_scale: the factor on the embedding tables (1.0 leaves the random
      initialisation as it is); the scaled weights keep their dtype.
    d_model, num_layers, num_heads, num_kv_heads, max_positions: the
      `TransformerConfig` fields of the same names (num_kv_heads None: one
      per query head).
    dtype: the compute and parameter dtype ("float32" or "bfloat16");
      logits stay float32.

  Returns:
    The `TransformerLM`.
  """
  embed_scale = _checks.check_float("embed_scale", embed_scale)
  if embed_scale <= 0:
    raise ValueError(f"embed_scale must be > 0, got {embed_scale}.")
  config = transformer.TransformerConfig(
      vocab_size=vocab_size, d_model=d_model, num_layers=num_layers,
      num_heads=num_heads, num_kv_heads=num_kv_heads,
      max_positions=max_positions, flavour=flavour, dtype=dtype,
      param_dtype=dtype)
  model = transformer.TransformerLM.create(config, seed)
  if embed_scale == 1.0:
    return model
  return model.replace(state=jax.tree_util.tree_map_with_path(
      lambda path, x: (embed_scale * x).astype(x.dtype)
      if "embed" in jax.tree_util.keystr(path) else x, model.state))


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
