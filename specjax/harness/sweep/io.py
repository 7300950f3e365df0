"""A sweep's results on disk: the row files, the metadata and their checks.

`write` puts a finished grid's rows into `sweep.jsonl` and `sweep.csv` and
its metadata into `metadata.json` (the files `specjax.harness.figures`
reads), each input checked before a file is opened. While a grid runs,
`partial_rows` appends each row as it is measured to `PARTIAL_ROWS`, so a
sweep that dies keeps what it measured; `write` removes that file.
`run_metadata` holds what makes a result reproducible: the config, corpus,
models, the software and machine (`device_description`) and the checkout
(`git_commit`).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
from typing import Callable, Sequence

import jax

from specjax import _checks
from specjax.harness import figures
from specjax.harness.sweep import grid


# The rows measured so far, one JSON object a line (`partial_rows`); `write`
# removes it.
PARTIAL_ROWS = figures.PARTIAL_ROWS


def git_commit() -> str:
  """HEAD of the checkout this file lives in (+ "-dirty"), or "unknown"."""
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, check=True,
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=here, capture_output=True, text=True).stdout
    return out + ("-dirty" if dirty.strip() else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def device_description() -> str:
  """Platform, device kind and count, and the host's cores."""
  d = jax.devices()[0]
  return (f"{d.platform}:{d.device_kind} x{jax.device_count()} "
          f"({os.cpu_count()} CPU cores, {platform.machine()})")


def run_metadata(config, *, corpus: dict, models: dict, dtypes: dict | None,
                 seconds: float, skipped: list) -> dict:
  """metadata.json of a `run_config` sweep: the config (as a dict), the
  corpus' fingerprint, `models` (`model_summaries`), the dtypes, the software,
  device and checkout, the time it ends and the `seconds` it took (rounded
  to 0.1 s), and the cells it `skipped` with their reasons."""
  return {
      "config": config.to_dict(), "corpus": corpus,
      "models": models,
      "dtypes": dict(dtypes or {}),
      "jax_version": jax.__version__, "python": sys.version.split()[0],
      "device": device_description(), "seed": config.seed,
      "git_commit": git_commit(),
      "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
      "sweep_seconds": round(seconds, 1),
      "skipped": skipped,
  }


def check_results_dir(results_dir) -> None:
  """Raises, naming it, unless `results_dir` is a directory path that exists
  or can be created (TypeError for no path, ValueError for a file)."""
  if not isinstance(results_dir, (str, os.PathLike)) or not os.fspath(
      results_dir):
    raise TypeError(f"results_dir must be a directory path (a non-empty str), "
                    f"got {results_dir!r}.")
  if not _checks.dir_or_creatable(results_dir):
    raise ValueError(f"results_dir {results_dir!r} is a file, or under one, "
                     "or not writable; give a directory (it is created if "
                     "missing).")


def partial_rows(results_dir: str) -> Callable[[dict], None]:
  """Empties (or creates) `results_dir/PARTIAL_ROWS` and returns a function
  that appends one row to it, as a JSON line.

  A long grid that dies (out of memory, a killed job) keeps what it
  measured: each row is appended as its cell ends, and the file is opened
  for each row, so every finished row is on disk; `write` removes the file
  once the whole grid is written. `results_dir` must exist.
  """
  path = os.path.join(results_dir, PARTIAL_ROWS)
  with open(path, "w"):
    pass

  def save(row: dict) -> None:
    with open(path, "a") as fh:
      fh.write(json.dumps(row) + "\n")
  return save


def write(rows: Sequence[dict], metadata: dict, results_dir: str) -> None:
  """sweep.jsonl and sweep.csv (overwritten, never appended), metadata.json;
  removes the rows-so-far file (`partial_rows`), which they supersede.

  Every input is checked, and every row and the metadata serialised, before
  a file is opened, so a refused call leaves the old files as they were:
  `rows` a non-empty sequence (any iterable, read once) of dicts, each
  holding `figures.REQUIRED_KEYS`, no two of one cell
  (`figures.cell_key`); `metadata` a dict; `results_dir` a
  directory or creatable.
  """
  # Read once: a generator would be used up by the first file.
  rows = grid.as_axis("rows", rows, "the row dicts run returns")
  lines = []
  cells = {}
  for i, row in enumerate(rows):
    if not isinstance(row, dict):
      raise TypeError(f"rows[{i}] must be a dict (a row of run), got "
                      f"{type(row).__name__} {row!r}.")
    missing = [k for k in figures.REQUIRED_KEYS if k not in row]
    if missing:
      raise ValueError(f"rows[{i}] lacks {missing} (figures.REQUIRED_KEYS: "
                       "the figures refuse a row without them).")
    # figures.load_results refuses a repeated cell; refuse it before the
    # files exist rather than write results the figures cannot read.
    cell = figures.cell_key(row)
    j = cells.setdefault(cell, i)
    if j != i:
      raise ValueError(
          f"rows[{i}] repeats the cell of rows[{j}] ("
          + ", ".join(f"{k}={v!r}" for k, v in zip(figures.CELL_FIELDS, cell))
          + "): give each cell one row.")
    try:
      lines.append(json.dumps(row) + "\n")
    except (TypeError, ValueError) as e:
      raise TypeError(f"rows[{i}] is not JSON-serialisable: {e}.") from None
  if not isinstance(metadata, dict):
    raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}.")
  meta_text = json.dumps(metadata, indent=1, default=str)
  check_results_dir(results_dir)
  os.makedirs(results_dir, exist_ok=True)
  with open(os.path.join(results_dir, "sweep.jsonl"), "w") as fh:
    fh.writelines(lines)
  # Rows may differ in keys (an auto row's decomposition has factor_round
  # where a fixed row has factor_draft / factor_verify): the union, in order.
  fields = list(dict.fromkeys(k for row in rows for k in row))
  with open(os.path.join(results_dir, "sweep.csv"), "w", newline="") as fh:
    writer = csv.DictWriter(fh, fieldnames=fields)
    writer.writeheader()
    writer.writerows({k: (json.dumps(v) if isinstance(v, list) else v)
                      for k, v in row.items()} for row in rows)
  with open(os.path.join(results_dir, "metadata.json"), "w") as fh:
    fh.write(meta_text)
  partial = os.path.join(results_dir, PARTIAL_ROWS)
  if os.path.exists(partial):
    os.remove(partial)
