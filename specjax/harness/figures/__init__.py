"""Figures and tables from a speculative-decoding sweep (`harness.sweep`).

Reads `DIR/sweep.jsonl` (one JSON object per (draft, temperature, gamma)
cell) and `DIR/metadata.json`, and `make_all(DIR)` writes into `DIR`:

  fig_*.{png,pdf}  the figures (a)-(h) (`plots`)
  table3.md        (e) Leviathan et al. (2023), Table 3 layout, the paper's
                   row beside ours (`tables.table3_markdown`)
  verifiers.md     every verifier cell, where verifiers were compared
  summary.txt      one screen: the models, best gamma per draft and
                   temperature, where speculation loses, the cost model's
                   check, the rows the main figures leave out, block against
                   token and gamma = auto against the best fixed gamma per
                   cell, and the cells the sweep skipped

One responsibility a module; each imports only the modules listed before
it, so `rows` imports none of the others:

  rows    reading and validating sweep.jsonl; selecting rows (`main_rows`,
          `verifier_rows`, `adaptive_rows`, `best_cells`)
  plots   every matplotlib figure (`plot_*`)
  tables  markdown tables and text reports
  make    `make_all`

Sweeps with more axes (`specjax.harness.sweep.run`: verifier, gamma = auto,
batch size) draw (a)-(f) and Table 3 from the main rows only (token
verifier, fixed gamma, the smallest batch size), and (g), (h) where their
axes vary; summary.txt counts the rows (a)-(f) leave out, per reason.

The public names of the modules are re-exported here, so notebooks can
redraw single figures: `figures.load_results(DIR)`,
`figures.plot_speedup_vs_gamma(figures.main_rows(rows), stem)`.
"""

from specjax.harness.figures.make import make_all
from specjax.harness.figures.plots import FIGURE_NAMES
from specjax.harness.figures.plots import KIND_MARKERS
from specjax.harness.figures.plots import plot_adaptive_gamma
from specjax.harness.figures.plots import plot_alpha_vs_overlap
from specjax.harness.figures.plots import plot_batch_scaling
from specjax.harness.figures.plots import plot_round_decomposition
from specjax.harness.figures.plots import plot_speedup_vs_draft_size
from specjax.harness.figures.plots import plot_speedup_vs_gamma
from specjax.harness.figures.plots import plot_tokens_per_pass
from specjax.harness.figures.plots import plot_verifiers
from specjax.harness.figures.rows import adaptive_rows
from specjax.harness.figures.rows import AXIS_DEFAULTS
from specjax.harness.figures.rows import best_cells
from specjax.harness.figures.rows import CELL_FIELDS
from specjax.harness.figures.rows import cell_key
from specjax.harness.figures.rows import KIND_ORDER
from specjax.harness.figures.rows import load_results
from specjax.harness.figures.rows import main_rows
from specjax.harness.figures.rows import METADATA_FILE
from specjax.harness.figures.rows import PARTIAL_ROWS
from specjax.harness.figures.rows import REQUIRED_KEYS
from specjax.harness.figures.rows import SWEEP_FILE
from specjax.harness.figures.rows import TRANSFORMER_KINDS
from specjax.harness.figures.rows import verifier_rows
from specjax.harness.figures.rows import Z95
from specjax.harness.figures.tables import adaptive_report
from specjax.harness.figures.tables import block_vs_token_report
from specjax.harness.figures.tables import efficiency_report
from specjax.harness.figures.tables import main_rows_note
from specjax.harness.figures.tables import models_table
from specjax.harness.figures.tables import PAPER_ROW
from specjax.harness.figures.tables import PAPER_ROW_NAME
from specjax.harness.figures.tables import PAPER_TRANSFORMER_NAME
from specjax.harness.figures.tables import summary_table
from specjax.harness.figures.tables import table3_markdown
from specjax.harness.figures.tables import verifier_table_markdown

__all__ = [
    # rows
    "SWEEP_FILE", "METADATA_FILE", "PARTIAL_ROWS", "Z95", "REQUIRED_KEYS",
    "KIND_ORDER", "TRANSFORMER_KINDS", "AXIS_DEFAULTS", "CELL_FIELDS",
    "cell_key", "load_results", "best_cells", "main_rows", "verifier_rows",
    "adaptive_rows",
    # plots
    "FIGURE_NAMES", "KIND_MARKERS", "plot_alpha_vs_overlap",
    "plot_tokens_per_pass", "plot_speedup_vs_gamma",
    "plot_speedup_vs_draft_size", "plot_round_decomposition",
    "plot_batch_scaling", "plot_verifiers", "plot_adaptive_gamma",
    # tables
    "PAPER_ROW_NAME", "PAPER_ROW", "PAPER_TRANSFORMER_NAME",
    "table3_markdown", "summary_table", "efficiency_report",
    "verifier_table_markdown", "block_vs_token_report", "adaptive_report",
    "models_table", "main_rows_note",
    # make
    "make_all",
]
