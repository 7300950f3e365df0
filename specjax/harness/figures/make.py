"""`make_all`: every figure, table and report of a results directory."""

from __future__ import annotations

import os

from specjax.harness.figures import plots
from specjax.harness.figures import tables
from specjax.harness.figures.rows import adaptive_rows
from specjax.harness.figures.rows import has_decomposition
from specjax.harness.figures.rows import load_results
from specjax.harness.figures.rows import main_rows
from specjax.harness.figures.rows import verifier_rows


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
  # Looked up on `plots` at call time, in FIGURE_NAMES' order.
  drawers = (plots.plot_alpha_vs_overlap, plots.plot_tokens_per_pass,
             plots.plot_speedup_vs_gamma, plots.plot_speedup_vs_draft_size,
             plots.plot_round_decomposition)
  paths = []
  for name, plot in zip(plots.FIGURE_NAMES, drawers if rows else ()):
    if name == "fig_round_decomposition" and not has_decomposition(rows):
      continue  # a sweep from before the loop's cost model
    paths += plot(rows, os.path.join(results_dir, name), metadata=metadata)
  if verifier_rows(all_rows):
    paths += plots.plot_verifiers(
        all_rows, os.path.join(results_dir, "fig_verifiers"), metadata)
  if adaptive_rows(all_rows):
    paths += plots.plot_adaptive_gamma(
        all_rows, os.path.join(results_dir, "fig_adaptive_gamma"), metadata)
  report = tables.efficiency_report(rows) if rows else ""
  summary = tables.models_table(metadata) + (
      tables.summary_table(rows) if rows else "")
  note = tables.main_rows_note(all_rows)
  if note:
    summary += ("\n" if rows else "") + note
  for part in (report, tables.block_vs_token_report(all_rows),
               tables.verifier_table_markdown(all_rows, metadata),
               tables.adaptive_report(all_rows)):
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
    texts.insert(0, ("table3.md", tables.table3_markdown(rows, metadata)))
  if verifier_rows(all_rows):
    texts.append(("verifiers.md",
                  tables.verifier_table_markdown(all_rows, metadata)))
  for name, text in texts:
    path = os.path.join(results_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    paths.append(path)
  return paths
