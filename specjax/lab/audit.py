r"""The rejection-sampling lab's deterministic audit.

`run_audit` runs named checks on the exactness oracle `specjax.lab` (knob
sanitation, normalisation, residual-mass algebra, alpha = 1 - TV, agreement
with the JAX coupling, two independent exact enumerations, exact TV of the
speculative process, the negative controls of `specjax.lab.controls`, seeded
trace determinism and the cost ledger), then the exact TV over a grid of
settings (certainty x draft match x gamma x draft cost x sequence length x
seed, 1,296 by default). `report` renders one table of checks, one table over
draft match at the default setting, and the worst exact TV.
`python -m experiments.lab_audit` is its command line.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np

from specjax import _checks
from specjax import lab
from specjax.lab import exact

# float64 rounding of sums over <= 8**6 terms stays near 1e-15; 1e-12 leaves
# three orders of margin while a real bug (e.g. the wrong fallback) shows up
# at 1e-3 or more on the default pair.
TOL = 1e-12
# A negative control must stand three orders above TOL for the exact checks
# to tell it apart. Not an absolute 1e-3: on sharp rows the residual nears p
# itself, so the wrong fallback's true TV shrinks (2e-4 at certainty 8, 3e-6
# at 12), still a clear failure of the exact checks; where it reaches the
# rounding floor (certainty 50), the setting cannot test the fallback and
# the audit says so.
NEGATIVE_CONTROL_MIN_TV = 1e3 * TOL

GRID_CERTAINTY = (0.0, 0.5, 1.5, 3.0, 8.0, 1000.0)  # 1000: exact zeros
GRID_DRAFT_MATCH = (0.0, 0.25, 0.5, 0.8, 0.95, 1.0)  # 1: zero residual mass
GRID_GAMMA = (1, 2, 4)
GRID_DRAFT_COST = (0.05, 0.5)
GRID_SEQ_LEN = (2, 3, 5)

# check_arguments must not run the work it guards, nor pass work that runs
# for hours: each grid seed adds 648 settings, each one exact enumeration
# plus one trace of trace_tokens, so the seeds and the traced tokens over the
# whole grid are capped, far above the defaults (2 seeds, 96 tokens).
MAX_GRID_SEEDS = 100
MAX_GRID_TRACE_TOKENS = 5 * 10 ** 7


@dataclasses.dataclass(frozen=True)
class Setting:
  certainty: float
  draft_match: float
  gamma: int
  draft_cost: float
  seq_len: int
  seed: int


@dataclasses.dataclass(frozen=True)
class Check:
  name: str
  value: float | str
  bound: str
  passed: bool


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """Everything the audit measured; `ok` is True when every check passed."""
  checks: list[Check]
  num_settings: int
  worst_tv: float
  worst_setting: Setting
  wrong_fallback_tv: float
  always_accept_tv: float
  trace: lab.Trace
  seconds: float
  arguments: dict = dataclasses.field(default_factory=dict)

  @property
  def ok(self) -> bool:
    return all(c.passed for c in self.checks)


def _le(name, value, bound=TOL):
  return Check(name, float(value), f"<= {bound:g}", bool(value <= bound))


def _gt(name, value, bound=NEGATIVE_CONTROL_MIN_TV):
  return Check(name, float(value), f"> {bound:g}", bool(value > bound))


def _truth(name, passed, value="yes"):
  return Check(name, value if passed else "no", "yes", bool(passed))


def _rejects(fn) -> bool:
  try:
    fn()
  except (TypeError, ValueError):
    return True
  return False


def _sanitation_checks(pair) -> Check:
  bad_calls = [
      lambda: lab.make_markov_pair(certainty=-1.0),
      lambda: lab.make_markov_pair(certainty=float("nan")),
      lambda: lab.make_markov_pair(draft_match=1.5),
      lambda: lab.make_markov_pair(draft_match="0.5"),
      lambda: lab.make_markov_pair(seed=-3),
      lambda: lab.make_markov_pair(seed=1.5),
      lambda: lab.speculative_distribution(pair, 0, 3),
      lambda: lab.speculative_distribution(pair, 2, 0),
      lambda: lab.speculative_distribution(pair, 2, 3, rule="resample"),
      lambda: lab.run_trace(pair, 2, -0.1),
      lambda: lab.run_trace(pair, 2, 0.1, num_tokens=0),
      lambda: lab.coupling_table(np.ones(3) / 3, np.ones(4) / 4),
      lambda: lab.MarkovPair(pair.target_init_V * 2, pair.target_trans_VxV,
                             pair.draft_init_V, pair.draft_trans_VxV),
  ]
  rejected = sum(_rejects(f) for f in bad_calls)
  return Check("knob_sanitation", f"{rejected}/{len(bad_calls)}",
               "all rejected", rejected == len(bad_calls))


def _algebra_checks(pairs) -> list[Check]:
  """One-token identities, worst case over every pair in the grid."""
  row_err = draft_err = res_err = mass_err = out_err = alpha_err = 0.0
  for pair in pairs:
    p_CxV, q_CxV = pair.target_rows_CxV, pair.draft_rows_CxV
    row_err = max(row_err, np.abs(p_CxV.sum(-1) - 1).max())
    draft_err = max(draft_err, np.abs(q_CxV.sum(-1) - 1).max())
    table = lab.coupling_table(p_CxV, q_CxV)
    excess_C = np.maximum(p_CxV - q_CxV, 0).sum(-1)
    has_residual = excess_C > 0
    if has_residual.any():
      residual_CxV = table.rejected[has_residual] / table.reject_mass[
          has_residual, None]
      res_err = max(res_err, np.abs(residual_CxV.sum(-1) - 1).max())
    mass_err = max(mass_err, np.abs(table.reject_mass - excess_C).max())
    out_err = max(out_err, np.abs(table.output - p_CxV).max())
    tv_C = 0.5 * np.abs(p_CxV - q_CxV).sum(-1)
    alpha_err = max(alpha_err, np.abs(table.alpha - (1 - tv_C)).max(),
                    np.abs(lab.acceptance_rates(pair) - (1 - tv_C)).max())
  return [
      _le("target_rows_normalized", row_err),
      _le("draft_rows_normalized", draft_err),
      _le("residual_normalized", res_err),
      _le("residual_mass_algebra", mass_err),
      _le("coupling_output_equals_p", out_err),
      _le("alpha_equals_1_minus_tv", alpha_err),
  ]


def _jax_check(pair) -> Check:
  """The JAX math layer agrees with the lab (float32, so a float32 bound)."""
  from specjax import coupling  # pylint: disable=g-import-not-at-top
  p_CxV = pair.target_rows_CxV.astype(np.float32)
  q_CxV = pair.draft_rows_CxV.astype(np.float32)
  table = lab.coupling_table(p_CxV, q_CxV)
  residual_CxV = exact._rule_tables(  # pylint: disable=protected-access
      p_CxV.astype(np.float64), q_CxV.astype(np.float64), "exact")[1]
  err = max(
      np.abs(np.asarray(coupling.acceptance_probability(p_CxV, q_CxV))
             - table.alpha).max(),
      np.abs(np.asarray(coupling.tv_distance(p_CxV, q_CxV))
             - (1 - table.alpha)).max(),
      np.abs(np.asarray(coupling.residual(p_CxV, q_CxV)) - residual_CxV).max())
  return _le("jax_coupling_matches_lab", err, 1e-6)


def _enumeration_checks(pair, gamma, seq_len) -> list[Check]:
  blocks = lab.round_distribution(pair, gamma)
  round_mass_C = sum(b.reshape(b.shape[0], -1).sum(-1) for b in blocks)
  # The round emits >= 2 tokens iff x_1 is kept: probability alpha(context).
  first_kept_C = 1 - blocks[0].reshape(blocks[0].shape[0], -1).sum(-1)
  agree = 0.0
  for rule in lab.RULES:
    for g, n in ((1, 1), (1, 4), (2, 3), (3, 5), (gamma, seq_len)):
      agree = max(agree, np.abs(
          lab.speculative_distribution(pair, g, n, rule)
          - exact._hidden_state_distribution(  # pylint: disable=protected-access
              pair, g, n, rule)).max())
  spec = lab.speculative_distribution(pair, gamma, seq_len)
  target = lab.target_distribution(pair, seq_len)
  return [
      _le("round_mass_sums_to_one", np.abs(round_mass_C - 1).max()),
      _le("round_first_accept_is_alpha",
          np.abs(first_kept_C - lab.acceptance_rates(pair)).max()),
      _le("speculative_dist_normalized", abs(spec.sum() - 1)),
      _le("target_dist_normalized", abs(target.sum() - 1)),
      _le("two_enumerations_agree", agree),
  ]


def _trace_checks(pair, gamma, draft_cost, num_tokens, seed):
  tr = lab.run_trace(pair, gamma, draft_cost, num_tokens, seed)
  again = lab.run_trace(pair, gamma, draft_cost, num_tokens, seed)
  other = lab.run_trace(pair, gamma, draft_cost, num_tokens, seed + 1)
  same = (np.array_equal(tr.tokens, again.tokens)
          and dataclasses.replace(tr, tokens=None)
          == dataclasses.replace(again, tokens=None))
  emitted = round(tr.tokens_per_target_call * tr.target_calls)
  balanced = (tr.draft_calls == gamma * tr.target_calls
              and emitted == tr.accepted + tr.target_calls
              and tr.accepted <= tr.verified <= tr.draft_calls
              and tr.verified - tr.accepted <= tr.target_calls
              and np.isclose(tr.toy_speedup, num_tokens / (
                  tr.target_calls + draft_cost * tr.draft_calls)))
  # A long run, where alpha_hat and the speedup settle, for the statistical
  # agreement checks (still deterministic: the seed is fixed).
  long = lab.run_trace(pair, gamma, draft_cost, 20_000, seed)
  sigma = np.sqrt(long.one_minus_tv * (1 - long.one_minus_tv) / long.verified)
  checks = [
      _truth("trace_seeded_determinism", same),
      _truth("trace_seed_changes_tokens",
             not np.array_equal(tr.tokens, other.tokens)),
      _truth("trace_emits_exact_length", len(tr.tokens) == num_tokens,
             str(len(tr.tokens))),
      _truth("trace_ledger_balance", balanced),
      _le("long_trace_alpha_hat_vs_1_minus_tv",
          abs(long.alpha_hat - long.one_minus_tv), 4 * sigma + 1e-9),
      _le("long_trace_speedup_vs_accounting",
          abs(long.toy_speedup / long.estimated_speedup - 1), 0.05),
  ]
  return tr, checks


def grid_settings(num_seeds: int) -> list[Setting]:
  return [Setting(*s) for s in itertools.product(
      GRID_CERTAINTY, GRID_DRAFT_MATCH, GRID_GAMMA, GRID_DRAFT_COST,
      GRID_SEQ_LEN, range(num_seeds))]


def _run_grid(settings, trace_tokens):
  pairs = {}
  worst_tv, worst_setting, worst_norm = -1.0, None, 0.0
  traces_ok, speeds_finite = True, True
  for s in settings:
    key = (s.certainty, s.draft_match, s.seed)
    if key not in pairs:
      pairs[key] = lab.make_markov_pair(s.certainty, s.draft_match, s.seed)
    pair = pairs[key]
    spec = lab.speculative_distribution(pair, s.gamma, s.seq_len)
    target = lab.target_distribution(pair, s.seq_len)
    tv = lab.tv(spec, target)
    worst_norm = max(worst_norm, abs(spec.sum() - 1))
    if tv > worst_tv:
      worst_tv, worst_setting = tv, s
    tr = lab.run_trace(pair, s.gamma, s.draft_cost, trace_tokens, s.seed)
    traces_ok &= len(tr.tokens) == trace_tokens
    speeds_finite &= bool(np.isfinite([tr.toy_speedup, tr.estimated_speedup])
                          .all() and tr.toy_speedup > 0)
  return (list(pairs.values()), worst_tv, worst_setting, worst_norm, traces_ok,
          speeds_finite)


def run_audit(certainty=lab.DEFAULT_CERTAINTY,
              draft_match=lab.DEFAULT_DRAFT_MATCH, gamma=5, draft_cost=0.1,
              seq_len=4, seed=lab.DEFAULT_SEED,
              trace_tokens=lab.DEFAULT_NUM_TOKENS, grid_seeds=2,
              min_grid_settings=1000) -> AuditResult:
  """Runs every check; deterministic for fixed arguments. See module doc.

  Raises TypeError/ValueError naming a bad argument (`check_arguments`).
  """
  # Else grid_seeds=0 would give a failing audit, not an error.
  check_arguments(certainty=certainty, draft_match=draft_match, gamma=gamma,
                  draft_cost=draft_cost, seq_len=seq_len, seed=seed,
                  trace_tokens=trace_tokens, grid_seeds=grid_seeds,
                  min_grid_settings=min_grid_settings)
  start = time.perf_counter()
  pair = lab.make_markov_pair(certainty, draft_match, seed)
  settings = grid_settings(grid_seeds)
  (grid_pairs, worst_tv, worst_setting, worst_norm, traces_ok,
   speeds_finite) = _run_grid(settings, trace_tokens)
  checks = [_sanitation_checks(pair)]
  checks += _algebra_checks([pair] + grid_pairs)
  checks.append(_jax_check(pair))
  checks += _enumeration_checks(pair, gamma, seq_len)
  default_tv = lab.exact_tv(pair, gamma, seq_len)
  wrong_tv = lab.exact_tv(pair, gamma, seq_len, "wrong_fallback")
  accept_tv = lab.exact_tv(pair, gamma, seq_len, "always_accept")
  # One token, closed form: the wrong fallback emits min(p, q) + (1 - a) p.
  p_V, q_V = pair.target_init_V, pair.draft_init_V
  alpha = np.minimum(p_V, q_V).sum()
  closed = 0.5 * np.abs(np.minimum(p_V, q_V) + (1 - alpha) * p_V - p_V).sum()
  checks += [
      _le("exact_tv_default", default_tv),
      _gt("wrong_fallback_tv_default", wrong_tv),
      _gt("always_accept_tv_default", accept_tv),
      _le("wrong_fallback_one_token_closed_form",
          abs(lab.exact_tv(pair, gamma, 1, "wrong_fallback") - closed)),
  ]
  trace, trace_checks = _trace_checks(pair, gamma, draft_cost, trace_tokens,
                                      seed)
  checks += trace_checks
  checks += [
      Check("grid_size", len(settings), f">= {min_grid_settings}",
            len(settings) >= min_grid_settings),
      _le("grid_worst_exact_tv", worst_tv),
      _le("grid_distributions_normalized", worst_norm),
      _truth("grid_traces_exact_length_and_finite_speed",
             traces_ok and speeds_finite),
  ]
  arguments = dict(certainty=certainty, draft_match=draft_match, gamma=gamma,
                   draft_cost=draft_cost, seq_len=seq_len, seed=seed,
                   trace_tokens=trace_tokens)
  return AuditResult(checks, len(settings), worst_tv, worst_setting, wrong_tv,
                     accept_tv, trace, time.perf_counter() - start, arguments)


def _fmt(value) -> str:
  return f"{value:.3g}" if isinstance(value, float) else str(value)


def _match_table(certainty, gamma, draft_cost, seq_len, seed, trace_tokens):
  lines = [f"  {'draft_match':>11} {'alpha(BOS)':>10} {'exact TV':>9} "
           f"{'wrong TV':>9} {'accept TV':>9} {'speedup':>8} {'formula':>8}"]
  for match in GRID_DRAFT_MATCH:
    pair = lab.make_markov_pair(certainty, match, seed)
    tr = lab.run_trace(pair, gamma, draft_cost, trace_tokens, seed)
    tvs = [lab.exact_tv(pair, gamma, seq_len, rule) for rule in lab.RULES]
    lines.append(
        f"  {match:>11.2f} {lab.acceptance_rates(pair)[-1]:>10.4f} "
        f"{tvs[0]:>9.1e} {tvs[1]:>9.4f} {tvs[2]:>9.4f} "
        f"{tr.toy_speedup:>7.2f}x {tr.estimated_speedup:>7.2f}x")
  return "\n".join(lines)


def check_arguments(certainty=lab.DEFAULT_CERTAINTY,
                    draft_match=lab.DEFAULT_DRAFT_MATCH, gamma=5,
                    draft_cost=0.1, seq_len=4, seed=lab.DEFAULT_SEED,
                    trace_tokens=lab.DEFAULT_NUM_TOKENS, grid_seeds=2,
                    min_grid_settings=1000) -> None:
  """Raises TypeError/ValueError naming the bad argument, before any work."""
  # Checked here, by name: the lab's trace would name num_tokens.
  trace_tokens = _checks.check_int("trace_tokens", trace_tokens, low=1)
  grid_seeds = _checks.check_int("grid_seeds", grid_seeds, low=1,
                                 high=MAX_GRID_SEEDS)
  _checks.check_int("min_grid_settings", min_grid_settings, low=0)
  settings = len(grid_settings(grid_seeds))
  if trace_tokens * settings > MAX_GRID_TRACE_TOKENS:
    raise ValueError(
        f"trace_tokens must be <= {MAX_GRID_TRACE_TOKENS // settings} with "
        f"grid_seeds={grid_seeds} (the grid samples one trace per setting, "
        f"{settings} of them), got {trace_tokens}.")
  pair = lab.make_markov_pair(certainty, draft_match, seed)
  lab.speculative_distribution(pair, gamma, seq_len)  # exact.py caps its size
  # One token checks gamma and draft_cost; the trace itself is the work.
  lab.run_trace(pair, gamma, draft_cost, 1)


def report(result: AuditResult) -> str:
  """The audit's printed report: checks, the draft-match table, the summary."""
  a = result.arguments
  lines = [f"specjax rejection-sampling lab audit: {len(result.checks)} checks",
           f"default setting: certainty={a['certainty']} "
           f"draft_match={a['draft_match']} gamma={a['gamma']} "
           f"draft_cost={a['draft_cost']} seq_len={a['seq_len']} "
           f"seed={a['seed']}"]
  width = max(len(c.name) for c in result.checks)
  for c in result.checks:
    lines.append(f"  {'PASS' if c.passed else 'FAIL'}  {c.name:<{width}}  "
                 f"{_fmt(c.value):>10}  {c.bound}")
  lines.append(f"\nover draft_match (certainty={a['certainty']}, "
               f"gamma={a['gamma']}, N={a['seq_len']}; speedup from one "
               f"{a['trace_tokens']}-token trace):")
  lines.append(_match_table(a["certainty"], a["gamma"], a["draft_cost"],
                            a["seq_len"], a["seed"], a["trace_tokens"]))
  tr = result.trace
  lines.append(f"\ngrid: {result.num_settings} settings; worst exact TV "
               f"{result.worst_tv:.3e} at {result.worst_setting}")
  lines.append(f"default: wrong-fallback TV {result.wrong_fallback_tv:.3g}, "
               f"always-accept TV {result.always_accept_tv:.3g}")
  lines.append(
      f"trace ({len(tr.tokens)} tokens, seed {a['seed']}): "
      f"{tr.target_calls} target calls, {tr.draft_calls} draft calls, "
      f"alpha_hat {tr.alpha_hat:.3f} vs 1-TV {tr.one_minus_tv:.3f}, "
      f"{tr.tokens_per_target_call:.2f} tokens/target call, toy speedup "
      f"{tr.toy_speedup:.2f}x vs accounting estimate "
      f"{tr.estimated_speedup:.2f}x")
  failed = [c.name for c in result.checks if not c.passed]
  lines.append(f"{'FAILED: ' + ', '.join(failed) if failed else 'ALL PASS'} "
               f"({result.seconds:.1f} s)")
  return "\n".join(lines)
