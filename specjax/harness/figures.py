r"""Figures and tables from a speculative-decoding sweep (`specjax.harness.sweep`).

Reads `DIR/sweep.jsonl` (one JSON object per (draft, temperature, gamma) cell)
and `DIR/metadata.json`, and writes into `DIR`:

  fig_alpha_vs_overlap.{png,pdf}       (a) alpha_hat against 1 - TV, y = x line
  fig_tokens_per_pass.{png,pdf}        (b) tokens per target pass against gamma,
                                           measured vs (1 - a^(g+1)) / (1 - a)
  fig_speedup_vs_gamma.{png,pdf}       (c) wall-clock speedup against gamma,
                                           measured vs predicted, best gamma
  fig_speedup_vs_draft_size.{png,pdf}  (d) speedup at the best gamma against
                                           draft size
  fig_round_decomposition.{png,pdf}    (f) time per generated token, split
                                           into draft / verify / other,
                                           predicted beside measured, per cell
  fig_verifiers.{png,pdf}              (g) per verifier: tokens per target call
                                           and measured speedup against gamma
                                           (same draft, same gamma: equal draft
                                           compute); lossy verifiers dashed
  fig_adaptive_gamma.{png,pdf}         (h) gamma = auto against every fixed
                                           gamma, per draft and batch size
  verifiers.md                         every verifier cell: exact / lossy,
                                       speedup beside the lossy ones'
                                       estimated per-token TV
  table3.md                            (e) Leviathan et al. (2023), Table 3
                                           layout, the paper's row beside ours
  summary.txt                          one screen: best gamma per draft and
                                       temperature, where speculation loses,
                                       and the cost model's check (efficiency
                                       target; the component off where a
                                       cell misses); block against token
                                       per cell, auto against the best fixed
                                       gamma per cell

Sweeps with more axes (`specjax.harness.sweep.run`: verifier, gamma = auto, batch
size) draw (a)-(f) and Table 3 from the main rows only (token verifier, fixed
gamma, the smallest batch size), and (g), (h) where their axes vary;
summary.txt counts the rows (a)-(f) leave out, per reason. The functions of
(a)-(f), Table 3, `best_cells`, `summary_table` and `efficiency_report` read
one (verifier, gamma_mode, batch_size) setting and refuse rows mixing them:
pass `main_rows(rows)`.

Measured values are markers with 95% (1.96 * se) error bars; the i.i.d.
formulas of `specjax.accounting` are lines. Nothing is refit here: every
predicted number is the one the sweep stored for that cell.

  python -m experiments.figures --results_dir=results/quick

The functions are importable (`load_results`, `plot_*`, `table3_markdown`,
`summary_table`, `make_all`) so notebooks can redraw single figures.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Sequence

import matplotlib

# Agg: figures are written to files on headless machines (CI, TPU hosts);
# set before pyplot is imported so no GUI backend is ever probed.
matplotlib.use("Agg")
import matplotlib.patches  # pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from specjax import accounting  # pylint: disable=g-import-not-at-top
from specjax import stats  # pylint: disable=g-import-not-at-top

SWEEP_FILE = "sweep.jsonl"
METADATA_FILE = "metadata.json"
# The rows of a sweep still running, or one that died (`sweep.run_config`).
PARTIAL_ROWS = "sweep.partial.jsonl"

# 95% normal-approximation confidence intervals throughout.
Z95 = 1.96

# Keys every cell must carry for the figures to mean what they say; the rest
# of the sweep schema (rows, accept_hist, tokens/s, ...) is optional here.
REQUIRED_KEYS = (
    "draft", "draft_kind", "draft_params", "target", "temperature", "gamma",
    "alpha_hat", "alpha_se", "one_minus_tv", "verified", "accepted",
    "tokens_per_target_call", "tokens_per_target_call_se", "speedup",
    "predicted_speedup",
)

# Display order of draft kinds: the paper's columns first, then ours.
KIND_ORDER = ("unigram", "bigram", "prompt_lookup", "transformer", "distilled",
              "self", "eagle")
TRANSFORMER_KINDS = ("transformer", "distilled")
KIND_MARKERS = {"unigram": "v", "bigram": "^", "prompt_lookup": "s",
                "transformer": "o", "distilled": "D", "self": "P",
                "eagle": "*"}

# Axes added by later sweeps, with the value a row without them had.
AXIS_DEFAULTS = {"verifier": "token", "exact": True, "gamma_mode": "fixed",
                 "batch_size": 1}

# Leviathan, Kalman & Matias (2023), Table 3, row "GPT-like (97M)":
# acceptance alpha at argmax (T = 0) / sampling (T = 1).
PAPER_ROW_NAME = "GPT-like (97M) [paper]"
PAPER_ROW = {"unigram": (0.03, 0.03), "bigram": (0.05, 0.05),
             "transformer": (0.88, 0.89)}
PAPER_TRANSFORMER_NAME = "GPT-like 6M"

FIGURE_NAMES = ("fig_alpha_vs_overlap", "fig_tokens_per_pass",
                "fig_speedup_vs_gamma", "fig_speedup_vs_draft_size",
                "fig_round_decomposition")

# The efficiency target of the cost model, over cells with alpha_hat >= 0.5.
EFFICIENCY_ALPHA_MIN = 0.5
EFFICIENCY_MEDIAN_BAND = (0.95, 1.05)
EFFICIENCY_CELL_BAND = (0.9, 1.1)
EFFICIENCY_CELL_SHARE = 0.8

_DPI = 150


# --- Loading --------------------------------------------------------------


# The fields that name one sweep cell: no two rows of a sweep share all six.
CELL_FIELDS = ("draft", "temperature", "gamma", "verifier", "gamma_mode",
               "batch_size")


def cell_key(row: dict) -> tuple:
  """The row's `CELL_FIELDS` values, in that order; an absent optional axis
  reads as its `AXIS_DEFAULTS` value, as `load_results` fills it."""
  return tuple(row[k] if k in row else AXIS_DEFAULTS[k] for k in CELL_FIELDS)


def load_results(results_dir: str) -> tuple[list[dict], dict]:
  """Reads `results_dir/sweep.jsonl` and `results_dir/metadata.json`.

  Args:
    results_dir: the sweep's output directory.

  Returns:
    (rows, metadata): one dict per (draft, temperature, gamma) cell, sorted by
    draft kind, draft size, draft name, temperature and gamma; and the
    metadata dict ({} if metadata.json is absent, since the figures only
    copy a few of its fields into captions).

  Raises:
    FileNotFoundError: sweep.jsonl is missing (the message names the path).
    ValueError: sweep.jsonl or metadata.json is corrupt, empty, lacks required
      keys, repeats a cell, or holds a value that would relabel or drop a
      cell (gamma not an integer >= 1, temperature not finite >= 0,
      exact/lossy not bools, batch_size not an integer >= 1, accepted or
      verified not integers >= 0 or accepted > verified, alpha_hat not
      accepted / verified, one draft name with two kinds or sizes); the
      message names the file and line.
  """
  path = os.path.join(results_dir, SWEEP_FILE)
  if not os.path.isfile(path):
    partial = os.path.join(results_dir, PARTIAL_ROWS)
    why = (f"; {partial} holds the rows of a sweep that has not finished "
           "(still running, or died): rerun it, or copy that file to "
           f"{SWEEP_FILE} to draw what it measured"
           if os.path.isfile(partial) else
           "" if os.path.isdir(results_dir) else
           f"; there is no directory {results_dir}: pass the sweep's "
           "results_dir")
    raise FileNotFoundError(
        f"{path}: no sweep results (expected one JSON object per line, "
        f"written by experiments/sweep.py){why}.")
  rows = []
  seen = {}
  drafts = {}  # draft name -> ((draft_kind, draft_params), first line)
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}).") from e
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{lineno}: expected a JSON object, got "
                         f"{type(row).__name__}.")
      missing = [k for k in REQUIRED_KEYS if k not in row]
      if missing:
        raise ValueError(f"{path}:{lineno}: missing key(s) {missing}.")
      where = f"{path}:{lineno}"
      row["gamma"] = _count_field(row, "gamma", 1, where)
      row["draft_params"] = _count_field(row, "draft_params", 0, where)
      row["accepted"] = _count_field(row, "accepted", 0, where)
      row["verified"] = _count_field(row, "verified", 0, where)
      if row["accepted"] > row["verified"]:
        raise ValueError(
            f"{where}: accepted ({row['accepted']}) > verified "
            f"({row['verified']}): a draft token is accepted only after it "
            "is verified; fix the line or re-run the sweep.")
      alpha = row["alpha_hat"]
      # The figures plot it: 1.5 or NaN with drafts judged was drawn as is.
      if row["verified"] and (
          isinstance(alpha, bool) or not isinstance(alpha, (int, float))
          or not math.isclose(alpha, row["accepted"] / row["verified"],
                              rel_tol=1e-6, abs_tol=1e-9)):
        raise ValueError(
            f"{where}: alpha_hat = {alpha!r} is not accepted / verified = "
            f"{row['accepted']} / {row['verified']}; fix the line or re-run "
            "the sweep.")
      t = row["temperature"]
      # float() would take "nan" or "1": a NaN temperature matches no
      # panel, so the cell would vanish from every figure.
      if (isinstance(t, bool) or not isinstance(t, (int, float))
          or not math.isfinite(t) or t < 0):
        raise ValueError(f"{where}: temperature must be a finite number >= "
                         f"0 (a JSON number), got {t!r}; fix the line.")
      row["temperature"] = float(t)
      _check_axes(row, where)
      # One draft name, one model: a name reused for another size would be
      # one line (and one colour) mixing two drafts.
      draft = (row["draft_kind"], row["draft_params"])
      first = drafts.setdefault(row["draft"], (draft, lineno))
      if first[0] != draft:
        raise ValueError(
            f"{where}: draft {row['draft']!r} is (draft_kind, draft_params) "
            f"= {draft}, but line {first[1]} has {first[0]}; give different "
            "drafts different names.")
      # A repeated cell would make "best gamma" depend on line order; refuse
      # rather than silently pick one.
      cell = cell_key(row)
      if cell in seen:
        raise ValueError(
            f"{path}:{lineno}: cell (draft={cell[0]!r}, temperature={cell[1]}"
            f", gamma={cell[2]}, verifier={cell[3]!r}, gamma_mode={cell[4]}, "
            f"batch_size={cell[5]}) repeats line {seen[cell]}.")
      seen[cell] = lineno
      rows.append(row)
  if not rows:
    raise ValueError(f"{path}: empty, no sweep cells.")
  rows.sort(key=lambda r: (_draft_sort_key(r), r["temperature"], r["gamma"]))

  metadata = {}
  meta_path = os.path.join(results_dir, METADATA_FILE)
  if os.path.isfile(meta_path):
    with open(meta_path, encoding="utf-8") as f:
      try:
        metadata = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e.msg}).") from e
    if not isinstance(metadata, dict):
      raise ValueError(f"{meta_path}: expected a JSON object.")
  return rows, metadata


def _count_field(row: dict, key: str, minimum: int, where: str) -> int:
  """row[key] as an int >= minimum, or a ValueError naming `where`.

  int() would truncate 7.9 to 7 (a cell relabelled) and take true as 1;
  only a JSON integer, or a float with an integral value (4.0), is a count.
  """
  value = row[key]
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or (isinstance(value, float) and not value.is_integer())
      or value < minimum):
    raise ValueError(f"{where}: {key} must be an integer >= {minimum}, got "
                     f"{value!r}; fix the line or re-run the sweep.")
  return int(value)


def _check_axes(row: dict, where: str) -> None:
  """Fills the optional axes (AXIS_DEFAULTS) and checks their types.

  An absent axis is a row written before it existed and takes its default;
  a present one must be well typed: a string "false" is truthy, so it would
  count a lossy verifier as exact.
  """
  if "exact" not in row and isinstance(row.get("lossy"), bool):
    row["exact"] = not row["lossy"]
  for name, default in AXIS_DEFAULTS.items():
    row.setdefault(name, default)
  for name in ("exact", "lossy"):
    if name in row and not isinstance(row[name], bool):
      raise ValueError(f"{where}: {name} must be true or false (a JSON "
                       f"bool), got {row[name]!r}; fix the line.")
  if "lossy" in row and row["lossy"] == row["exact"]:
    raise ValueError(f"{where}: exact={row['exact']} and lossy="
                     f"{row['lossy']} contradict; fix the line.")
  row["lossy"] = not row["exact"]
  row["batch_size"] = _count_field(row, "batch_size", 1, where)
  if not isinstance(row["verifier"], str) or not row["verifier"]:
    raise ValueError(f"{where}: verifier must be a non-empty string, got "
                     f"{row['verifier']!r}; fix the line.")
  if row["gamma_mode"] not in ("fixed", "auto"):
    raise ValueError(f"{where}: gamma_mode must be 'fixed' or 'auto', got "
                     f"{row['gamma_mode']!r}; fix the line.")


# --- Small helpers ----------------------------------------------------------


def _draft_sort_key(row: dict) -> tuple:
  kind = row["draft_kind"]
  rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
  return (rank, int(row["draft_params"]), str(row["draft"]))


def _num(value) -> float:
  """float(value), NaN for None or anything non-numeric (missing se, ...)."""
  try:
    out = float(value)
  except (TypeError, ValueError):
    return math.nan
  return out


def _fmt_or_na(value: float, spec: str) -> str:
  """format(value, spec), or "n/a" where nothing was measured (NaN)."""
  return format(value, spec) if math.isfinite(value) else "n/a"


def _settings(rows: Sequence[dict]) -> list[tuple[str, str, int]]:
  """The (verifier, gamma_mode, batch_size) combinations of `rows`; a row
  without an axis has its AXIS_DEFAULTS value, as load_results gives it."""
  return sorted({tuple(r.get(k, AXIS_DEFAULTS[k])
                       for k in ("verifier", "gamma_mode", "batch_size"))
                 for r in rows}, key=str)


def _require_one_setting(rows: Sequence[dict], caller: str) -> None:
  """Refuses rows mixing verifiers, gamma modes or batch sizes.

  Figures (a)-(f), Table 3 and the best-gamma summary index cells by (draft,
  temperature, gamma) only: given two verifiers they would pick a lossy
  cell as the best gamma or pool alpha across verifiers, silently.
  """
  settings = _settings(rows)
  if len(settings) > 1:
    raise ValueError(
        f"rows: {caller} reads one (verifier, gamma_mode, batch_size) "
        f"setting, got {len(settings)}: {settings}; pass "
        "figures.main_rows(rows) (token verifier, fixed gamma, smallest "
        "batch) or select the rows of one setting.")


def _drafts(rows: Sequence[dict]) -> list[str]:
  """Draft names in display order (kind, size, name)."""
  first = {}
  for r in rows:
    first.setdefault(r["draft"], r)
  return sorted(first, key=lambda d: _draft_sort_key(first[d]))


def _temperatures(rows: Sequence[dict]) -> list[float]:
  return sorted({r["temperature"] for r in rows})


def _colors(rows: Sequence[dict]) -> dict[str, Any]:
  """One fixed colour per draft, shared by every figure."""
  cmap = plt.get_cmap("tab10")
  return {d: cmap(i % 10) for i, d in enumerate(_drafts(rows))}


def _cells(rows: Sequence[dict], draft: str, temperature: float) -> list[dict]:
  return sorted((r for r in rows
                 if r["draft"] == draft and r["temperature"] == temperature),
                key=lambda r: r["gamma"])


def _temperature_label(t: float) -> str:
  return "T = 0 (greedy)" if t == 0 else f"T = {t:g}"


def _format_count(n: int) -> str:
  """Parameter counts as 97M / 6.1M / 120k / 950."""
  n = int(n)
  for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
    if n >= scale:
      return f"{n / scale:.3g}{suffix}"
  return str(n)


def _format_alpha(a: float) -> str:
  """Two decimals without the leading zero, as in the paper: .88."""
  if not math.isfinite(a):
    return "–"
  s = f"{a:.2f}"
  return s[1:] if s.startswith("0.") else s


def _meta(metadata: dict | None, *names: str) -> str | None:
  """The first of `names` found at the top level or one level down."""
  metadata = metadata or {}
  for name in names:
    if metadata.get(name) not in (None, ""):
      return str(metadata[name])
  for value in metadata.values():
    if isinstance(value, dict):
      for name in names:
        if value.get(name) not in (None, ""):
          return str(value[name])
  return None


def _target_name(rows: Sequence[dict], metadata: dict | None = None) -> str:
  targets = sorted({str(r["target"]) for r in rows})
  name = " / ".join(targets) if targets else (_meta(metadata, "target")
                                               or "unknown target")
  sizes = sorted({int(r["target_params"]) for r in rows
                  if r.get("target_params") is not None})
  if len(sizes) == 1:
    name += f" ({_format_count(sizes[0])})"
  return name


def _provenance(rows: Sequence[dict], metadata: dict | None) -> str:
  """'target: X · device: Y · commit Z' for titles and footers."""
  device = _meta(metadata, "device", "device_kind", "devices") or "unknown"
  commit = _meta(metadata, "git_commit", "commit", "git") or "unknown"
  if len(commit) > 12 and all(ch in "0123456789abcdef" for ch in commit):
    commit = commit[:10]
  return (f"target: {_target_name(rows, metadata)} · device: {device} · "
          f"commit {commit}")


def _row_counts(cells: Sequence[dict]) -> tuple[np.ndarray, np.ndarray] | None:
  """Per-row accepted and verified summed over `cells` (row r of every cell
  is the same prompt), or None when a cell does not record them (sweeps
  before `row_accepted`) or the cells' rows differ in number."""
  try:
    acc = [np.asarray(c["row_accepted"], np.int64) for c in cells]
    ver = [np.asarray(c["row_verified"], np.int64) for c in cells]
  except (KeyError, TypeError, ValueError):
    return None
  if not acc or len({x.shape for x in acc + ver}) != 1 or acc[0].ndim != 1:
    return None
  return sum(acc), sum(ver)


