r"""Markdown tables and plain-text reports of a sweep.

  table3_markdown          (e) Leviathan et al. (2023), Table 3 layout: the
                               paper's row beside ours, then every draft
  summary_table            best gamma per draft and temperature, and where
                               speculation loses
  efficiency_report        the cost model's check: measured / predicted
                               speedup, and the component off per cell
  verifier_table_markdown  every verifier cell: exact / lossy, speedup beside
                               the lossy ones' estimated per-token TV
  block_vs_token_report    block against token verification, per cell
  adaptive_report          gamma = auto against the best fixed gamma, per cell
  models_table             the run's models, size and held-out bits per byte
  main_rows_note           the rows the main figures leave out, and why

`table3_markdown`, `summary_table` and `efficiency_report` read one
(verifier, gamma_mode, batch_size) setting and refuse rows mixing them: pass
`rows.main_rows(rows)`. Every ± is a 95% (1.96 * se) interval.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from specjax.harness.figures.rows import adaptive_rows
from specjax.harness.figures.rows import best_cells
from specjax.harness.figures.rows import cells_of
from specjax.harness.figures.rows import draft_names
from specjax.harness.figures.rows import format_count
from specjax.harness.figures.rows import group_keys
from specjax.harness.figures.rows import has_decomposition
from specjax.harness.figures.rows import main_rows
from specjax.harness.figures.rows import meta_value
from specjax.harness.figures.rows import num
from specjax.harness.figures.rows import pooled_alpha
from specjax.harness.figures.rows import provenance
from specjax.harness.figures.rows import require_one_setting
from specjax.harness.figures.rows import target_name
from specjax.harness.figures.rows import temperatures
from specjax.harness.figures.rows import TRANSFORMER_KINDS
from specjax.harness.figures.rows import verifier_names
from specjax.harness.figures.rows import verifier_rows
from specjax.harness.figures.rows import Z95

# Leviathan, Kalman & Matias (2023), Table 3, row "GPT-like (97M)":
# acceptance alpha at argmax (T = 0) / sampling (T = 1).
PAPER_ROW_NAME = "GPT-like (97M) [paper]"
PAPER_ROW = {"unigram": (0.03, 0.03), "bigram": (0.05, 0.05),
             "transformer": (0.88, 0.89)}
PAPER_TRANSFORMER_NAME = "GPT-like 6M"

# The efficiency target of the cost model, over cells with alpha_hat >= 0.5.
EFFICIENCY_ALPHA_MIN = 0.5
EFFICIENCY_MEDIAN_BAND = (0.95, 1.05)
EFFICIENCY_CELL_BAND = (0.9, 1.1)
EFFICIENCY_CELL_SHARE = 0.8


# --- Formatting -------------------------------------------------------------


def _fmt_or_na(value: float, spec: str) -> str:
  """format(value, spec), or "n/a" where nothing was measured (NaN)."""
  return format(value, spec) if math.isfinite(value) else "n/a"



def _format_alpha(a: float) -> str:
  """Two decimals without the leading zero, as in the paper: .88."""
  if not math.isfinite(a):
    return "–"
  s = f"{a:.2f}"
  return s[1:] if s.startswith("0.") else s



# --- The cost model ----------------------------------------------------------


def efficiency_report(rows: Sequence[dict]) -> str:
  """The cost model's check against its target, as text.

  For decode-only and end-to-end efficiency (measured / predicted speedup):
  over cells with alpha_hat >= EFFICIENCY_ALPHA_MIN, the median and the share
  in EFFICIENCY_CELL_BAND, against the target; then every cell whose
  efficiency is outside the band and whose 95% interval misses 1, with the
  component `measure.decompose` found off and by how much.
  """
  require_one_setting(rows, "efficiency_report")
  if not has_decomposition(rows):
    return ""
  lines = ["Cost model check: efficiency = measured / predicted speedup "
           f"(target over cells with alpha_hat >= {EFFICIENCY_ALPHA_MIN}: "
           f"median in [{EFFICIENCY_MEDIAN_BAND[0]}, "
           f"{EFFICIENCY_MEDIAN_BAND[1]}], >= {EFFICIENCY_CELL_SHARE:.0%} of "
           f"cells in [{EFFICIENCY_CELL_BAND[0]}, {EFFICIENCY_CELL_BAND[1]}])"]
  lo, hi = EFFICIENCY_CELL_BAND
  for key, name in (("decode_efficiency", "decode only"),
                    ("efficiency", "end to end")):
    eff = np.array([num(r.get(key)) for r in rows
                    if num(r["alpha_hat"]) >= EFFICIENCY_ALPHA_MIN])
    eff = eff[np.isfinite(eff)]
    if not eff.size:
      lines.append(f"  {name}: no cells with alpha_hat >= "
                   f"{EFFICIENCY_ALPHA_MIN}.")
      continue
    median = float(np.median(eff))
    share = float(np.mean((eff >= lo) & (eff <= hi)))
    met = (EFFICIENCY_MEDIAN_BAND[0] <= median <= EFFICIENCY_MEDIAN_BAND[1]
           and share >= EFFICIENCY_CELL_SHARE)
    lines.append(f"  {name:11s}: median {median:.3f}, {share:.0%} of "
                 f"{eff.size} cells in [{lo}, {hi}] (range {eff.min():.2f}"
                 f"-{eff.max():.2f}): target {'MET' if met else 'MISSED'}")
  misses = []
  for r in rows:
    eff, se = num(r.get("decode_efficiency")), num(r.get("decode_efficiency_se"))
    covers = math.isfinite(se) and abs(eff - 1) <= Z95 * se
    if lo <= eff <= hi or covers:
      continue
    misses.append(f"  {r['draft']} T={r['temperature']:g} g={r['gamma']}: "
                  f"decode {eff:.2f}"
                  + (f" ± {Z95 * se:.2f}" if math.isfinite(se) else "")
                  + f"; {_component_note(r)}")
  if misses:
    lines.append("Cells outside the band whose 95% interval misses 1 "
                 "(decode only), and the component off:")
    lines += misses
  else:
    lines.append("Every cell outside the band has a 95% interval covering 1.")
  return "\n".join(lines) + "\n"


def _component_note(row: dict) -> str:
  """'verify: 0.31 ms in the loop vs 0.25 predicted (x0.81)' for a row."""
  off = row.get("off") or ""
  if not off:
    return "no single component more than 10% off"
  factor = num(row.get(f"factor_{off}"))
  ms = lambda x: f"{1e3 * num(x):.3f} ms"
  if off == "acceptance":
    detail = (f"{num(row['measured_loop_rounds']):.1f} rounds vs "
              f"{num(row['predicted_loop_rounds']):.1f} predicted from alpha_hat")
  elif off == "baseline":
    detail = (f"autoregressive step {ms(row['measured_ar_round_s'])} vs "
              f"{ms(row['predicted_ar_round_s'])} predicted")
  elif off in ("draft", "verify"):
    detail = (f"{ms(row[f'measured_{off}_s'])} in the loop vs "
              f"{ms(row[f'predicted_{off}_s'])} predicted")
  else:
    detail = (f"round {ms(row['measured_round_s'])} vs "
              f"{ms(row['predicted_round_s'])} predicted")
  return f"{off}: {detail} (factor {factor:.2f})"



# --- Tables -------------------------------------------------------------------


def _alpha_cell(rows: Sequence[dict], draft: str | None) -> str:
  """'T=0 / T=1' pooled acceptance of `draft`, '–' where missing."""
  if draft is None:
    return "–"
  parts = []
  for t in (0.0, 1.0):
    a = pooled_alpha(cells_of(rows, draft, t))[0]
    parts.append(_format_alpha(a))
  return " / ".join(parts)


def _best_of_kind(rows: Sequence[dict], kinds: Sequence[str]) -> str | None:
  """The draft of `kinds` with the highest pooled alpha (mean over T)."""
  best, best_score = None, -math.inf
  for d in draft_names(rows):
    cells = [r for r in rows if r["draft"] == d]
    if cells[0]["draft_kind"] not in kinds:
      continue
    alphas = [pooled_alpha(cells_of(rows, d, t))[0] for t in (0.0, 1.0)]
    alphas = [a for a in alphas if math.isfinite(a)]
    score = float(np.mean(alphas)) if alphas else -math.inf
    if best is None or score > best_score:
      best, best_score = d, score
  return best


def table3_markdown(rows: Sequence[dict], metadata: dict | None) -> str:
  """Leviathan et al. (2023), Table 3 layout: acceptance alpha per draft.

  Rows are targets, columns draft families; each cell is "T=0 / T=1"
  acceptance, pooled over gamma as accepted / verified. The Transformer
  column shows our best Transformer draft (plain or distilled, highest mean
  alpha) and names it. A second table lists every draft with 95% CIs.
  """
  require_one_setting(rows, "table3_markdown")
  uni = _best_of_kind(rows, ("unigram",))
  bi = _best_of_kind(rows, ("bigram",))
  tf = _best_of_kind(rows, TRANSFORMER_KINDS)
  paper = {k: " / ".join(_format_alpha(a) for a in v)
           for k, v in PAPER_ROW.items()}
  tf_cell = _alpha_cell(rows, tf) + (f" ({tf})" if tf else "")
  lines = [
      "# Acceptance rate α (T=0 / T=1), layout of Leviathan et al. 2023, "
      "Table 3",
      "",
      "| Target | Unigram draft | Bigram draft | Transformer draft |",
      "| --- | --- | --- | --- |",
      f"| {PAPER_ROW_NAME} | {paper['unigram']} | {paper['bigram']} | "
      f"{paper['transformer']} ({PAPER_TRANSFORMER_NAME}) |",
      f"| {target_name(rows, metadata)} [ours] | {_alpha_cell(rows, uni)} | "
      f"{_alpha_cell(rows, bi)} | {tf_cell} |",
      "",
      "Each cell is α at T = 0 (argmax) / T = 1 (sampling); \"–\" where the "
      "sweep has no such cell. Ours: accepted / verified draft tokens, pooled "
      "over all γ of the sweep.",
  ]
  if tf:
    lines.append(f"Transformer column: our best Transformer draft by mean α "
                 f"over T, `{tf}`.")
  table = []
  by_rows = set()
  for d in draft_names(rows):
    first = next(r for r in rows if r["draft"] == d)
    cols = []
    for t in (0.0, 1.0):
      a, se, by_row = pooled_alpha(cells_of(rows, d, t))
      if math.isfinite(a):
        by_rows.add(by_row)
      cols.append("–" if not math.isfinite(a) else f"{a:.3f}" + (
          "" if not math.isfinite(se) else f" ± {Z95 * se:.3f}"))
    table.append(f"| {d} | {first['draft_kind']} | "
                 f"{format_count(first['draft_params'])} | {cols[0]} | "
                 f"{cols[1]} |")
  how = {frozenset({True}): "±95% CI over prompts",
         frozenset({False}): "±95% binomial CI over judged drafts, as if "
         "independent: too narrow, most at T=0 (this sweep predates per-row "
         "counts)"}.get(frozenset(by_rows), "±95% CI over prompts where the "
                        "cells record their rows, else binomial over drafts")
  lines += ["", f"## Every draft (α̂ pooled over γ, {how})", "",
            "| Draft | Kind | Size | α T=0 | α T=1 |",
            "| --- | --- | --- | --- | --- |", *table]
  lines += ["", f"_{provenance(rows, metadata)}_"]
  seed = meta_value(metadata, "seed")
  jax_version = meta_value(metadata, "jax_version", "jax")
  extra = [s for s in (f"seed {seed}" if seed else None,
                       f"jax {jax_version}" if jax_version else None) if s]
  if extra:
    lines[-1] = lines[-1][:-1] + " · " + " · ".join(extra) + "_"
  return "\n".join(lines) + "\n"


def summary_table(rows: Sequence[dict]) -> str:
  """One screen of plain text: per draft and temperature, the best gamma.

  Columns: best measured gamma, alpha_hat, tokens per target pass, measured
  end-to-end speedup (±95% CI where known), predicted speedup and efficiency
  (measured / predicted), and, for sweeps with the loop's cost model, the
  same three decode only (prefills and the fixed call cost removed), all at
  that gamma; then where speculation loses. Claims and counts cover measured
  cells only (a finite speedup); a (draft, T) without one is named.

  Raises:
    ValueError: `rows` mix verifiers, gamma modes or batch sizes (pass
      `main_rows(rows)`).
  """
  require_one_setting(rows, "summary_table")
  best = best_cells(rows)
  w = max([18] + [len(d) for d in draft_names(rows)])
  # Plain ASCII headers: combining characters (alpha hat) break alignment.
  decode = has_decomposition(rows)
  header = (f"{'draft':<{w}} {'T':>4} {'best_g':>6} {'alpha':>6} "
            f"{'tok/pass':>8} {'speedup':>15} {'predicted':>9} "
            f"{'effic.':>6}" + (f" {'decode':>6} {'pred.':>6} {'effic.':>6}"
                                if decode else ""))
  lines = [f"Speculative decoding sweep, target {target_name(rows)}: "
           "best gamma by measured speedup", header, "-" * len(header)]
  for d in draft_names(rows):
    for t in temperatures(rows):
      if (d, t) not in best:
        continue
      b = best[(d, t)]
      se = num(b.get("speedup_se"))
      speed = f"{num(b['speedup']):.2f}"
      speed += f" ± {Z95 * se:.2f}" if math.isfinite(se) else "       "
      eff = num(b.get("efficiency"))
      if not math.isfinite(eff) and num(b["predicted_speedup"]) > 0:
        eff = num(b["speedup"]) / num(b["predicted_speedup"])
      lines.append(
          f"{d:<{w}} {t:>4g} {b['gamma']:>6d} {num(b['alpha_hat']):>6.3f} "
          f"{num(b['tokens_per_target_call']):>8.2f} {speed:>15} "
          f"{num(b['predicted_speedup']):>9.2f} {eff:>6.2f}"
          + (f" {num(b['decode_speedup']):>6.2f} "
             f"{num(b['predicted_decode_speedup']):>6.2f} "
             f"{num(b['decode_efficiency']):>6.2f}" if decode else ""))
  lines.append("")
  losers = [f"{d} at T={t:g} (best {num(b['speedup']):.2f}x at "
            f"gamma={b['gamma']})"
            for (d, t), b in best.items() if num(b["speedup"]) < 1.0]
  # Only measured cells count: a claim "for every draft" or "N of M cells"
  # must not cover a (draft, T) whose speedup was never measured.
  measured = [r for r in rows if math.isfinite(num(r["speedup"]))]
  slow = [r for r in measured if num(r["speedup"]) < 1.0]
  unmeasured = [f"{d} at T={t:g}" for d in draft_names(rows)
                for t in temperatures(rows)
                if cells_of(rows, d, t) and (d, t) not in best]
  scope = ("draft and temperature" if not unmeasured else
           "draft and temperature with a measured speedup")
  if losers:
    lines.append("Speculation LOSES (speedup < 1 even at the best gamma): "
                 + "; ".join(losers) + ".")
  elif best:
    lines.append(f"Speculation wins (speedup >= 1) at the best gamma for every "
                 f"{scope}.")
  if unmeasured:
    lines.append("No measured speedup (no finite speedup at any gamma, so no "
                 "row above): " + "; ".join(unmeasured) + ".")
  lines.append(f"{len(slow)} of {len(measured)} (draft, T, gamma) cells with a "
               "measured speedup are slower than autoregressive decoding "
               "(speedup < 1)"
               + (f"; {len(rows) - len(measured)} cells have none."
                  if len(measured) < len(rows) else "."))
  return "\n".join(lines) + "\n"



# --- The verifier and adaptive-gamma axes ------------------------------------

# Issue 11's target: block keeps >= token's tokens per target call (95%), and
# at least this much more where token verification's alpha <= BLOCK_ALPHA_MAX.
BLOCK_GAIN = 0.05
BLOCK_ALPHA_MAX = 0.9
# Issue 12's target: auto beats the best fixed gamma by AUTO_GAIN, or is
# within AUTO_TOLERANCE of it where no fixed gamma can be beaten.
AUTO_GAIN = 0.08
AUTO_TOLERANCE = 0.02



def _fmt_se(value, se, digits=2) -> str:
  value, se = num(value), num(se)
  if not math.isfinite(value):
    return "–"
  out = f"{value:.{digits}f}"
  return out + (f" ± {Z95 * se:.{digits}f}" if math.isfinite(se) else "")


def verifier_table_markdown(rows: Sequence[dict],
                            metadata: dict | None = None) -> str:
  """Every verifier cell: exact or LOSSY, tokens per call, speedup, and the
  lossy verifiers' estimated per-token TV (`specjax.harness.distortion`) beside it."""
  rows = verifier_rows(rows)
  if not rows:
    return ""
  lines = [
      "# Verifiers at equal draft compute (same draft, same γ)", "",
      "| draft | T | batch | verifier | lossy | γ | α̂ | tokens / target "
      "call | speedup | TV per token |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  specs = verifier_names(rows)
  for d, t, b in group_keys(rows):
    for v in specs:
      for r in sorted((r for r in rows if (r["draft"], r["temperature"],
                                           r["batch_size"], r["verifier"])
                       == (d, t, b, v)), key=lambda r: r["gamma"]):
        tv = ("0 (exact)" if not r["lossy"] else
              _fmt_se(r.get("tv_per_token"), r.get("tv_per_token_se"), 4))
        lines.append(
            f"| {d} | {t:g} | {b} | {v} | {'LOSSY' if r['lossy'] else 'no'} "
            f"| {r['gamma']} | {num(r['alpha_hat']):.3f} | "
            f"{_fmt_se(r['tokens_per_target_call'], r.get('tokens_per_target_call_se'))}"
            f" | {_fmt_se(r['speedup'], r.get('speedup_se'))} | {tv} |")
  lines += ["", "± is a 95% interval. Lossy verifiers are NOT exact: their "
            "text is not distributed as the target's. TV per token: the mean "
            "over generated tokens of TV(the verifier's law at a judged "
            "position, p), an upper bound on the per-token distortion "
            "(`specjax.harness.distortion`).", "",
            f"_{provenance(rows, metadata)}_"]
  return "\n".join(lines) + "\n"


def block_vs_token_report(rows: Sequence[dict]) -> str:
  """Per (draft, T, batch, gamma): block against token tokens per call.

  Checks issue 11's target per cell: block >= token within the 95% interval
  of the difference, and a gain >= BLOCK_GAIN where token's alpha_hat <=
  BLOCK_ALPHA_MAX (n/a at gamma = 1, where block verification is token
  verification, and where alpha is higher). A cell without a positive
  tokens per call on both sides is n/a in both checks and counted in
  neither.
  """
  fixed = [r for r in rows if r["gamma_mode"] == "fixed"]
  index = {(r["draft"], r["temperature"], r["batch_size"], r["gamma"],
            r["verifier"]): r for r in fixed}
  pairs = [(index[k[:4] + ("token",)], r) for k, r in index.items()
           if k[4] == "block" and k[:4] + ("token",) in index]
  if not pairs:
    return ""
  pairs.sort(key=lambda p: (draft_names(fixed).index(p[0]["draft"]),
                            p[0]["temperature"], p[0]["batch_size"],
                            p[0]["gamma"]))
  lines = [f"Block vs token verification, tokens per target call (target: "
           f"block >= token within 95% in every cell; >= +{BLOCK_GAIN:.0%} "
           f"where alpha <= {BLOCK_ALPHA_MAX})",
           f"{'cell':44s} {'alpha':>6} {'token':>6} {'block':>6} "
           f"{'gain':>7}  >=token  +{BLOCK_GAIN:.0%}"]
  counts = {"ok": 0, "pass": 0, "fail": 0, "n/a": 0, "unmeasured": 0}
  for tok, blk in pairs:
    a = num(tok["alpha_hat"])
    t_tok, t_blk = num(tok["tokens_per_target_call"]), num(
        blk["tokens_per_target_call"])
    cell = (f"{tok['draft']} T={tok['temperature']:g} B={tok['batch_size']} "
            f"g={tok['gamma']}")
    # Every target call emits >= 1 token: a missing or non-positive value is
    # no measurement, so the cell is n/a in both checks, neither pass nor fail.
    if not (t_tok > 0 and t_blk > 0 and math.isfinite(t_tok)
            and math.isfinite(t_blk)):
      counts["unmeasured"] += 1
      counts["n/a"] += 1
      lines.append(f"{cell:44s} {_fmt_or_na(a, '.3f'):>6} "
                   f"{_fmt_or_na(t_tok, '.2f'):>6} "
                   f"{_fmt_or_na(t_blk, '.2f'):>6} {'n/a':>7}  {'n/a':>7}  n/a "
                   "(tokens per call not measured)")
      continue
    se = math.sqrt(sum(num(x.get("tokens_per_target_call_se")) ** 2
                       for x in (tok, blk)))
    gain = t_blk / t_tok - 1.0
    at_least = t_blk - t_tok + (Z95 * se if math.isfinite(se) else 0.0) >= 0
    counts["ok"] += at_least
    if tok["gamma"] == 1:
      verdict = "n/a (gamma=1: block is token)"
    elif not math.isfinite(a):
      verdict = "n/a (alpha not measured)"
    elif not a <= BLOCK_ALPHA_MAX:
      verdict = f"n/a (alpha > {BLOCK_ALPHA_MAX})"
    else:
      verdict = "PASS" if gain >= BLOCK_GAIN else "FAIL"
    counts[{"PASS": "pass", "FAIL": "fail"}.get(verdict, "n/a")] += 1
    lines.append(f"{cell:44s} {a:>6.3f} {t_tok:>6.2f} {t_blk:>6.2f} "
                 f"{gain:>+7.1%}  {'yes' if at_least else 'NO':>7}  {verdict}")
  measured = len(pairs) - counts["unmeasured"]
  lines.append(f"block >= token (95%): {counts['ok']} of {measured} cells"
               + (f" ({counts['unmeasured']} more without tokens per call)"
                  if counts["unmeasured"] else "") + "; "
               f"+{BLOCK_GAIN:.0%} where alpha <= {BLOCK_ALPHA_MAX} and gamma "
               f"> 1: {counts['pass']} pass, {counts['fail']} fail "
               f"({counts['n/a']} n/a).")
  return "\n".join(lines) + "\n"


def adaptive_report(rows: Sequence[dict]) -> str:
  """Per (draft, T, batch, verifier): gamma = auto against the sweep's best
  fixed gamma with the same verifier.

  "Faster" is decoding throughput (generated tokens per second): every cell
  of a group decodes the same prompts to the same budget, so auto and each
  fixed gamma compare directly. The ratio of speedups is printed beside it;
  each speedup divides by its own cell's autoregressive timing, which on the
  2-core box moved by up to 2x between cells of one group (the same
  program), so that ratio carries the baseline's noise as well.

  Verdicts (issue 12), on throughput: BEATS when auto's is >= (1 +
  AUTO_GAIN) x the best fixed gamma's, MATCHES when within AUTO_TOLERANCE of
  it, else MISSES; n/a (not counted) where auto's throughput is missing.
  """
  rows = adaptive_rows(rows)
  if not rows:
    return ""
  w = max([40] + [len(f"{r['draft']} T={r['temperature']:g} "
                      f"B={r['batch_size']} {r['verifier']}") for r in rows])
  lines = [f"gamma = auto vs the best fixed gamma of the sweep (target: >= "
           f"+{AUTO_GAIN:.0%}, or within {AUTO_TOLERANCE:.0%} where no fixed "
           "gamma can be beaten; judged on tokens/s)",
           f"{'cell':{w}s} {'auto tok/s':>10} {'mean_g':>6} "
           f"{'best fixed':>14} {'auto/best':>9} {'speedup ratio':>13}  "
           "verdict"]
  verdicts = []
  unmeasured = 0
  rate = lambda r: num(r.get("spec_tokens_per_s"))
  verifiers = sorted({r["verifier"] for r in rows})
  for d, t, b in group_keys(rows):
    # Auto is compared with fixed gammas of its own verifier only: another
    # verifier's fixed gamma is a different decoder.
    for v in verifiers:
      cells = [r for r in rows if (r["draft"], r["temperature"],
                                   r["batch_size"], r["verifier"])
               == (d, t, b, v)]
      auto = next((r for r in cells if r["gamma_mode"] == "auto"), None)
      # A rate of 0 is no measurement, and dividing by it would raise.
      fixed = [r for r in cells if r["gamma_mode"] == "fixed"
               and math.isfinite(rate(r)) and rate(r) > 0]
      if auto is None:
        continue
      label = f"{d} T={t:g} B={b} {v}"
      if not fixed:
        unmeasured += 1
        lines.append(f"{label:{w}s} {_fmt_or_na(rate(auto), '.0f'):>10} "
                     f"{num(auto.get('mean_draft_length')):>6.2f} "
                     f"{'n/a':>14} {'n/a':>9} {'n/a':>13}  "
                     "n/a (no fixed gamma's tokens/s measured)")
        continue
      best = max(sorted(fixed, key=lambda r: r["gamma"]), key=rate)
      ratio = rate(auto) / rate(best)
      # max() over a list holding NaN depends on where the NaN sits.
      speedups = [x for x in (num(r["speedup"]) for r in fixed)
                  if math.isfinite(x) and x > 0]
      by_speedup = (num(auto["speedup"]) / max(speedups) if speedups
                    else math.nan)
      if not math.isfinite(ratio):
        verdict = "n/a (auto's tokens/s not measured)"
        unmeasured += 1
      else:
        verdict = ("BEATS" if ratio >= 1 + AUTO_GAIN else "MATCHES"
                   if ratio >= 1 - AUTO_TOLERANCE else "MISSES")
        verdicts.append(verdict)
      lines.append(
          f"{label:{w}s} {_fmt_or_na(rate(auto), '.0f'):>10} "
          f"{num(auto.get('mean_draft_length')):>6.2f} "
          f"{'g=' + str(best['gamma']) + ' ' + format(rate(best), '.0f'):>14}"
          f" {_fmt_or_na(ratio, '.3f'):>9}"
          f" {_fmt_or_na(by_speedup, '.3f'):>13}  {verdict}")
  lines.append(", ".join(f"{verdicts.count(v)} {v}" for v in
                         ("BEATS", "MATCHES", "MISSES")) + f" of "
               f"{len(verdicts)} cells"
               + (f" ({unmeasured} n/a: tokens/s not measured)."
                  if unmeasured else "."))
  return "\n".join(lines) + "\n"



# --- The run ----------------------------------------------------------------


def models_table(metadata: dict) -> str:
  """The models of the run with their size and held-out bits per byte."""
  models = metadata.get("models") or {}
  if not models:
    return ""
  lines = ["Models (held-out bits per byte on the corpus' held-out split)",
           f"{'model':34s} {'kind':13s} {'parameters':>11s} {'bits/byte':>9s}"]
  for name, m in models.items():
    bpb = m.get("heldout_bpb")
    lines.append(f"{name:34s} {m.get('kind', ''):13s} {m.get('params', 0):>11,d} "
                 + (f"{bpb:9.3f}" if bpb is not None else f"{'-':>9s}"))
  return "\n".join(lines) + "\n\n"


def main_rows_note(rows: Sequence[dict]) -> str:
  """Which of `rows` figures (a)-(f) and Table 3 leave out, and why.

  A count per reason (another verifier, gamma = auto, a larger batch) and
  the drafts with no row left, so a draft or verifier that vanished from
  the main figures is stated, not silently missing. "" when none is left out.
  """
  main = main_rows(rows)
  if len(main) == len(rows):
    return ""
  other = [r for r in rows if r["verifier"] != "token"]
  auto = [r for r in rows
          if r["verifier"] == "token" and r["gamma_mode"] == "auto"]
  batch = main[0]["batch_size"] if main else None
  larger = [r for r in rows if r["verifier"] == "token"
            and r["gamma_mode"] == "fixed" and r["batch_size"] != batch]
  if not main:
    lines = [f"Figures (a)-(f) and Table 3 NOT drawn: none of the {len(rows)} "
             "rows is token verifier with fixed gamma (the rows they read)."]
  else:
    lines = [f"Figures (a)-(f), Table 3 and the best-gamma table read "
             f"{len(main)} of {len(rows)} rows (token verifier, fixed gamma, "
             f"batch {batch}); left out:"]
  if other:
    lines.append(f"  {len(other)} rows of other verifiers ("
                 + ", ".join(sorted({r['verifier'] for r in other})) + ")")
  if auto:
    lines.append(f"  {len(auto)} token rows with gamma = auto")
  if larger:
    lines.append(f"  {len(larger)} token fixed-gamma rows at batch "
                 + ", ".join(str(b) for b in
                             sorted({r['batch_size'] for r in larger}))
                 + f" (the main figures read the smallest batch, {batch})")
  kept = {r["draft"] for r in main}
  gone = [d for d in draft_names(rows) if d not in kept]
  if gone and main:
    lines.append("  drafts with no row in them: " + ", ".join(gone))
  return "\n".join(lines) + "\n"

