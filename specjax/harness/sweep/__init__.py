"""The measurement grid behind the paper figures: drafts x temperatures x gamma
(x verifier x batch size; gamma may be "auto").

`run` measures every cell of `plan`'s grid on one target: acceptance, the
loop's costs, measured and predicted speedups and the account of any gap; a
row is one cell, and its field names are the schema `specjax.harness.figures`
reads. `run_config` does the whole thing for a `configs/reproduce.py` config
and writes the result files (`write`). Three modules, each importing only
those listed before it:

  grid    the cells (`plan`, `Cell`, `AUTO`) and the checks of the axes and
          of a config's fields; loads, decodes and times nothing
  io      results on disk: `write`, `PARTIAL_ROWS`, the metadata
          (`git_commit`, `device_description`), the results_dir check
  runner  decoding and timing the cells (`run`), scoring models
          (`heldout_bpb`, `model_summaries`), a config end to end
          (`check_config`, `run_config`)

This package re-exports the names callers use, so `sweep.run(...)` and the
rest are the same functions wherever they live.
"""

from specjax import data
from specjax.harness.sweep.grid import AUTO
from specjax.harness.sweep.grid import Cell
from specjax.harness.sweep.grid import plan
from specjax import _moved
from specjax.harness.sweep.io import PARTIAL_ROWS
from specjax.harness.sweep.io import device_description
from specjax.harness.sweep.io import git_commit
from specjax.harness.sweep.io import write
from specjax.harness.sweep.runner import check_config
from specjax.harness.sweep.runner import heldout_bpb
from specjax.harness.sweep.runner import model_summaries
from specjax.harness.sweep.runner import run
from specjax.harness.sweep.runner import run_config

__all__ = [
    "AUTO", "Cell", "plan",
    "PARTIAL_ROWS", "device_description", "git_commit", "write",
    "check_config", "heldout_bpb", "model_summaries", "run", "run_config",
    # The corpus module `run_config` loads prompts from: tests replace its
    # `stdlib_corpus` through `sweep.data` to prove nothing loads before the
    # config is checked.
    "data",
]


# Moved names raise an error naming their new home.
__getattr__ = _moved.module_getattr(__name__, {
    "Draft": "specjax.harness.drafts.Draft",
    "DRAFT_KINDS": "specjax.harness.drafts.KINDS",
    "make_draft": "specjax.harness.drafts.wrap",
    "load_models": "specjax.harness.drafts.load_models",
    "self_draft": "specjax.harness.drafts.make_draft",
})