def _pooled_alpha(cells: Iterable[dict]) -> tuple[float, float, bool]:
  """(accepted / verified, its se, by_row) pooled over cells.

  Pooling over gamma weights each cell by how many drafts it verified, which
  is the acceptance rate per proposed token the paper's Table 3 reports. The
  se is over prompts (`stats.clustered_alpha` of each prompt's counts summed
  over the cells: at T = 0 the cells of every gamma judge one greedy text)
  when the cells record their rows (by_row True), else binomial over drafts,
  which is too small wherever drafts are not independent.
  """
  cells = list(cells)
  ver = sum(int(c["verified"]) for c in cells)
  acc = sum(int(c["accepted"]) for c in cells)
  rows = _row_counts(cells)
  if rows is not None and int(rows[0].sum()) == acc and int(
      rows[1].sum()) == ver:
    return (*stats.clustered_alpha(*rows), True)
  return (*stats.pooled_alpha(acc, ver), False)


def _predicted_tokens(row: dict) -> float:
  """The stored prediction, recomputed from alpha_hat only if it is absent."""
  value = _num(row.get("predicted_tokens_per_target_call"))
  if math.isfinite(value):
    return value
  a = _num(row["alpha_hat"])
  if not math.isfinite(a):
    return math.nan
  return float(accounting.expected_tokens_per_pass(
      min(max(a, 0.0), 1.0), int(row["gamma"])))


