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



# --- Formatting ---------------------------------------------------------------


def _fmt_or_na(value: float, spec: str) -> str:
  """format(value, spec), or "n/a" where nothing was measured (NaN)."""
  return format(value, spec) if math.isfinite(value) else "n/a"



def _format_alpha(a: float) -> str:
  """Two decimals without the leading zero, as in the paper: .88."""
  if not math.isfinite(a):
    return "–"
  s = f"{a:.2f}"
  return s[1:] if s.startswith("0.") else s



# --- The cost model -----------------------------------------------------------


def efficiency_report(rows: Sequence[dict], *, alpha_min: float = 0.5,
                      band: tuple[float, float] = (0.9, 1.1)) -> str:
  """The cost model's check, as text: measured / predicted speedup per cell.

  Efficiency is measured / predicted speedup: 1 where the cost model
  (`measure.predict`) priced the cell exactly, < 1 where the loop ran slower
  than priced. For decode only and end to end, over the cells with
  alpha_hat >= `alpha_min`: the median, the range and the share of cells
  inside `band`. Then every cell (of any alpha_hat) whose decode efficiency
  lies outside `band` and whose 95% interval excludes 1, with the component
  `measure.decompose` found off and by how much. A cell without a decode
  efficiency is left out of that list.

  Args:
    rows: one setting's rows (`main_rows`).
    alpha_min: the cells the median and the share cover. The default 0.5
      keeps the drafts accepted at least as often as rejected; 0 covers every
      cell.
    band: (lo, hi): the efficiencies reported as near the prediction; the
      default is within 10% of it. It describes the spread; the report
      expects no share of cells inside it.

  Returns:
    The report, lines ending in "\n"; "" for rows written before the loop's
    cost model (`has_decomposition`).

  Raises:
    ValueError: `rows` mix verifiers, gamma modes or batch sizes (pass
      `main_rows(rows)`), or `band` is not two finite numbers lo <= hi.
  """
  require_one_setting(rows, "efficiency_report")
  lo, hi = (num(x) for x in band)
  if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
    raise ValueError(f"band must be (lo, hi), finite with lo <= hi, got "
                     f"{band!r}.")
  if not has_decomposition(rows):
    return ""
  lines = ["Cost model check: efficiency = measured / predicted speedup (1: "
           f"as predicted), over the cells with alpha_hat >= {alpha_min:g}"]
  for key, name in (("decode_efficiency", "decode only"),
                    ("efficiency", "end to end")):
    eff = np.array([num(r.get(key)) for r in rows
                    if num(r["alpha_hat"]) >= alpha_min])
    eff = eff[np.isfinite(eff)]
    if not eff.size:
      lines.append(f"  {name}: no cells with alpha_hat >= {alpha_min:g}.")
      continue
    share = float(np.mean((eff >= lo) & (eff <= hi)))
    lines.append(f"  {name:11s}: median {float(np.median(eff)):.3f}, "
                 f"{share:.0%} of {eff.size} cells in [{lo:g}, {hi:g}] "
                 f"(range {eff.min():.2f}-{eff.max():.2f})")
  misses = []
  for r in rows:
    eff = num(r.get("decode_efficiency"))
    se = num(r.get("decode_efficiency_se"))
    covers = math.isfinite(se) and abs(eff - 1) <= Z95 * se
    if not math.isfinite(eff) or lo <= eff <= hi or covers:
      continue
    misses.append(f"  {r['draft']} T={r['temperature']:g} g={r['gamma']}: "
                  f"decode {eff:.2f}"
                  + (f" ± {Z95 * se:.2f}" if math.isfinite(se) else "")
                  + f"; {_component_note(r)}")
  if misses:
    lines.append(f"Cells outside [{lo:g}, {hi:g}] whose 95% interval "
                 "excludes 1 (decode only), and the component off:")
    lines += misses
  else:
    lines.append(f"Every cell outside [{lo:g}, {hi:g}] has a 95% interval "
                 "covering 1.")
  return "\n".join(lines) + "\n"


