"""Run statistics in one place: per-row `RowStats` -> one summary dict.

`GenerationResult.summary()`, the sweep, the figures and the benchmarks all
read their acceptance numbers from here, so "alpha_hat" or "tokens per
target call" means one thing everywhere.

* `summarize(results)` pools one or many generations (a `GenerationResult`,
  or anything with `.stats` and `.lengths`): every `RowStats` field is summed
  over rows and generations (a new counter is summed and reported without
  any change here), then the derived statistics are added.
* `clustered_alpha(accepted_R, verified_R)`, `pooled_alpha(accepted,
  verified)` and `tokens_per_round_se(hist)` are the estimators with their
  standard errors, for callers that pool summaries themselves (the figures
  pool sweep cells over gamma, row by row); `paired_ratio_gain` compares
  two decoders' tokens per target call on the same rows.

Derived statistics (see `summarize`):
  alpha_hat, alpha_se          accepted / verified drafts; se over rows
                               (`clustered_alpha`: a row's drafts are not
                               independent, a greedy text's least of all);
  row_accepted, row_verified   the per-row counts it is computed from;
  one_minus_tv                 mean over verified positions of sum min(p, q);
  tokens_per_target_call(_se)  generated tokens / target passes (block
                               efficiency), se from the per-round histogram;
  formula_tokens_per_target_call    (1 - a^(n+1)) / (1 - a) at alpha_hat,
                               averaged over the rounds' draft lengths n
                               (`RowStats.length_hist`: gamma at a fixed
                               gamma, each round's own under a rule);
  expected_tokens_per_target_call   the same with each row's last round cut
                               at its budget (`accounting.rounds_distribution`):
                               what the measured value should match. Given
                               for rounds of one length (a fixed gamma, a
                               tree); NaN for a rule's ragged rounds, whose
                               budget cuts the counts do not record.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from specjax import _checks
from specjax import accounting


def _count(name: str, value: Any) -> int:
  """A count: a non-negative integer (a 0-d integer numpy array too). int()
  would truncate 2.7 and keep -1, turning a bad count into a wrong number."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value[()]
  return _checks.check_int(name, value, low=0)


def _counts(name: str, values: Any) -> np.ndarray:
  """Counts as int64 numpy: integers >= 0, any shape (Python ints or numpy)."""
  arr = np.asarray(values)
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f"{name} must hold integer counts, got dtype {arr.dtype}: "
                    f"{values!r}.")
  if arr.size and arr.min() < 0:
    raise ValueError(f"{name} must hold counts >= 0, got {values!r}.")
  return arr.astype(np.int64)


def pooled_alpha(accepted: int, verified: int) -> tuple[float, float]:
  """(accepted / verified, its binomial standard error); NaNs when none.

  accepted and verified are counts with accepted <= verified.
  """
  accepted, verified = _count("accepted", accepted), _count("verified",
                                                             verified)
  if accepted > verified:
    raise ValueError(f"accepted ({accepted}) must be <= verified ({verified}): "
                     "only verified drafts can be accepted.")
  if verified == 0:
    return math.nan, math.nan
  a = accepted / verified
  return a, math.sqrt(max(a * (1 - a), 0.0) / verified)


def clustered_alpha(accepted_R: Any, verified_R: Any) -> tuple[float, float]:
  """(sum accepted / sum verified, its standard error over the R units).

  The units (rows, prompts) are independent; the drafts within one need not
  be: a row's acceptances follow its text, and at T = 0 a text is fixed, so
  the binomial se of `pooled_alpha`, which counts every draft as an
  independent trial, is several times too small there. This is the ratio
  estimator's delta-method se, sqrt(R / (R - 1) * sum_r (a_r - alpha v_r)^2)
  / sum_r v_r, over the units that verified a draft: a unit that verified
  none says nothing of alpha, and with one such unit left the residual is 0
  by construction (its own ratio is alpha), so a zero se would be claimed.
  NaN se with fewer than two units that verified a draft; NaNs when nothing
  was verified.

  Args:
    accepted_R, verified_R: integer counts >= 0 per unit, 1-D, of one length,
      accepted_R <= verified_R elementwise.
  """
  a_R = _counts("accepted_R", accepted_R)
  v_R = _counts("verified_R", verified_R)
  if a_R.ndim != 1 or a_R.shape != v_R.shape:
    raise ValueError(f"accepted_R and verified_R must be 1-D of one length, "
                     f"got shapes {a_R.shape} and {v_R.shape}.")
  if np.any(a_R > v_R):
    raise ValueError("accepted_R must be <= verified_R unit by unit: only "
                     "verified drafts can be accepted.")
  total = int(v_R.sum())
  if total == 0:
    return math.nan, math.nan
  alpha = int(a_R.sum()) / total
  used_R = v_R > 0
  r = int(used_R.sum())
  if r < 2:
    return alpha, math.nan
  resid_R = a_R[used_R] - alpha * v_R[used_R]
  return alpha, math.sqrt(r / (r - 1) * float(resid_R @ resid_R)) / total