def best_cells(rows: Sequence[dict]) -> dict[tuple[str, float], dict]:
  """{(draft, temperature): the cell with the highest measured speedup}.

  The best gamma is chosen on the measurement, not the prediction: that is
  the gamma a user of this hardware should pick. Ties go to the smaller gamma
  (less draft work for the same speed). Cells without a finite speedup are
  skipped, so a (draft, temperature) with no measured speedup is absent.

  Raises:
    ValueError: `rows` mix verifiers, gamma modes or batch sizes (pass
      `main_rows(rows)`).
  """
  _require_one_setting(rows, "best_cells")
  out = {}
  for d in _drafts(rows):
    for t in _temperatures(rows):
      cells = [c for c in _cells(rows, d, t) if math.isfinite(_num(c["speedup"]))]
      if cells:
        # max() keeps the first maximum, and cells are sorted by gamma.
        out[(d, t)] = max(cells, key=lambda c: _num(c["speedup"]))
  return out


def _new_figure(rows, title, metadata, panel_width=5.6):
  temps = _temperatures(rows)
  fig, axes = plt.subplots(1, len(temps),
                           figsize=(panel_width * len(temps), 4.6),
                           squeeze=False, constrained_layout=True)
  fig.suptitle(f"{title}\n{_provenance(rows, metadata)}", fontsize=10)
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
                 label=f"{d} ({_format_count(first[d]['draft_params'])})")
          for d in _drafts(rows)]