def _component_note(row: dict) -> str:
  """'verify: 0.310 ms in the loop vs 0.250 ms predicted (factor 0.81)'."""
  off = row.get("off") or ""
  if not off:
    return "no single component more than 10% off"
  factor = num(row.get(f"factor_{off}"))
  ms = lambda x: f"{1e3 * num(x):.3f} ms"
  if off == "acceptance":
    detail = (f"{num(row['measured_loop_rounds']):.1f} rounds vs "
              f"{num(row['predicted_loop_rounds']):.1f} predicted from "
              "alpha_hat")
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


# --- Table 3 and the best gamma -----------------------------------------------


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

def _ratio_interval(top: float, top_se: float, bottom: float,
                    bottom_se: float) -> tuple[float, float, float]:
  """(top / bottom, and its 95% interval's lo and hi).

  The interval is the delta method's, the two measurements' se taken as
  independent (the sweep stores no covariance between cells); lo and hi are
  NaN where either se is missing. All three are NaN unless top and bottom
  are both > 0 (a measured rate or speedup is).
  """
  if not (top > 0 and bottom > 0):
    return math.nan, math.nan, math.nan
  ratio = top / bottom
  rel = math.hypot(top_se / top, bottom_se / bottom)
  half = Z95 * ratio * rel
  if not math.isfinite(half):
    return ratio, math.nan, math.nan
  return ratio, ratio - half, ratio + half


def _fmt_se(value, se, digits=2) -> str:
  value, se = num(value), num(se)
  if not math.isfinite(value):
    return "–"
  out = f"{value:.{digits}f}"
  return out + (f" ± {Z95 * se:.{digits}f}" if math.isfinite(se) else "")


def verifier_table_markdown(rows: Sequence[dict],
                            metadata: dict | None = None) -> str:
  """Every verifier cell: exact or LOSSY, tokens per call, speedup, and the
  lossy verifiers' estimated per-token TV (`specjax.harness.distortion`)
  beside it; "" where no group compared verifiers."""
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
        tokens = _fmt_se(r["tokens_per_target_call"],
                         r.get("tokens_per_target_call_se"))
        lines.append(
            f"| {d} | {t:g} | {b} | {v} | {'LOSSY' if r['lossy'] else 'no'} "
            f"| {r['gamma']} | {num(r['alpha_hat']):.3f} | {tokens} | "
            f"{_fmt_se(r['speedup'], r.get('speedup_se'))} | {tv} |")
  lines += ["", "± is a 95% interval. Lossy verifiers are NOT exact: their "
            "text is not distributed as the target's. TV per token: the mean "
            "over generated tokens of TV(the verifier's law at a judged "
            "position, p), an upper bound on the per-token distortion "
            "(`specjax.harness.distortion`).", "",
            f"_{provenance(rows, metadata)}_"]
  return "\n".join(lines) + "\n"