def tokens_per_round_se(accept_hist: Sequence[int]) -> float:
  """Standard error of mean tokens per round from the kept-drafts histogram.

  `accept_hist[n]` counts rounds that kept n drafts (and so emitted n + 1
  tokens, before any budget cut): 1-D integer counts >= 0. NaN with fewer
  than two rounds.
  """
  hist = _counts("accept_hist", accept_hist).astype(np.float64)
  if hist.ndim != 1:
    raise ValueError(f"accept_hist must be 1-D (rounds per kept-draft count), "
                     f"got shape {hist.shape}.")
  rounds = hist.sum()
  if rounds < 2:
    return math.nan
  emitted = np.arange(1, hist.size + 1)
  mean = (hist * emitted).sum() / rounds
  var = (hist * (emitted - mean) ** 2).sum() / (rounds - 1)
  return float(math.sqrt(var / rounds))


def paired_ratio_gain(tokens_a_R: Any, calls_a_R: Any, tokens_b_R: Any,
                      calls_b_R: Any, *, level: float = 0.95,
                      resamples: int = 2000, seed: int = 0
                      ) -> tuple[float, float, float]:
  """How much more tokens per target call decoder A gives than decoder B on
  the same rows (same prompts and keys): (gain, low, high), gain =
  (sum tokens_a / sum calls_a) / (sum tokens_b / sum calls_b) - 1, and its
  `level` interval from a bootstrap over rows that resamples each row's
  pair together (the rows, not the rounds, are independent).

  Each argument is an integer `[R]` array of per-row counts (R >= 2),
  e.g. `GenerationResult.lengths` and `stats.target_calls`.
  """
  arrays = [_counts(name, v).reshape(-1).astype(np.float64) for name, v in (
      ("tokens_a_R", tokens_a_R), ("calls_a_R", calls_a_R),
      ("tokens_b_R", tokens_b_R), ("calls_b_R", calls_b_R))]
  rows = arrays[0].size
  if rows < 2 or any(a.size != rows for a in arrays):
    raise ValueError("the four per-row arrays must have one equal length "
                     f">= 2, got {[a.size for a in arrays]}.")
  level = _checks.check_float("level", level)
  if not 0 < level < 1:
    raise ValueError(f"level must be in (0, 1), got {level}.")
  resamples = _checks.check_int("resamples", resamples, low=10)
  ta, ca, tb, cb = arrays
  if min(ca.sum(), cb.sum(), tb.sum()) <= 0:
    return math.nan, math.nan, math.nan
  gain = (ta.sum() / ca.sum()) / (tb.sum() / cb.sum()) - 1
  idx_SxR = np.random.default_rng(seed).integers(0, rows, (resamples, rows))
  with np.errstate(divide="ignore", invalid="ignore"):
    boot_S = ((ta[idx_SxR].sum(1) / ca[idx_SxR].sum(1))
              / (tb[idx_SxR].sum(1) / cb[idx_SxR].sum(1)) - 1)
  low, high = np.nanquantile(boot_S, [(1 - level) / 2, (1 + level) / 2])
  return float(gain), float(low), float(high)