def _errorbar(ax, x, y, se, **kwargs):
  se = np.asarray([_num(s) for s in se], dtype=np.float64)
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
  _require_one_setting(rows, "plot_alpha_vs_overlap")
  colors = _colors(rows)
  fig, panels = _new_figure(
      rows, "(a) Acceptance rate α̂ against draft/target overlap 1 − TV",
      metadata, panel_width=4.8)
  for t, ax in panels:
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1.0,
            zorder=0)
    for d in _drafts(rows):
      cells = _cells(rows, d, t)
      if not cells:
        continue
      _errorbar(ax, [_num(c["one_minus_tv"]) for c in cells],
                [_num(c["alpha_hat"]) for c in cells],
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
  _require_one_setting(rows, "plot_tokens_per_pass")
  colors = _colors(rows)
  fig, panels = _new_figure(
      rows, "(b) Tokens per target pass against γ: measured vs "
      "(1 − α^(γ+1)) / (1 − α)", metadata)
  gammas = sorted({r["gamma"] for r in rows})
  for t, ax in panels:
    g_line = np.arange(0, max(gammas) + 2)
    ax.plot(g_line, g_line + 1, color="0.6", linestyle=":", linewidth=1.0,
            zorder=0)
    for d in _drafts(rows):
      cells = _cells(rows, d, t)
      if not cells:
        continue
      g = [c["gamma"] for c in cells]
      ax.plot(g, [_predicted_tokens(c) for c in cells], color=colors[d],
              linewidth=1.3, alpha=0.9)
      _errorbar(ax, g, [_num(c["tokens_per_target_call"]) for c in cells],
                [c["tokens_per_target_call_se"] for c in cells],
                color=colors[d],
                marker=KIND_MARKERS.get(cells[0]["draft_kind"], "o"))
    ax.set_xlim(min(gammas) - 0.4, max(gammas) + 0.4)
    top = max([_num(r["tokens_per_target_call"]) for r in rows
               if math.isfinite(_num(r["tokens_per_target_call"]))] + [1.0])
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
  _require_one_setting(rows, "plot_speedup_vs_gamma")
  colors = _colors(rows)
  best = best_cells(rows)
  fig, panels = _new_figure(
      rows, "(c) Wall-clock speedup against γ: measured vs predicted",
      metadata)
  gammas = sorted({r["gamma"] for r in rows})
  for t, ax in panels:
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0, zorder=0)
    for d in _drafts(rows):
      cells = _cells(rows, d, t)
      if not cells:
        continue
      g = [c["gamma"] for c in cells]
      ax.plot(g, [_num(c["predicted_speedup"]) for c in cells],
              color=colors[d], linewidth=1.3, alpha=0.9)
      _errorbar(ax, g, [_num(c["speedup"]) for c in cells],
                [c.get("speedup_se") for c in cells], color=colors[d],
                marker=KIND_MARKERS.get(cells[0]["draft_kind"], "o"))
      if (d, t) in best:
        b = best[(d, t)]
        ax.plot([b["gamma"]], [_num(b["speedup"])], marker="*",
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
  _require_one_setting(rows, "plot_speedup_vs_draft_size")
  colors = _colors(rows)
  best = best_cells(rows)
  fig, panels = _new_figure(
      rows, "(d) Speedup at the best γ against draft size", metadata)
  for t, ax in panels:
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0, zorder=0)
    for i, d in enumerate(_drafts(rows)):
      if (d, t) not in best:
        continue
      b = best[(d, t)]
      x = max(int(b["draft_params"]), 0)
      marker = KIND_MARKERS.get(b["draft_kind"], "o")
      _errorbar(ax, [x], [_num(b["speedup"])], [b.get("speedup_se")],
                color=colors[d], marker=marker, markersize=8)
      ax.plot([x], [_num(b["predicted_speedup"])], marker=marker,
              markersize=8, markerfacecolor="none", markeredgecolor=colors[d],
              linestyle="none")
      ax.annotate(f"{d}, γ*={b['gamma']}", (x, _num(b["speedup"])),
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


def _has_decomposition(rows: Sequence[dict]) -> bool:
  return all("predicted_round_s" in r and "measured_round_s" in r for r in rows)


def plot_round_decomposition(rows: Sequence[dict], path_stem: str,
                             metadata: dict | None = None) -> list[str]:
  """(f) Where a generated token's time goes: predicted beside measured.

  Per cell, two stacked bars of milliseconds per generated token (decode
  only): left the prediction (each pass timed alone on the loop's shapes,
  the null-loop overhead, the expected tokens per round with the budget
  cut), right the measurement (the real loop's round split by the same loop
  with a null draft, its measured tokens per round). The black tick is the
  autoregressive step (measured): a bar below it is a speedup. Above each
  pair: the decode efficiency and, where it misses, the component off. A
  round whose split came out with a part < 0 (the null-draft loop timed
  slower than the real one) is drawn whole, in one colour.
  """
  _require_one_setting(rows, "plot_round_decomposition")
  temps = _temperatures(rows)
  per_panel = max(len([r for r in rows if r["temperature"] == t])
                  for t in temps)
  fig, axes = plt.subplots(len(temps), 1, squeeze=False,
                           figsize=(max(8.0, 0.42 * per_panel + 1.5),
                                    3.9 * len(temps)),
                           constrained_layout=True)
  fig.suptitle("(f) Decode time per generated token: draft / verify / other,"
               " predicted (left, hatched) vs measured (right)\n"
               + _provenance(rows, metadata), fontsize=10)
  for t, ax in zip(temps, axes[:, 0]):
    cells = [c for d in _drafts(rows) for c in _cells(rows, d, t)]
    tops = []
    for i, c in enumerate(cells):
      pred_tpr = _num(c["max_new_tokens"]) / _num(c["predicted_loop_rounds"])
      meas_tpr = _num(c["max_new_tokens"]) / _num(c["measured_loop_rounds"])
      for offset, kind, tpr, hatch in ((-0.2, "predicted", pred_tpr, "//"),
                                       (0.2, "measured", meas_tpr, None)):
        bottom = 0.0
        split = [_num(c.get(f"{kind}_{part}_s")) for part, _ in _PARTS[:2]]
        if any(math.isfinite(v) and v < 0 for v in split):
          # The null-draft loop ran slower than the real one: a split below
          # its noise. Drawing it with the negative part at 0 would stack
          # more than the measured round; draw the round whole.
          ms = 1e3 * _num(c[f"{kind}_round_s"]) / tpr
          ax.bar(i + offset, ms, width=0.38, color=_UNSPLIT, hatch=hatch,
                 edgecolor="white", linewidth=0.3)
          tops.append(ms)
          continue
        for part, color in _PARTS:
          value = _num(c.get(f"{kind}_{part}_s"))
          if part == "draft" and not math.isfinite(value):
            # Round not split: draft and verify as one bar segment.
            value = _num(c[f"{kind}_round_s"]) - _num(c[f"{kind}_other_s"])
          elif part == "verify" and not math.isfinite(value):
            continue
          ms = 1e3 * value / tpr
          ax.bar(i + offset, ms, width=0.38, bottom=bottom, color=color,
                 hatch=hatch, edgecolor="white", linewidth=0.3)
          bottom += ms
        tops.append(bottom)
      ar_ms = 1e3 * _num(c.get("measured_ar_round_s"))
      ax.plot([i - 0.42, i + 0.42], [ar_ms, ar_ms], color="k", linewidth=1.4)
      tops.append(ar_ms)
    top = max([x for x in tops if math.isfinite(x)] + [1e-3])
    for i, c in enumerate(cells):
      eff = _num(c.get("decode_efficiency"))
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

  `rows` are `measure.compare` rows with a `batch_size` (benchmarks/decode.py
  --batches). Left: decode-only and end-to-end speedups (markers, 95% CIs)
  beside their predictions (lines) from each batch's own measured costs, the
  break-even line and the crossover batch. Right: c(B), r(B) and the round's
  other work, all in autoregressive steps at that batch, and the AR step.
  """
  rows = sorted(rows, key=lambda r: r["batch_size"])
  b = np.array([r["batch_size"] for r in rows], np.float64)
  meta = metadata or {}
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.6),
                                constrained_layout=True)
  fig.suptitle(f"Speculative decoding against batch size: {meta.get('target', '')}"
               f" target, gamma {meta.get('gamma', '')}, "
               f"{meta.get('max_new_tokens', '')} new tokens; "
               f"{meta.get('device', '')}", fontsize=10)
  for key, color, label in (("decode_speedup", "tab:blue", "decode only"),
                            ("speedup", "tab:green", "end to end")):
    pred = "predicted_" + key
    ax.plot(b, [_num(r[pred]) for r in rows], color=color, linewidth=1.3)
    _errorbar(ax, b, [_num(r[key]) for r in rows],
              [r.get(key + "_se") for r in rows], color=color, marker="o",
              label=f"{label}: measured (line: predicted)")
  ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0)
  measured = np.array([_num(r["decode_speedup"]) for r in rows])
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
    ax2.plot(b, [_num(r[key]) for r in rows], color=color, marker="o",
             label=label)
  ax2.plot(b, [_num(r["other_s"]) / _num(r["ar_step_s"]) for r in rows],
           color="0.5", marker="s", label="round's other work / AR step")
  ax2.set_xscale("log", base=2)
  ax2.set_xticks(b)
  ax2.set_xticklabels([str(int(x)) for x in b])
  ax2.set_xlabel("batch size B")
  ax2.set_ylabel("cost in autoregressive steps at B")
  ax2.grid(alpha=0.3)
  twin = ax2.twinx()
  twin.plot(b, [1e3 * _num(r["ar_step_s"]) for r in rows], color="k",
            linestyle="--", linewidth=1.0, label="AR step (ms, right axis)")
  twin.set_ylabel("target step on 1 token (ms)")
  handles = ax2.get_legend_handles_labels()
  extra = twin.get_legend_handles_labels()
  ax2.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7)
  return _save(fig, path_stem)


def efficiency_report(rows: Sequence[dict]) -> str:
  """The cost model's check against its target, as text.

  For decode-only and end-to-end efficiency (measured / predicted speedup):
  over cells with alpha_hat >= EFFICIENCY_ALPHA_MIN, the median and the share
  in EFFICIENCY_CELL_BAND, against the target; then every cell whose
  efficiency is outside the band and whose 95% interval misses 1, with the
  component `measure.decompose` found off and by how much.
  """
  _require_one_setting(rows, "efficiency_report")
  if not _has_decomposition(rows):
    return ""
  lines = ["Cost model check: efficiency = measured / predicted speedup "
           f"(target over cells with alpha_hat >= {EFFICIENCY_ALPHA_MIN}: "
           f"median in [{EFFICIENCY_MEDIAN_BAND[0]}, "
           f"{EFFICIENCY_MEDIAN_BAND[1]}], >= {EFFICIENCY_CELL_SHARE:.0%} of "
           f"cells in [{EFFICIENCY_CELL_BAND[0]}, {EFFICIENCY_CELL_BAND[1]}])"]
  lo, hi = EFFICIENCY_CELL_BAND
  for key, name in (("decode_efficiency", "decode only"),
                    ("efficiency", "end to end")):
    eff = np.array([_num(r.get(key)) for r in rows
                    if _num(r["alpha_hat"]) >= EFFICIENCY_ALPHA_MIN])
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
    eff, se = _num(r.get("decode_efficiency")), _num(r.get("decode_efficiency_se"))
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
  factor = _num(row.get(f"factor_{off}"))
  ms = lambda x: f"{1e3 * _num(x):.3f} ms"
  if off == "acceptance":
    detail = (f"{_num(row['measured_loop_rounds']):.1f} rounds vs "
              f"{_num(row['predicted_loop_rounds']):.1f} predicted from alpha_hat")
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
    a = _pooled_alpha(_cells(rows, draft, t))[0]
    parts.append(_format_alpha(a))
  return " / ".join(parts)


def _best_of_kind(rows: Sequence[dict], kinds: Sequence[str]) -> str | None:
  """The draft of `kinds` with the highest pooled alpha (mean over T)."""
  best, best_score = None, -math.inf
  for d in _drafts(rows):
    cells = [r for r in rows if r["draft"] == d]
    if cells[0]["draft_kind"] not in kinds:
      continue
    alphas = [_pooled_alpha(_cells(rows, d, t))[0] for t in (0.0, 1.0)]
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
  _require_one_setting(rows, "table3_markdown")
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
      f"| {_target_name(rows, metadata)} [ours] | {_alpha_cell(rows, uni)} | "
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
  for d in _drafts(rows):
    first = next(r for r in rows if r["draft"] == d)
    cols = []
    for t in (0.0, 1.0):
      a, se, by_row = _pooled_alpha(_cells(rows, d, t))
      if math.isfinite(a):
        by_rows.add(by_row)
      cols.append("–" if not math.isfinite(a) else f"{a:.3f}" + (
          "" if not math.isfinite(se) else f" ± {Z95 * se:.3f}"))
    table.append(f"| {d} | {first['draft_kind']} | "
                 f"{_format_count(first['draft_params'])} | {cols[0]} | "
                 f"{cols[1]} |")
  how = {frozenset({True}): "±95% CI over prompts",
         frozenset({False}): "±95% binomial CI over judged drafts, as if "
         "independent: too narrow, most at T=0 (this sweep predates per-row "
         "counts)"}.get(frozenset(by_rows), "±95% CI over prompts where the "
                        "cells record their rows, else binomial over drafts")
  lines += ["", f"## Every draft (α̂ pooled over γ, {how})", "",
            "| Draft | Kind | Size | α T=0 | α T=1 |",
            "| --- | --- | --- | --- | --- |", *table]
  lines += ["", f"_{_provenance(rows, metadata)}_"]
  seed = _meta(metadata, "seed")
  jax_version = _meta(metadata, "jax_version", "jax")
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
  _require_one_setting(rows, "summary_table")
  best = best_cells(rows)
  w = max([18] + [len(d) for d in _drafts(rows)])
  # Plain ASCII headers: combining characters (alpha hat) break alignment.
  decode = _has_decomposition(rows)
  header = (f"{'draft':<{w}} {'T':>4} {'best_g':>6} {'alpha':>6} "
            f"{'tok/pass':>8} {'speedup':>15} {'predicted':>9} "
            f"{'effic.':>6}" + (f" {'decode':>6} {'pred.':>6} {'effic.':>6}"
                                if decode else ""))
  lines = [f"Speculative decoding sweep, target {_target_name(rows)}: "
           "best gamma by measured speedup", header, "-" * len(header)]
  for d in _drafts(rows):
    for t in _temperatures(rows):
      if (d, t) not in best:
        continue
      b = best[(d, t)]
      se = _num(b.get("speedup_se"))
      speed = f"{_num(b['speedup']):.2f}"
      speed += f" ± {Z95 * se:.2f}" if math.isfinite(se) else "       "
      eff = _num(b.get("efficiency"))
      if not math.isfinite(eff) and _num(b["predicted_speedup"]) > 0:
        eff = _num(b["speedup"]) / _num(b["predicted_speedup"])
      lines.append(
          f"{d:<{w}} {t:>4g} {b['gamma']:>6d} {_num(b['alpha_hat']):>6.3f} "
          f"{_num(b['tokens_per_target_call']):>8.2f} {speed:>15} "
          f"{_num(b['predicted_speedup']):>9.2f} {eff:>6.2f}"
          + (f" {_num(b['decode_speedup']):>6.2f} "
             f"{_num(b['predicted_decode_speedup']):>6.2f} "
             f"{_num(b['decode_efficiency']):>6.2f}" if decode else ""))
  lines.append("")
  losers = [f"{d} at T={t:g} (best {_num(b['speedup']):.2f}x at "
            f"gamma={b['gamma']})"
            for (d, t), b in best.items() if _num(b["speedup"]) < 1.0]
  # Only measured cells count: a claim "for every draft" or "N of M cells"
  # must not cover a (draft, T) whose speedup was never measured.
  measured = [r for r in rows if math.isfinite(_num(r["speedup"]))]
  slow = [r for r in measured if _num(r["speedup"]) < 1.0]
  unmeasured = [f"{d} at T={t:g}" for d in _drafts(rows)
                for t in _temperatures(rows)
                if _cells(rows, d, t) and (d, t) not in best]
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


def main_rows(rows: Sequence[dict]) -> list[dict]:
  """The rows figures (a)-(f) and Table 3 read: token verifier, fixed gamma,
  the smallest batch size of the sweep (batch 1, the latency setting)."""
  fixed = [r for r in rows
           if r["verifier"] == "token" and r["gamma_mode"] == "fixed"]
  if not fixed:
    return []
  smallest = min(r["batch_size"] for r in fixed)
  return [r for r in fixed if r["batch_size"] == smallest]


def _groups(rows: Sequence[dict]) -> list[tuple[str, float, int]]:
  """(draft, temperature, batch) in display order."""
  keys = {(r["draft"], r["temperature"], r["batch_size"]) for r in rows}
  order = {d: i for i, d in enumerate(_drafts(rows))}
  return sorted(keys, key=lambda k: (order[k[0]], k[1], k[2]))


def _group_label(draft: str, temperature: float, batch: int) -> str:
  return f"{draft}, T = {temperature:g}, batch {batch}"


def _verifiers(rows: Sequence[dict]) -> list[str]:
  """Verifier specs: exact ones first (token first), then lossy."""
  first = {}
  for r in rows:
    first.setdefault(r["verifier"], r)
  return sorted(first, key=lambda v: (first[v]["lossy"], v != "token", v))


def verifier_rows(rows: Sequence[dict]) -> list[dict]:
  """Fixed-gamma rows of the (draft, T, batch) groups that compare verifiers."""
  fixed = [r for r in rows if r["gamma_mode"] == "fixed"]
  groups = {}
  for r in fixed:
    groups.setdefault((r["draft"], r["temperature"], r["batch_size"]),
                      set()).add(r["verifier"])
  return [r for r in fixed
          if len(groups[(r["draft"], r["temperature"], r["batch_size"])]) > 1]


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
  groups = _groups(rows)
  specs = _verifiers(rows)
  cmap = plt.get_cmap("tab10")
  colors = {v: cmap(i % 10) for i, v in enumerate(specs)}
  fig, axes = plt.subplots(2, len(groups), squeeze=False,
                           figsize=(4.6 * len(groups), 7.4),
                           constrained_layout=True)
  fig.suptitle("(g) Verifiers at equal draft compute (same draft, same γ)\n"
               f"{_provenance(rows, metadata)}", fontsize=10)
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
        y = [_num(c[key]) for c in cells]
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


def adaptive_rows(rows: Sequence[dict]) -> list[dict]:
  """Exact-verifier rows of the (draft, T, batch, verifier) groups that ran
  gamma = auto beside fixed gammas. (The sweep runs auto only with exact
  verifiers; a lossy group elsewhere would mix speed with distortion.)"""
  auto = {(r["draft"], r["temperature"], r["batch_size"], r["verifier"])
          for r in rows if r["gamma_mode"] == "auto" and r["exact"]}
  return [r for r in rows if (r["draft"], r["temperature"], r["batch_size"],
                              r["verifier"]) in auto]


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
                   key=lambda k: (_drafts(rows).index(k[0]), k[1], k[2]))
  colors = _colors(rows)
  fig, axes = plt.subplots(len(batches), len(columns), squeeze=False,
                           figsize=(4.4 * len(columns), 3.6 * len(batches)),
                           constrained_layout=True)
  fig.suptitle("(h) γ = auto (Goodput rule) against every fixed γ\n"
               f"{_provenance(rows, metadata)}", fontsize=10)
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
        y = [_num(r["speedup"]) for r in fixed]
        ax.plot(g, y, color=colors[d], linewidth=1.0)
        _errorbar(ax, g, y, [r.get("speedup_se") for r in fixed],
                  color=colors[d], marker="o")
        ax.set_xticks(g)
      for r in auto:
        a, se = _num(r["speedup"]), _num(r.get("speedup_se"))
        if not math.isfinite(a):  # not measured: say so, draw no line
          ax.annotate("auto: no measured speedup", (0.02, 0.04),
                      xycoords="axes fraction", fontsize=7, color="tab:red")
          continue
        ax.axhline(a, color="tab:red", linewidth=1.4)
        if math.isfinite(se):
          ax.axhspan(a - Z95 * se, a + Z95 * se, color="tab:red", alpha=0.12)
        ax.annotate(f"auto {a:.2f}× (mean γ "
                    f"{_num(r.get('mean_draft_length')):.1f})",
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


def _fmt_se(value, se, digits=2) -> str:
  value, se = _num(value), _num(se)
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
  specs = _verifiers(rows)
  for d, t, b in _groups(rows):
    for v in specs:
      for r in sorted((r for r in rows if (r["draft"], r["temperature"],
                                           r["batch_size"], r["verifier"])
                       == (d, t, b, v)), key=lambda r: r["gamma"]):
        tv = ("0 (exact)" if not r["lossy"] else
              _fmt_se(r.get("tv_per_token"), r.get("tv_per_token_se"), 4))
        lines.append(
            f"| {d} | {t:g} | {b} | {v} | {'LOSSY' if r['lossy'] else 'no'} "
            f"| {r['gamma']} | {_num(r['alpha_hat']):.3f} | "
            f"{_fmt_se(r['tokens_per_target_call'], r.get('tokens_per_target_call_se'))}"
            f" | {_fmt_se(r['speedup'], r.get('speedup_se'))} | {tv} |")
  lines += ["", "± is a 95% interval. Lossy verifiers are NOT exact: their "
            "text is not distributed as the target's. TV per token: the mean "
            "over generated tokens of TV(the verifier's law at a judged "
            "position, p), an upper bound on the per-token distortion "
            "(`specjax.harness.distortion`).", "",
            f"_{_provenance(rows, metadata)}_"]
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
  pairs.sort(key=lambda p: (_drafts(fixed).index(p[0]["draft"]),
                            p[0]["temperature"], p[0]["batch_size"],
                            p[0]["gamma"]))
  lines = [f"Block vs token verification, tokens per target call (target: "
           f"block >= token within 95% in every cell; >= +{BLOCK_GAIN:.0%} "
           f"where alpha <= {BLOCK_ALPHA_MAX})",
           f"{'cell':44s} {'alpha':>6} {'token':>6} {'block':>6} "
           f"{'gain':>7}  >=token  +{BLOCK_GAIN:.0%}"]
  counts = {"ok": 0, "pass": 0, "fail": 0, "n/a": 0, "unmeasured": 0}
  for tok, blk in pairs:
    a = _num(tok["alpha_hat"])
    t_tok, t_blk = _num(tok["tokens_per_target_call"]), _num(
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
    se = math.sqrt(sum(_num(x.get("tokens_per_target_call_se")) ** 2
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
  rate = lambda r: _num(r.get("spec_tokens_per_s"))
  verifiers = sorted({r["verifier"] for r in rows})
  for d, t, b in _groups(rows):
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
                     f"{_num(auto.get('mean_draft_length')):>6.2f} "
                     f"{'n/a':>14} {'n/a':>9} {'n/a':>13}  "
                     "n/a (no fixed gamma's tokens/s measured)")
        continue
      best = max(sorted(fixed, key=lambda r: r["gamma"]), key=rate)
      ratio = rate(auto) / rate(best)
      # max() over a list holding NaN depends on where the NaN sits.
      speedups = [x for x in (_num(r["speedup"]) for r in fixed)
                  if math.isfinite(x) and x > 0]
      by_speedup = (_num(auto["speedup"]) / max(speedups) if speedups
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
          f"{_num(auto.get('mean_draft_length')):>6.2f} "
          f"{'g=' + str(best['gamma']) + ' ' + format(rate(best), '.0f'):>14}"
          f" {_fmt_or_na(ratio, '.3f'):>9}"
          f" {_fmt_or_na(by_speedup, '.3f'):>13}  {verdict}")
  lines.append(", ".join(f"{verdicts.count(v)} {v}" for v in
                         ("BEATS", "MATCHES", "MISSES")) + f" of "
               f"{len(verdicts)} cells"
               + (f" ({unmeasured} n/a: tokens/s not measured)."
                  if unmeasured else "."))
  return "\n".join(lines) + "\n"


# --- Everything -------------------------------------------------------------


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
  gone = [d for d in _drafts(rows) if d not in kept]
  if gone and main:
    lines.append("  drafts with no row in them: " + ", ".join(gone))
  return "\n".join(lines) + "\n"


def make_all(results_dir: str) -> list[str]:
  """Writes every figure (PNG and PDF), the tables and summary.txt.

  Figures (a)-(f) and table3.md from `main_rows`; (g) and verifiers.md where
  verifiers were compared; (h) where gamma = auto ran; summary.txt with the
  block-vs-token and auto-vs-best-fixed reports where they apply.

  summary.txt states which rows the main figures left out (`main_rows_note`).

  Returns:
    The written paths, figures first.

  Raises:
    ValueError: no figure can be drawn (no token fixed-gamma row, no group
      comparing verifiers, no gamma = auto); nothing is written.
  """
  all_rows, metadata = load_results(results_dir)
  rows = main_rows(all_rows)
  if not (rows or verifier_rows(all_rows) or adaptive_rows(all_rows)):
    raise ValueError(
        f"{results_dir}: no figure to draw: no row is token verifier with "
        "fixed gamma (figures (a)-(f), Table 3), no (draft, T, batch) group "
        "ran two verifiers (g) and none ran gamma = auto (h); the rows have "
        f"verifiers {sorted({r['verifier'] for r in all_rows})} and gamma "
        f"modes {sorted({r['gamma_mode'] for r in all_rows})}. Re-run the "
        "sweep with 'token' among its verifiers.")
  plots = (plot_alpha_vs_overlap, plot_tokens_per_pass,
           plot_speedup_vs_gamma, plot_speedup_vs_draft_size,
           plot_round_decomposition)
  paths = []
  for name, plot in zip(FIGURE_NAMES, plots if rows else ()):
    if plot is plot_round_decomposition and not _has_decomposition(rows):
      continue  # a sweep from before the loop's cost model
    paths += plot(rows, os.path.join(results_dir, name), metadata=metadata)
  if verifier_rows(all_rows):
    paths += plot_verifiers(all_rows, os.path.join(results_dir,
                                                   "fig_verifiers"), metadata)
  if adaptive_rows(all_rows):
    paths += plot_adaptive_gamma(
        all_rows, os.path.join(results_dir, "fig_adaptive_gamma"), metadata)
  report = efficiency_report(rows) if rows else ""
  summary = models_table(metadata) + (summary_table(rows) if rows else "")
  note = main_rows_note(all_rows)
  if note:
    summary += ("\n" if rows else "") + note
  for part in (report, block_vs_token_report(all_rows),
               verifier_table_markdown(all_rows, metadata),
               adaptive_report(all_rows)):
    if part:
      summary += "\n" + part
  skipped = metadata.get("skipped") or []
  if skipped:
    summary += "\nSkipped cells:\n" + "".join(
        f"  {s.get('draft')} T={s.get('temperature')} {s.get('verifier')} "
        f"gamma={s.get('gamma')} B={s.get('batch_size')}: {s.get('reason')}\n"
        for s in skipped)
  texts = [("summary.txt", summary)]
  if rows:
    texts.insert(0, ("table3.md", table3_markdown(rows, metadata)))
  if verifier_rows(all_rows):
    texts.append(("verifiers.md", verifier_table_markdown(all_rows, metadata)))
  for name, text in texts:
    path = os.path.join(results_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    paths.append(path)
  return paths
