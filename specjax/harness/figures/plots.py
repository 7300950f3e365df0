r"""Every matplotlib figure of a sweep, written as PNG and PDF.

  fig_alpha_vs_overlap       (a) alpha_hat against 1 - TV, y = x line
  fig_tokens_per_pass        (b) tokens per target pass against gamma,
                                 measured vs (1 - a^(g+1)) / (1 - a)
  fig_speedup_vs_gamma       (c) wall-clock speedup against gamma, measured
                                 vs predicted, best gamma
  fig_speedup_vs_draft_size  (d) speedup at the best gamma against draft size
  fig_round_decomposition    (f) time per generated token, split into draft /
                                 verify / other, predicted beside measured,
                                 per cell
  fig_verifiers              (g) per verifier: tokens per target call and
                                 measured speedup against gamma (same draft,
                                 same gamma: equal draft compute); lossy
                                 verifiers dashed
  fig_adaptive_gamma         (h) gamma = auto against every fixed gamma, per
                                 draft and batch size
  `plot_batch_scaling`           speedup and c(B), r(B) against batch size,
                                 from `measure.compare` rows

(a)-(f) read one (verifier, gamma_mode, batch_size) setting and refuse rows
mixing them: pass `rows.main_rows(rows)`. (g) and (h) select their own rows
(`verifier_rows`, `adaptive_rows`).

Measured values are markers with 95% (1.96 * se) error bars; the i.i.d.
formulas of `specjax.accounting` are lines. Nothing is refit here: every
predicted number is the one the sweep stored for that cell.

Every `plot_*` takes `(rows, path_stem, metadata=None)`, writes
`path_stem.png` and `path_stem.pdf`, and returns their paths.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import matplotlib

# Agg: figures are written to files on headless machines (CI, TPU hosts);
# set before pyplot is imported so no GUI backend is ever probed.
matplotlib.use("Agg")
# pylint: disable=g-import-not-at-top
import matplotlib.patches
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
import numpy as np

from specjax import accounting
from specjax.harness.figures.rows import adaptive_rows
from specjax.harness.figures.rows import best_cells
from specjax.harness.figures.rows import cells_of
from specjax.harness.figures.rows import draft_names
from specjax.harness.figures.rows import format_count
from specjax.harness.figures.rows import group_keys
from specjax.harness.figures.rows import num
from specjax.harness.figures.rows import provenance
from specjax.harness.figures.rows import require_one_setting
from specjax.harness.figures.rows import temperatures
from specjax.harness.figures.rows import verifier_names
from specjax.harness.figures.rows import verifier_rows
from specjax.harness.figures.rows import Z95
# pylint: enable=g-import-not-at-top

# The main figures, (a)-(f), in the order `make_all` draws them.
FIGURE_NAMES = ("fig_alpha_vs_overlap", "fig_tokens_per_pass",
                "fig_speedup_vs_gamma", "fig_speedup_vs_draft_size",
                "fig_round_decomposition")

# One marker per draft kind, shared by every figure.
KIND_MARKERS = {"unigram": "v", "bigram": "^", "prompt_lookup": "s",
                "transformer": "o", "distilled": "D", "self": "P",
                "eagle": "*"}

_DPI = 150


# --- Shared drawing ---------------------------------------------------------


def _colors(rows: Sequence[dict]) -> dict[str, Any]:
  """One fixed colour per draft, shared by every figure."""
  cmap = plt.get_cmap("tab10")
  return {d: cmap(i % 10) for i, d in enumerate(draft_names(rows))}



def _temperature_label(t: float) -> str:
  return "T = 0 (greedy)" if t == 0 else f"T = {t:g}"



def _predicted_tokens(row: dict) -> float:
  """The stored prediction, recomputed from alpha_hat only if it is absent."""
  value = num(row.get("predicted_tokens_per_target_call"))
  if math.isfinite(value):
    return value
  a = num(row["alpha_hat"])
  if not math.isfinite(a):
    return math.nan
  return float(accounting.expected_tokens_per_pass(
      min(max(a, 0.0), 1.0), int(row["gamma"])))



def _new_figure(rows, title, metadata, panel_width=5.6):
  temps = temperatures(rows)
  fig, axes = plt.subplots(1, len(temps),
                           figsize=(panel_width * len(temps), 4.6),
                           squeeze=False, constrained_layout=True)
  fig.suptitle(f"{title}\n{provenance(rows, metadata)}", fontsize=10)
  return fig, list(zip(temps, axes[0]))


def _save(fig, path_stem: str) -> list[str]:
  """Writes `path_stem`.png and .pdf, closes the figure, returns the paths."""
  os.makedirs(os.path.dirname(os.path.abspath(path_stem)), exist_ok=True)
  paths = []
  for ext in ("png", "pdf"):
    path = f"{path_stem}.{ext}"
    fig.savefig(path, dpi=_DPI)
    paths.append(path)
  plt.close(fig)
  return paths


def _finish(fig, path_stem: str, handles, ncol: int) -> list[str]:
  # One legend for all panels, below them, so the data are never covered.
  fig.legend(handles=handles, loc="outside lower center", ncol=ncol,
             fontsize=8, frameon=False)
  return _save(fig, path_stem)


def _draft_handles(rows, colors) -> list:
  first = {}
  for r in rows:
    first.setdefault(r["draft"], r)
  return [Line2D([], [], color=colors[d], marker=KIND_MARKERS.get(
      first[d]["draft_kind"], "o"), linestyle="-",
                 label=f"{d} ({format_count(first[d]['draft_params'])})")
          for d in draft_names(rows)]


def _errorbar(ax, x, y, se, **kwargs):
  se = np.asarray([num(s) for s in se], dtype=np.float64)
  yerr = np.where(np.isfinite(se), Z95 * se, 0.0)
  kwargs.setdefault("markersize", 5.5)
  ax.errorbar(x, y, yerr=yerr, linestyle="none", capsize=2.5,
              elinewidth=1.0, **kwargs)



# --- Figures ----------------------------------------------------------------


def plot_alpha_vs_overlap(rows: Sequence[dict], path_stem: str,
                          metadata: dict | None = None) -> list[str]:
  """(a) alpha_hat against 1 - TV per draft, y = x line, 95% CIs.

  One point per (draft, gamma) cell. Exactness predicts alpha = 1 - TV, so
  points should straddle the diagonal within their error bars.

  Returns:
    The written paths, `path_stem.png` and `path_stem.pdf`.
  """
  require_one_setting(rows, "plot_alpha_vs_overlap")
  colors = _colors(rows)
  fig, panels = _new_figure(
      rows, "(a) Acceptance rate α̂ against draft/target overlap 1 − TV",
      metadata, panel_width=4.8)
  for t, ax in panels:
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1.0,
            zorder=0)
    for d in draft_names(rows):
      cells = cells_of(rows, d, t)
      if not cells:
        continue
      _errorbar(ax, [num(c["one_minus_tv"]) for c in cells],
                [num(c["alpha_hat"]) for c in cells],
                [c["alpha_se"] for c in cells], color=colors[d],
                marker=KIND_MARKERS.get(cells[0]["draft_kind"], "o"))
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)
    ax.set_title(_temperature_label(t), fontsize=10)
    ax.set_xlabel("1 − TV(p, q): mean Σ min(p, q) over verified positions")
    ax.set_ylabel("α̂ = accepted / verified draft tokens")
  handles = _draft_handles(rows, colors) + [
      Line2D([], [], color="0.5", linestyle="--", label="y = x (exactness)"),
      Line2D([], [], color="k", marker="o", linestyle="none",
             label="one γ cell, ±95% CI")]
  return _finish(fig, path_stem, handles, ncol=4)


def plot_tokens_per_pass(rows: Sequence[dict], path_stem: str,
                         metadata: dict | None = None) -> list[str]:
  """(b) tokens per target pass against gamma, measured vs the formula.

  The line for a draft joins (1 - a^(g+1)) / (1 - a) evaluated at each
  cell's own alpha_hat; markers are the measured block efficiency with 95%
  CIs. The gap between them is the i.i.d.-acceptance assumption failing.
  """
  require_one_setting(rows, "plot_tokens_per_pass")
  colors = _colors(rows)
  fig, panels = _new_figure(
      rows, "(b) Tokens per target pass against γ: measured vs "
      "(1 − α^(γ+1)) / (1 − α)", metadata)
  gammas = sorted({r["gamma"] for r in rows})
  for t, ax in panels:
    g_line = np.arange(0, max(gammas) + 2)
    ax.plot(g_line, g_line + 1, color="0.6", linestyle=":", linewidth=1.0,
            zorder=0)
    for d in draft_names(rows):
      cells = cells_of(rows, d, t)
      if not cells:
        continue
      g = [c["gamma"] for c in cells]
      ax.plot(g, [_predicted_tokens(c) for c in cells], color=colors[d],
              linewidth=1.3, alpha=0.9)
      _errorbar(ax, g, [num(c["tokens_per_target_call"]) for c in cells],
                [c["tokens_per_target_call_se"] for c in cells],
                color=colors[d],
                marker=KIND_MARKERS.get(cells[0]["draft_kind"], "o"))
    ax.set_xlim(min(gammas) - 0.4, max(gammas) + 0.4)
    top = max([num(r["tokens_per_target_call"]) for r in rows
               if math.isfinite(num(r["tokens_per_target_call"]))] + [1.0])
    ax.set_ylim(0.8, min(max(gammas) + 1.2, top * 1.15 + 0.3))
    ax.set_xticks(gammas)
    ax.grid(alpha=0.3)
    ax.set_title(_temperature_label(t), fontsize=10)
    ax.set_xlabel("γ (draft tokens proposed per round)")
    ax.set_ylabel("tokens emitted per target call")
  handles = _draft_handles(rows, colors) + [
      Line2D([], [], color="k", linestyle="-",
             label="predicted from α̂, last round cut at the budget"),
      Line2D([], [], color="k", marker="o", linestyle="none",
             label="measured, ±95% CI"),
      Line2D([], [], color="0.6", linestyle=":", label="γ + 1 (ceiling)")]
  return _finish(fig, path_stem, handles, ncol=4)


def plot_speedup_vs_gamma(rows: Sequence[dict], path_stem: str,
                          metadata: dict | None = None) -> list[str]:
  """(c) wall-clock speedup against gamma per draft, measured vs predicted.

  Lines: walltime_improvement(alpha_hat, gamma, c, r) with the cell's
  measured c and r. Markers: measured spec / autoregressive tokens per
  second (95% CI where the sweep gave an se). A star marks each draft's best
  measured gamma; the dashed y = 1 line is break-even.
  """
  require_one_setting(rows, "plot_speedup_vs_gamma")
  colors = _colors(rows)
  best = best_cells(rows)
  fig, panels = _new_figure(
      rows, "(c) Wall-clock speedup against γ: measured vs predicted",
      metadata)
  gammas = sorted({r["gamma"] for r in rows})
  for t, ax in panels:
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0, zorder=0)
    for d in draft_names(rows):
      cells = cells_of(rows, d, t)
      if not cells:
        continue
      g = [c["gamma"] for c in cells]
      ax.plot(g, [num(c["predicted_speedup"]) for c in cells],
              color=colors[d], linewidth=1.3, alpha=0.9)
      _errorbar(ax, g, [num(c["speedup"]) for c in cells],
                [c.get("speedup_se") for c in cells], color=colors[d],
                marker=KIND_MARKERS.get(cells[0]["draft_kind"], "o"))
      if (d, t) in best:
        b = best[(d, t)]
        ax.plot([b["gamma"]], [num(b["speedup"])], marker="*",
                markersize=15, color=colors[d], markeredgecolor="k",
                markeredgewidth=0.8, linestyle="none", zorder=5)
    ax.set_xticks(gammas)
    ax.grid(alpha=0.3)
    ax.set_title(_temperature_label(t), fontsize=10)
    ax.set_xlabel("γ (draft tokens proposed per round)")
    ax.set_ylabel("speedup over autoregressive (× tokens/s)")
  handles = _draft_handles(rows, colors) + [
      Line2D([], [], color="k", linestyle="-",
             label="predicted E[tokens] / (γc + r)"),
      Line2D([], [], color="k", marker="o", linestyle="none",
             label="measured, ±95% CI"),
      Line2D([], [], color="w", marker="*", markersize=12,
             markeredgecolor="k", linestyle="none",
             label="best γ (measured)"),
      Line2D([], [], color="0.3", linestyle="--", label="break-even (1×)")]
  return _finish(fig, path_stem, handles, ncol=4)


def plot_speedup_vs_draft_size(rows: Sequence[dict], path_stem: str,
                               metadata: dict | None = None) -> list[str]:
  """(d) speedup at each draft's best gamma against the draft's size.

  Filled markers: measured (95% CI); hollow: the prediction at that gamma.
  The x axis is symlog so prompt lookup (0 parameters) sits at 0 beside the
  n-gram tables and Transformers.
  """
  require_one_setting(rows, "plot_speedup_vs_draft_size")
  colors = _colors(rows)
  best = best_cells(rows)
  fig, panels = _new_figure(
      rows, "(d) Speedup at the best γ against draft size", metadata)
  for t, ax in panels:
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0, zorder=0)
    for i, d in enumerate(draft_names(rows)):
      if (d, t) not in best:
        continue
      b = best[(d, t)]
      x = max(int(b["draft_params"]), 0)
      marker = KIND_MARKERS.get(b["draft_kind"], "o")
      _errorbar(ax, [x], [num(b["speedup"])], [b.get("speedup_se")],
                color=colors[d], marker=marker, markersize=8)
      ax.plot([x], [num(b["predicted_speedup"])], marker=marker,
              markersize=8, markerfacecolor="none", markeredgecolor=colors[d],
              linestyle="none")
      ax.annotate(f"{d}, γ*={b['gamma']}", (x, num(b["speedup"])),
                  textcoords="offset points", fontsize=7,
                  # Alternate above/below: drafts of equal size share an x.
                  xytext=(6, 5 if i % 2 == 0 else -12))
    ax.set_xscale("symlog", linthresh=1.0)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(_temperature_label(t), fontsize=10)
    ax.set_xlabel("draft size (parameters; n-grams: table entries; "
                  "prompt lookup: 0)")
    ax.set_ylabel("speedup at best γ (× tokens/s)")
    ax.margins(x=0.15, y=0.15)
  handles = _draft_handles(rows, colors) + [
      Line2D([], [], color="k", marker="o", linestyle="none",
             label="measured, ±95% CI"),
      Line2D([], [], color="k", marker="o", markerfacecolor="none",
             linestyle="none", label="predicted at that γ"),
      Line2D([], [], color="0.3", linestyle="--", label="break-even (1×)")]
  return _finish(fig, path_stem, handles, ncol=4)




_PARTS = (("draft", "tab:blue"), ("verify", "tab:orange"), ("other", "0.6"))
_UNSPLIT = "tab:purple"  # a round whose measured split came out negative



def plot_round_decomposition(rows: Sequence[dict], path_stem: str,
                             metadata: dict | None = None) -> list[str]:
  """(f) Where a generated token's time goes: predicted beside measured.

  Per cell, two stacked bars of milliseconds per generated token (decode
  only): left the prediction (each pass timed alone on the loop's shapes,
  the null-loop overhead, the expected tokens per round with the budget
  cut), right the measurement (the real loop's round split by the same loop
  with a null draft, its measured tokens per round). The black tick is the
  autoregressive step (measured): a bar below it is a speedup. Above each
  pair: the decode efficiency and, in red, the component `measure.decompose`
  found off, where there is one. A round whose split came out with a part
  < 0 (the null-draft loop timed slower than the real one) is drawn whole,
  in one colour.
  """
  require_one_setting(rows, "plot_round_decomposition")
  temps = temperatures(rows)
  per_panel = max(len([r for r in rows if r["temperature"] == t])
                  for t in temps)
  fig, axes = plt.subplots(len(temps), 1, squeeze=False,
                           figsize=(max(8.0, 0.42 * per_panel + 1.5),
                                    3.9 * len(temps)),
                           constrained_layout=True)
  fig.suptitle("(f) Decode time per generated token: draft / verify / other,"
               " predicted (left, hatched) vs measured (right)\n"
               + provenance(rows, metadata), fontsize=10)
  for t, ax in zip(temps, axes[:, 0]):
    cells = [c for d in draft_names(rows) for c in cells_of(rows, d, t)]
    tops = []
    for i, c in enumerate(cells):
      pred_tpr = num(c["max_new_tokens"]) / num(c["predicted_loop_rounds"])
      meas_tpr = num(c["max_new_tokens"]) / num(c["measured_loop_rounds"])
      for offset, kind, tpr, hatch in ((-0.2, "predicted", pred_tpr, "//"),
                                       (0.2, "measured", meas_tpr, None)):
        bottom = 0.0
        split = [num(c.get(f"{kind}_{part}_s")) for part, _ in _PARTS[:2]]
        if any(math.isfinite(v) and v < 0 for v in split):
          # The null-draft loop ran slower than the real one: a split below
          # its noise. Drawing it with the negative part at 0 would stack
          # more than the measured round; draw the round whole.
          ms = 1e3 * num(c[f"{kind}_round_s"]) / tpr
          ax.bar(i + offset, ms, width=0.38, color=_UNSPLIT, hatch=hatch,
                 edgecolor="white", linewidth=0.3)
          tops.append(ms)
          continue
        for part, color in _PARTS:
          value = num(c.get(f"{kind}_{part}_s"))
          if part == "draft" and not math.isfinite(value):
            # Round not split: draft and verify as one bar segment.
            value = num(c[f"{kind}_round_s"]) - num(c[f"{kind}_other_s"])
          elif part == "verify" and not math.isfinite(value):
            continue
          ms = 1e3 * value / tpr
          ax.bar(i + offset, ms, width=0.38, bottom=bottom, color=color,
                 hatch=hatch, edgecolor="white", linewidth=0.3)
          bottom += ms
        tops.append(bottom)
      ar_ms = 1e3 * num(c.get("measured_ar_round_s"))
      ax.plot([i - 0.42, i + 0.42], [ar_ms, ar_ms], color="k", linewidth=1.4)
      tops.append(ar_ms)
    top = max([x for x in tops if math.isfinite(x)] + [1e-3])
    for i, c in enumerate(cells):
      eff = num(c.get("decode_efficiency"))
      off = c.get("off") or ""
      ax.text(i, 1.03 * top, f"{eff:.2f}" + (f"\n{off}" if off else ""),
              ha="center", va="bottom", fontsize=6,
              color="tab:red" if off else "0.2")
    ax.set_ylim(0, 1.22 * top)
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{c['draft']} γ={c['gamma']}" for c in cells],
                       rotation=60, ha="right", fontsize=6.5)
    ax.set_ylabel("ms per generated token\n(decode only)")
    ax.set_title(_temperature_label(t) + " · numbers: decode efficiency "
                 "(measured / predicted speedup); red: the component off",
                 fontsize=9)
    ax.grid(alpha=0.3, axis="y")
  handles = [matplotlib.patches.Patch(color=color, label=part)
             for part, color in _PARTS] + [
      matplotlib.patches.Patch(color=_UNSPLIT, label="round, split below "
                               "noise (a part < 0)"),
      matplotlib.patches.Patch(facecolor="white", edgecolor="k", hatch="//",
                               label="predicted"),
      Line2D([], [], color="k", linewidth=1.4,
             label="autoregressive step (measured)")]
  return _finish(fig, path_stem, handles, ncol=6)


def plot_batch_scaling(rows: Sequence[dict], path_stem: str,
                       metadata: dict | None = None) -> list[str]:
  """Speedup against batch size, measured vs predicted, and c(B), r(B).

  `rows` are `measure.compare` rows with a `batch_size`, one per batch
  size (the decode benchmark's `--batches`). Left: decode-only and end-to-end speedups (markers, 95% CIs)
  beside their predictions (lines) from each batch's own measured costs, the
  break-even line and the crossover batch. Right: c(B), r(B) and the round's
  other work, all in autoregressive steps at that batch, and the AR step.
  """
  rows = sorted(rows, key=lambda r: r["batch_size"])
  b = np.array([r["batch_size"] for r in rows], np.float64)
  meta = metadata or {}
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.6),
                                constrained_layout=True)
  fig.suptitle("Speculative decoding against batch size: "
               f"{meta.get('target', '')} target, gamma "
               f"{meta.get('gamma', '')}, "
               f"{meta.get('max_new_tokens', '')} new tokens; "
               f"{meta.get('device', '')}", fontsize=10)
  for key, color, label in (("decode_speedup", "tab:blue", "decode only"),
                            ("speedup", "tab:green", "end to end")):
    pred = "predicted_" + key
    ax.plot(b, [num(r[pred]) for r in rows], color=color, linewidth=1.3)
    _errorbar(ax, b, [num(r[key]) for r in rows],
              [r.get(key + "_se") for r in rows], color=color, marker="o",
              label=f"{label}: measured (line: predicted)")
  ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0)
  measured = np.array([num(r["decode_speedup"]) for r in rows])
  ok = np.isfinite(measured)  # a batch without a measurement has no say
  cross = (accounting.crossover_batch(b[ok], measured[ok]) if ok.any()
           else None)
  if cross is not None:
    ax.axvline(cross, color="tab:red", linestyle=":", linewidth=1.2,
               label=f"speculation stops paying: B ≈ {cross:.1f}")
  ax.set_xscale("log", base=2)
  ax.set_xticks(b)
  ax.set_xticklabels([str(int(x)) for x in b])
  ax.set_xlabel("batch size B")
  ax.set_ylabel("speedup over autoregressive (×)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  for key, color, label in (("c", "tab:purple", "c(B): draft step / AR step"),
                            ("r", "tab:orange", "r(B): verify / AR step")):
    ax2.plot(b, [num(r[key]) for r in rows], color=color, marker="o",
             label=label)
  ax2.plot(b, [num(r["other_s"]) / num(r["ar_step_s"]) for r in rows],
           color="0.5", marker="s", label="round's other work / AR step")
  ax2.set_xscale("log", base=2)
  ax2.set_xticks(b)
  ax2.set_xticklabels([str(int(x)) for x in b])
  ax2.set_xlabel("batch size B")
  ax2.set_ylabel("cost in autoregressive steps at B")
  ax2.grid(alpha=0.3)
  twin = ax2.twinx()
  twin.plot(b, [1e3 * num(r["ar_step_s"]) for r in rows], color="k",
            linestyle="--", linewidth=1.0, label="AR step (ms, right axis)")
  twin.set_ylabel("target step on 1 token (ms)")
  handles = ax2.get_legend_handles_labels()
  extra = twin.get_legend_handles_labels()
  ax2.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7)
  return _save(fig, path_stem)



# --- The verifier and adaptive-gamma axes ------------------------------------


def _group_label(draft: str, temperature: float, batch: int) -> str:
  return f"{draft}, T = {temperature:g}, batch {batch}"



def plot_verifiers(rows: Sequence[dict], path_stem: str,
                   metadata: dict | None = None) -> list[str]:
  """(g) Per verifier: tokens per target call and speedup against gamma.

  One column per (draft, temperature, batch); in each, every verifier ran
  the same draft with the same gamma, so the draft compute per round is
  equal and only the verification differs. Top: tokens per target call
  (95% CI); bottom: measured end-to-end speedup (95% CI). Lossy verifiers
  (not exact: their output is not the target's) are dashed and labelled.
  """
  rows = verifier_rows(rows)
  if not rows:
    raise ValueError("no (draft, temperature, batch) group ran more than one "
                     "verifier: nothing to compare.")
  groups = group_keys(rows)
  specs = verifier_names(rows)
  cmap = plt.get_cmap("tab10")
  colors = {v: cmap(i % 10) for i, v in enumerate(specs)}
  fig, axes = plt.subplots(2, len(groups), squeeze=False,
                           figsize=(4.6 * len(groups), 7.4),
                           constrained_layout=True)
  fig.suptitle("(g) Verifiers at equal draft compute (same draft, same γ)\n"
               f"{provenance(rows, metadata)}", fontsize=10)
  gammas = sorted({r["gamma"] for r in rows})
  for col, (d, t, b) in enumerate(groups):
    top, bottom = axes[0][col], axes[1][col]
    for v in specs:
      cells = sorted((r for r in rows if (r["draft"], r["temperature"],
                                          r["batch_size"], r["verifier"])
                      == (d, t, b, v)), key=lambda r: r["gamma"])
      if not cells:
        continue
      g = [c["gamma"] for c in cells]
      style = "--" if cells[0]["lossy"] else "-"
      for ax, key in ((top, "tokens_per_target_call"), (bottom, "speedup")):
        y = [num(c[key]) for c in cells]
        ax.plot(g, y, color=colors[v], linestyle=style, linewidth=1.2)
        _errorbar(ax, g, y, [c.get(key + "_se") for c in cells],
                  color=colors[v], marker="o")
    top.set_title(_group_label(d, t, b), fontsize=9)
    top.set_ylabel("tokens per target call")
    bottom.axhline(1.0, color="0.3", linestyle=":", linewidth=1.0)
    bottom.set_ylabel("speedup over autoregressive (×)")
    for ax in (top, bottom):
      ax.set_xticks(gammas)
      ax.set_xlabel("γ (draft tokens per round)")
      ax.grid(alpha=0.3)
  handles = [Line2D([], [], color=colors[v], marker="o",
                    linestyle="--" if _lossy(rows, v) else "-",
                    label=v + (" (LOSSY: not exact)" if _lossy(rows, v)
                               else " (exact)")) for v in specs]
  return _finish(fig, path_stem, handles, ncol=min(4, len(handles)))


def _lossy(rows: Sequence[dict], verifier: str) -> bool:
  return any(r["lossy"] for r in rows if r["verifier"] == verifier)



def plot_adaptive_gamma(rows: Sequence[dict], path_stem: str,
                        metadata: dict | None = None) -> list[str]:
  """(h) gamma = auto against every fixed gamma, per draft and batch size.

  Rows of panels are batch sizes, columns (draft, temperature, verifier):
  auto is drawn against its own verifier's fixed gammas only. Markers:
  the measured speedup at each fixed gamma (95% CI); the horizontal line and
  band: gamma = auto's speedup and its 95% CI, labelled with its mean draft
  length per round.
  """
  rows = adaptive_rows(rows)
  if not rows:
    raise ValueError("no cell ran gamma='auto': nothing to compare.")
  batches = sorted({r["batch_size"] for r in rows})
  columns = sorted({(r["draft"], r["temperature"], r["verifier"])
                    for r in rows},
                   key=lambda k: (draft_names(rows).index(k[0]), k[1], k[2]))
  colors = _colors(rows)
  fig, axes = plt.subplots(len(batches), len(columns), squeeze=False,
                           figsize=(4.4 * len(columns), 3.6 * len(batches)),
                           constrained_layout=True)
  fig.suptitle("(h) γ = auto (Goodput rule) against every fixed γ\n"
               f"{provenance(rows, metadata)}", fontsize=10)
  for i, b in enumerate(batches):
    for j, (d, t, v) in enumerate(columns):
      ax = axes[i][j]
      cells = [r for r in rows if (r["draft"], r["temperature"],
                                   r["batch_size"], r["verifier"])
               == (d, t, b, v)]
      fixed = sorted((r for r in cells if r["gamma_mode"] == "fixed"),
                     key=lambda r: r["gamma"])
      auto = [r for r in cells if r["gamma_mode"] == "auto"]
      if fixed:
        g = [r["gamma"] for r in fixed]
        y = [num(r["speedup"]) for r in fixed]
        ax.plot(g, y, color=colors[d], linewidth=1.0)
        _errorbar(ax, g, y, [r.get("speedup_se") for r in fixed],
                  color=colors[d], marker="o")
        ax.set_xticks(g)
      for r in auto:
        a, se = num(r["speedup"]), num(r.get("speedup_se"))
        if not math.isfinite(a):  # not measured: say so, draw no line
          ax.annotate("auto: no measured speedup", (0.02, 0.04),
                      xycoords="axes fraction", fontsize=7, color="tab:red")
          continue
        ax.axhline(a, color="tab:red", linewidth=1.4)
        if math.isfinite(se):
          ax.axhspan(a - Z95 * se, a + Z95 * se, color="tab:red", alpha=0.12)
        ax.annotate(f"auto {a:.2f}× (mean γ "
                    f"{num(r.get('mean_draft_length')):.1f})",
                    (0.02, 0.04), xycoords="axes fraction", fontsize=7,
                    color="tab:red")
      ax.axhline(1.0, color="0.3", linestyle=":", linewidth=1.0)
      ax.set_title(f"{d}, T = {t:g}, batch {b}"
                   + (f", {v}" if v != "token" else ""), fontsize=9)
      ax.set_xlabel("fixed γ")
      ax.set_ylabel("speedup over autoregressive (×)")
      ax.grid(alpha=0.3)
  handles = [Line2D([], [], color="k", marker="o", linestyle="-",
                    label="fixed γ, measured ±95% CI"),
             Line2D([], [], color="tab:red", linewidth=1.4,
                    label="γ = auto, measured (band: 95% CI)")]
  return _finish(fig, path_stem, handles, ncol=2)