def expected_tokens_per_target_call(alpha: float, gamma: int,
                                    row_tokens: Iterable[int]) -> float:
  """Expected generated tokens / target calls for rows of these lengths.

  Each row of n tokens needs `accounting.expected_rounds(alpha, gamma, n)`
  calls in expectation (its last round cut at the budget), so the pooled
  ratio is sum(n) / sum(E[rounds(n)]). A row stopped by EOS is treated as if
  its budget were its length, the same cut. gamma = 0 gives 1.

  alpha is in [0, 1], or NaN for "not measured" (no verified drafts), which
  gives NaN unless gamma = 0; row_tokens are integer lengths >= 0. NaN when
  they sum to 0.
  """
  gamma = _checks.check_int("gamma", gamma, low=0)
  if isinstance(alpha, (bool, np.bool_)) or not isinstance(
      alpha, (numbers.Real, np.floating, np.integer)):
    raise TypeError(f"alpha must be a real number, got {alpha!r}.")
  alpha = float(alpha)
  if not (math.isnan(alpha) or 0.0 <= alpha <= 1.0):
    # Clamping would turn a bad estimate into a plausible prediction.
    raise ValueError(f"alpha must be in [0, 1] (or NaN when not measured), "
                     f"got {alpha}.")
  if not hasattr(row_tokens, "shape"):
    if not isinstance(row_tokens, Iterable) or isinstance(row_tokens, str):
      raise TypeError("row_tokens must be the rows' generated lengths (an "
                      f"array or iterable of ints), got {row_tokens!r}.")
    row_tokens = list(row_tokens)  # any iterable, generators included
  lengths = _counts("row_tokens", row_tokens).reshape(-1)
  counts: dict[int, int] = {}
  for n in lengths.tolist():
    counts[n] = counts.get(n, 0) + 1
  tokens = sum(n * k for n, k in counts.items())
  if tokens == 0 or (gamma > 0 and math.isnan(alpha)):
    return math.nan
  alpha = 0.0 if gamma == 0 else alpha
  rounds = sum(k * accounting.expected_rounds(alpha, gamma, n)
               for n, k in counts.items())
  return tokens / rounds


def _row_fields(stats) -> list[str]:
  return [f.name for f in dataclasses.fields(stats)]


def totals(stats_list: Sequence[Any]) -> dict[str, Any]:
  """Every `RowStats` field summed over rows and over the given stats.

  Scalars per row become a Python int (integer and bool fields) or float;
  per-row vectors (`accept_hist`) become a list. Works for any field a
  future `RowStats` adds.
  """
  out: dict[str, Any] = {}
  for name in _row_fields(stats_list[0]):
    arrays = [np.asarray(getattr(s, name)) for s in stats_list]
    if any(a.shape[1:] != arrays[0].shape[1:] for a in arrays):
      raise ValueError(f"RowStats.{name} has shapes "
                       f"{sorted({a.shape[1:] for a in arrays})} across the "
                       "results: pool generations of one gamma only.")
    total = np.sum([a.sum(axis=0) for a in arrays], axis=0)
    if total.ndim:
      out[name] = total.tolist()
    elif np.issubdtype(total.dtype, np.floating):
      out[name] = float(total)
    else:
      out[name] = int(total)
  return out


def _check_rows(stats, lengths_B, i: int) -> None:
  """Refuses counters no generation can produce (stats built or edited by
  hand), naming the result and field: every statistic would be wrong."""
  where = f"results[{i}]"
  rounds_B = np.asarray(stats.rounds)
  rows = rounds_B.shape[0]
  if lengths_B.reshape(-1).size != rows:
    raise ValueError(f"{where}.lengths has {lengths_B.size} rows but its "
                     f"stats have {rows}: pass each generation's own lengths.")
  for name in _row_fields(stats):
    a = np.asarray(getattr(stats, name))
    # NaN is allowed: a row that met non-finite logits (on_nonfinite="warn")
    # sums a NaN overlap, and its statistics come out NaN, as they should.
    bad = (a < 0) | np.isinf(a)
    if bad.any():
      raise ValueError(f"{where}: RowStats.{name} holds {a[bad].flat[0]}; "
                       "counters are finite and >= 0.")
  if (np.asarray(stats.accept_hist).sum(-1) != rounds_B).any():
    raise ValueError(f"{where}: RowStats.accept_hist counts other rounds than "
                     "rounds does; each round adds 1 at the drafts it kept.")
  verified_B = np.asarray(stats.verified, np.float64)
  # A sum of float32 values <= 1 each: within rounding of verified.
  if (np.asarray(stats.overlap_sum) > verified_B * (1 + 1e-4) + 1e-3).any():
    raise ValueError(f"{where}: RowStats.overlap_sum exceeds verified; each "
                     "judged draft adds sum_x min(p, q) <= 1.")


