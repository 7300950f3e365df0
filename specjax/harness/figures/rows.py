"""A sweep's results: reading, validating and selecting its rows.

`load_results` reads `DIR/sweep.jsonl` (one JSON object per sweep cell, as
`specjax.harness.sweep` writes it) and `DIR/metadata.json`, and refuses any
row that would relabel, drop or double a cell. The selections (`main_rows`,
`verifier_rows`, `adaptive_rows`, `best_cells`) and the shared helpers below
are what `plots` and `tables` draw and print from; this module draws and
prints nothing.

A row is a dict; the keys every row carries are `REQUIRED_KEYS`. The
optional axes of later sweeps (`AXIS_DEFAULTS`: verifier, exact, gamma_mode,
batch_size) are filled in by `load_results`, so every loaded row has them.
"""

from __future__ import annotations

import json
import math
import os
from typing import Iterable, Sequence

import numpy as np

from specjax import stats
from specjax.harness import drafts

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

# Display order of draft kinds: the registry's, the paper's columns first.
KIND_ORDER = drafts.KINDS
TRANSFORMER_KINDS = ("transformer", "distilled")

# Axes added by later sweeps, with the value a row without them had.
AXIS_DEFAULTS = {"verifier": "token", "exact": True, "gamma_mode": "fixed",
                 "batch_size": 1}

# The fields that name one sweep cell: no two rows of a sweep share all six.
CELL_FIELDS = ("draft", "temperature", "gamma", "verifier", "gamma_mode",
               "batch_size")


# --- Loading --------------------------------------------------------------


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


# --- Helpers shared by plots and tables -------------------------------------


def _draft_sort_key(row: dict) -> tuple:
  kind = row["draft_kind"]
  rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
  return (rank, int(row["draft_params"]), str(row["draft"]))


def num(value) -> float:
  """float(value), NaN for None or anything non-numeric (missing se, ...)."""
  try:
    out = float(value)
  except (TypeError, ValueError):
    return math.nan
  return out


def _settings(rows: Sequence[dict]) -> list[tuple[str, str, int]]:
  """The (verifier, gamma_mode, batch_size) combinations of `rows`; a row
  without an axis has its AXIS_DEFAULTS value, as load_results gives it."""
  return sorted({tuple(r.get(k, AXIS_DEFAULTS[k])
                       for k in ("verifier", "gamma_mode", "batch_size"))
                 for r in rows}, key=str)


def require_one_setting(rows: Sequence[dict], caller: str) -> None:
  """Refuses rows mixing verifiers, gamma modes or batch sizes.

  Figures (a)-(f), Table 3 and the best-gamma summary index cells by (draft,
  temperature, gamma) only: given two verifiers they would pick a lossy
  cell as the best gamma or pool alpha across verifiers, silently.

  Raises:
    ValueError: `rows` hold more than one (verifier, gamma_mode, batch_size)
      setting; the message names `caller` and points to `main_rows`.
  """
  settings = _settings(rows)
  if len(settings) > 1:
    raise ValueError(
        f"rows: {caller} reads one (verifier, gamma_mode, batch_size) "
        f"setting, got {len(settings)}: {settings}; pass "
        "figures.main_rows(rows) (token verifier, fixed gamma, smallest "
        "batch) or select the rows of one setting.")


def draft_names(rows: Sequence[dict]) -> list[str]:
  """Draft names in display order (kind, size, name)."""
  first = {}
  for r in rows:
    first.setdefault(r["draft"], r)
  return sorted(first, key=lambda d: _draft_sort_key(first[d]))


def temperatures(rows: Sequence[dict]) -> list[float]:
  """The temperatures of `rows`, ascending."""
  return sorted({r["temperature"] for r in rows})


def cells_of(rows: Sequence[dict], draft: str,
             temperature: float) -> list[dict]:
  """The rows of one (draft, temperature), by ascending gamma."""
  return sorted((r for r in rows
                 if r["draft"] == draft and r["temperature"] == temperature),
                key=lambda r: r["gamma"])