def block_vs_token_report(rows: Sequence[dict]) -> str:
  """Per (draft, T, batch, gamma): block against token tokens per call.

  For each fixed-gamma cell that ran both verifiers: token's alpha_hat, the
  tokens per target call of each, the gain block / token - 1 with its 95%
  interval (`_ratio_interval`), and whether block >= token within that
  interval (its upper end >= 0). At gamma = 1 block verification is token
  verification, so the gain there is 0 up to noise. A cell without a
  positive tokens per call on both sides (every target call emits >= 1
  token) or without both se is n/a in the last columns and counted apart.

  The last line counts the cells with block >= token within the interval,
  and, at gamma > 1, those whose interval lies above 0 (block measurably
  ahead).

  Returns:
    The report, lines ending in "\n"; "" where no cell ran both verifiers.
  """
  fixed = [r for r in rows if r["gamma_mode"] == "fixed"]
  index = {(r["draft"], r["temperature"], r["batch_size"], r["gamma"],
            r["verifier"]): r for r in fixed}
  pairs = [(index[k[:4] + ("token",)], r) for k, r in index.items()
           if k[4] == "block" and k[:4] + ("token",) in index]
  if not pairs:
    return ""
  order = draft_names(fixed)
  pairs.sort(key=lambda p: (order.index(p[0]["draft"]), p[0]["temperature"],
                            p[0]["batch_size"], p[0]["gamma"]))
  lines = ["Block vs token verification, tokens per target call: gain = "
           "block / token - 1, its 95% interval, block >= token within it",
           f"{'cell':44s} {'alpha':>6} {'token':>6} {'block':>6} "
           f"{'gain':>7} {'95% interval':>16}  >=token"]
  unmeasured, no_se, at_least, deeper, above = 0, 0, 0, 0, 0
  for tok, blk in pairs:
    a = num(tok["alpha_hat"])
    t_tok = num(tok["tokens_per_target_call"])
    t_blk = num(blk["tokens_per_target_call"])
    cell = (f"{tok['draft']} T={tok['temperature']:g} B={tok['batch_size']} "
            f"g={tok['gamma']}")
    note = "  (gamma=1: block is token)" if tok["gamma"] == 1 else ""
    if not (t_tok > 0 and t_blk > 0 and math.isfinite(t_tok)
            and math.isfinite(t_blk)):
      unmeasured += 1
      lines.append(f"{cell:44s} {_fmt_or_na(a, '.3f'):>6} "
                   f"{_fmt_or_na(t_tok, '.2f'):>6} "
                   f"{_fmt_or_na(t_blk, '.2f'):>6} {'n/a':>7} {'n/a':>16}  "
                   "    n/a  (tokens per call not measured)")
      continue
    ratio, lo, hi = _ratio_interval(
        t_blk, num(blk.get("tokens_per_target_call_se")),
        t_tok, num(tok.get("tokens_per_target_call_se")))
    if not math.isfinite(lo):
      no_se += 1
      interval, ok = "n/a", "n/a"
      note += "  (no se)"
    else:
      interval = f"[{lo - 1:+.1%}, {hi - 1:+.1%}]"
      ok = "yes" if hi >= 1 else "no"
      at_least += hi >= 1
      if tok["gamma"] > 1:
        deeper += 1
        above += lo > 1
    lines.append(f"{cell:44s} {_fmt_or_na(a, '.3f'):>6} {t_tok:>6.2f} "
                 f"{t_blk:>6.2f} {ratio - 1:>+7.1%} {interval:>16}  "
                 f"{ok:>7}{note}")
  measured = len(pairs) - unmeasured - no_se
  apart = [f"{n} more {why}" for n, why in (
      (unmeasured, "without tokens per call"), (no_se, "without an se")) if n]
  lines.append(f"block >= token within 95%: {at_least} of {measured} cells"
               + (f" ({'; '.join(apart)})" if apart else "")
               + f"; block > token beyond 95% (interval above 0): {above} of "
               f"{deeper} cells with gamma > 1.")
  return "\n".join(lines) + "\n"