def summarize(results: Any) -> dict[str, Any]:
  """One summary of one generation or of several pooled (same gamma).

  Args:
    results: a `GenerationResult` or a sequence of them (anything with
      `.stats`, a `RowStats`, and `.lengths`, int `[B]` generated tokens).

  Returns:
    A dict of Python numbers: `rows`, `generated_tokens`, `loop_rounds`
    (while_loop iterations: the most rounds any row of a generation ran,
    summed over generations), `gamma` (the loop's static draft length: a
    draft-length rule's gamma_max), every `RowStats` field summed (`rounds`,
    `target_calls`, `draft_calls`, `verified`, `accepted`, `overlap_sum`,
    `accept_hist`, `length_hist`, ...), `proposed` (= draft_calls), and the
    derived statistics of the module docstring. Ratios with a zero
    denominator are NaN.
  """
  if hasattr(results, "stats"):
    results = [results]
  if not isinstance(results, Iterable):
    raise TypeError(f"results is a {type(results).__name__}; summarize takes "
                    "a GenerationResult, or a sequence of them.")
  results = list(results)
  if not results:
    raise ValueError("summarize needs at least one result.")
  for i, r in enumerate(results):
    if not (hasattr(r, "stats") and hasattr(r, "lengths")):
      raise TypeError(f"results[{i}] is a {type(r).__name__}; summarize takes "
                      "a GenerationResult (or anything with .stats and "
                      ".lengths), or a sequence of them.")
  host = [(jax.tree.map(np.asarray, r.stats), np.asarray(r.lengths))
          for r in results]
  for i, (row_stats, lengths_B) in enumerate(host):
    _check_rows(row_stats, lengths_B, i)
  stats_list = [s for s, _ in host]
  row_tokens = np.concatenate([lengths.reshape(-1) for _, lengths in host])
  out: dict[str, Any] = {
      "rows": int(row_tokens.size),
      "generated_tokens": int(row_tokens.sum()),
      "loop_rounds": int(sum(int(s.rounds.max(initial=0))
                             for s in stats_list)),
  }
  out.update(totals(stats_list))
  hist = out["accept_hist"]
  gamma = len(hist) - 1
  out["gamma"] = gamma
  out["proposed"] = out["draft_calls"]
  row_accepted = np.concatenate([np.asarray(st.accepted).reshape(-1)
                                 for st in stats_list])
  row_verified = np.concatenate([np.asarray(st.verified).reshape(-1)
                                 for st in stats_list])
  alpha, alpha_se = clustered_alpha(row_accepted, row_verified)
  target_calls = out["target_calls"]
  length_hist = np.asarray(out["length_hist"], np.int64)
  block_rounds = int(length_hist.sum())
  if block_rounds != out["rounds"]:
    # Stats built by hand without it would price every round as 0 drafts.
    raise ValueError(f"RowStats.length_hist counts {block_rounds} rounds but "
                     f"rounds counts {out['rounds']}: each round adds 1 at "
                     "the most drafts its row could keep (gamma at a fixed "
                     "gamma).")
  block_lengths = np.flatnonzero(length_hist)
  if not block_rounds or (length_hist[1:].any() and not math.isfinite(alpha)):
    formula = math.nan
  else:  # alpha is NaN only where every round drafted nothing: 1 token each
    formula = float(length_hist @ accounting.expected_tokens_per_pass(
        alpha if math.isfinite(alpha) else 0.0, np.arange(gamma + 1))
                    ) / block_rounds
  # The budget cut is priced for rounds of one length; a rule's ragged
  # rounds would need each round's remaining budget, which is not counted.
  expected = (math.nan if block_lengths.size != 1 else
              expected_tokens_per_target_call(alpha, int(block_lengths[0]),
                                              row_tokens))
  out.update({
      "alpha_hat": alpha,
      "alpha_se": alpha_se,
      "row_accepted": row_accepted.tolist(),
      "row_verified": row_verified.tolist(),
      "one_minus_tv": (out["overlap_sum"] / out["verified"]
                       if out["verified"] else math.nan),
      "tokens_per_target_call": (out["generated_tokens"] / target_calls
                                 if target_calls else math.nan),
      "tokens_per_target_call_se": tokens_per_round_se(hist),
      "formula_tokens_per_target_call": formula,
      "expected_tokens_per_target_call": expected,
  })
  return out