def format_count(n: int) -> str:
  """Parameter counts as 97M / 6.1M / 120k / 950."""
  n = int(n)
  for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
    if n >= scale:
      return f"{n / scale:.3g}{suffix}"
  return str(n)


def meta_value(metadata: dict | None, *names: str) -> str | None:
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


def target_name(rows: Sequence[dict], metadata: dict | None = None) -> str:
  """The target model(s) of `rows`, with the size where there is one."""
  targets = sorted({str(r["target"]) for r in rows})
  name = " / ".join(targets) if targets else (meta_value(metadata, "target")
                                               or "unknown target")
  sizes = sorted({int(r["target_params"]) for r in rows
                  if r.get("target_params") is not None})
  if len(sizes) == 1:
    name += f" ({format_count(sizes[0])})"
  return name


def provenance(rows: Sequence[dict], metadata: dict | None) -> str:
  """'target: X · device: Y · commit Z' for titles and footers."""
  device = meta_value(metadata, "device", "device_kind", "devices") or "unknown"
  commit = meta_value(metadata, "git_commit", "commit", "git") or "unknown"
  if len(commit) > 12 and all(ch in "0123456789abcdef" for ch in commit):
    commit = commit[:10]
  return (f"target: {target_name(rows, metadata)} · device: {device} · "
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


def pooled_alpha(cells: Iterable[dict]) -> tuple[float, float, bool]:
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
  counts = _row_counts(cells)
  if counts is not None and int(counts[0].sum()) == acc and int(
      counts[1].sum()) == ver:
    return (*stats.clustered_alpha(*counts), True)
  return (*stats.pooled_alpha(acc, ver), False)


def has_decomposition(rows: Sequence[dict]) -> bool:
  """Whether every row carries the loop's cost model (predicted and measured
  round); sweeps written before it have neither figure (f) nor its report."""
  return all("predicted_round_s" in r and "measured_round_s" in r for r in rows)


# --- Selections -------------------------------------------------------------


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
  require_one_setting(rows, "best_cells")
  out = {}
  for d in draft_names(rows):
    for t in temperatures(rows):
      cells = [c for c in cells_of(rows, d, t)
               if math.isfinite(num(c["speedup"]))]
      if cells:
        # max() keeps the first maximum, and cells are sorted by gamma.
        out[(d, t)] = max(cells, key=lambda c: num(c["speedup"]))
  return out


def main_rows(rows: Sequence[dict]) -> list[dict]:
  """The rows figures (a)-(f) and Table 3 read: token verifier, fixed gamma,
  the smallest batch size of the sweep (batch 1, the latency setting)."""
  fixed = [r for r in rows
           if r["verifier"] == "token" and r["gamma_mode"] == "fixed"]
  if not fixed:
    return []
  smallest = min(r["batch_size"] for r in fixed)
  return [r for r in fixed if r["batch_size"] == smallest]


def group_keys(rows: Sequence[dict]) -> list[tuple[str, float, int]]:
  """(draft, temperature, batch) in display order."""
  keys = {(r["draft"], r["temperature"], r["batch_size"]) for r in rows}
  order = {d: i for i, d in enumerate(draft_names(rows))}
  return sorted(keys, key=lambda k: (order[k[0]], k[1], k[2]))


def verifier_names(rows: Sequence[dict]) -> list[str]:
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


def adaptive_rows(rows: Sequence[dict]) -> list[dict]:
  """Exact-verifier rows of the (draft, T, batch, verifier) groups that ran
  gamma = auto beside fixed gammas. (The sweep runs auto only with exact
  verifiers; a lossy group elsewhere would mix speed with distortion.)"""
  auto = {(r["draft"], r["temperature"], r["batch_size"], r["verifier"])
          for r in rows if r["gamma_mode"] == "auto" and r["exact"]}
  return [r for r in rows if (r["draft"], r["temperature"], r["batch_size"],
                              r["verifier"]) in auto]