def adaptive_report(rows: Sequence[dict]) -> str:
  """Per (draft, T, batch, verifier): gamma = auto against the sweep's best
  fixed gamma with the same verifier.

  Two ratios per cell, auto's over the best fixed gamma's:
    auto/best      decoding throughput (generated tokens per second), the
                   best fixed gamma chosen on it. Every cell of a group
                   decodes the same prompts to the same budget, so they
                   compare directly. The sweep stores no se for tokens per
                   second: no interval.
    speedup ratio  auto's speedup over the highest fixed-gamma speedup, with
                   its 95% interval (`_ratio_interval`). Each speedup divides
                   by its own cell's autoregressive timing, so this ratio
                   carries that baseline's noise as well.
  The best of several noisy fixed gammas is biased upward, so both ratios
  lean below 1 where the fixed gammas are close.

  The last lines give the median and range of auto/best, and how many
  speedup-ratio intervals lie above 1, cover 1 and lie below 1. A cell
  whose tokens/s (auto's, or every fixed gamma's) or speedups were not
  measured is n/a there and counted apart.

  Returns:
    The report, lines ending in "\n"; "" where no group ran gamma = auto.
  """
  rows = adaptive_rows(rows)
  if not rows:
    return ""
  w = max([40] + [len(f"{r['draft']} T={r['temperature']:g} "
                      f"B={r['batch_size']} {r['verifier']}") for r in rows])
  lines = ["gamma = auto vs the best fixed gamma of the sweep: auto/best on "
           "tokens/s; speedup ratio with its 95% interval",
           f"{'cell':{w}s} {'auto tok/s':>10} {'mean_g':>6} "
           f"{'best fixed':>14} {'auto/best':>9} {'speedup ratio':>13} "
           f"{'95% interval':>16}"]
  ratios = []
  unmeasured = 0
  sides = {"above": 0, "covers": 0, "below": 0, "n/a": 0}
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
      if auto is None:
        continue
      label = f"{d} T={t:g} B={b} {v}"
      # A rate or speedup of 0 is no measurement, and dividing by it would
      # raise; max() over a list holding NaN depends on where the NaN sits.
      fixed = [r for r in cells if r["gamma_mode"] == "fixed"
               and math.isfinite(rate(r)) and rate(r) > 0]
      fast = [r for r in cells if r["gamma_mode"] == "fixed"
              and math.isfinite(num(r["speedup"])) and num(r["speedup"]) > 0]
      best = (max(sorted(fixed, key=lambda r: r["gamma"]), key=rate)
              if fixed else None)
      ratio = rate(auto) / rate(best) if best else math.nan
      by_speedup, lo, hi = math.nan, math.nan, math.nan
      if fast and num(auto["speedup"]) > 0:
        top = max(sorted(fast, key=lambda r: r["gamma"]),
                  key=lambda r: num(r["speedup"]))
        by_speedup, lo, hi = _ratio_interval(
            num(auto["speedup"]), num(auto.get("speedup_se")),
            num(top["speedup"]), num(top.get("speedup_se")))
      side = ("n/a" if not math.isfinite(lo) else "above" if lo > 1 else
              "below" if hi < 1 else "covers")
      sides[side] += 1
      if math.isfinite(ratio):
        ratios.append(ratio)
        note = ""
      else:
        unmeasured += 1
        note = ("  (no fixed gamma's tokens/s measured)" if best is None
                else "  (auto's tokens/s not measured)")
      best_text = (f"g={best['gamma']} {rate(best):.0f}" if best else "n/a")
      interval = (f"[{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) else "n/a")
      lines.append(
          f"{label:{w}s} {_fmt_or_na(rate(auto), '.0f'):>10} "
          f"{num(auto.get('mean_draft_length')):>6.2f} {best_text:>14} "
          f"{_fmt_or_na(ratio, '.3f'):>9} {_fmt_or_na(by_speedup, '.3f'):>13} "
          f"{interval:>16}{note}")
  if ratios:
    lines.append(f"auto/best on tokens/s: median {np.median(ratios):.3f} "
                 f"(range {min(ratios):.3f}-{max(ratios):.3f}) over "
                 f"{len(ratios)} cells"
                 + (f" ({unmeasured} more: tokens/s not measured)."
                    if unmeasured else "."))
  else:
    lines.append(f"auto/best on tokens/s: no cell measured ({unmeasured} "
                 "cells).")
  lines.append(f"speedup ratio's 95% interval: above 1 in {sides['above']}, "
               f"covers 1 in {sides['covers']}, below 1 in {sides['below']} "
               f"of {sides['above'] + sides['covers'] + sides['below']} cells"
               + (f" ({sides['n/a']} more: no speedup or no se)."
                  if sides["n/a"] else "."))
  return "\n".join(lines) + "\n"


# --- The run ------------------------------------------------------------------


def models_table(metadata: dict) -> str:
  """The models of the run with their size and held-out bits per byte."""
  models = metadata.get("models") or {}
  if not models:
    return ""
  lines = ["Models (held-out bits per byte on the corpus' held-out split)",
           f"{'model':34s} {'kind':13s} {'parameters':>11s} {'bits/byte':>9s}"]
  for name, m in models.items():
    bpb = m.get("heldout_bpb")
    lines.append(f"{name:34s} {m.get('kind', ''):13s} "
                 f"{m.get('params', 0):>11,d} "
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

