"""colab/quickstart.ipynb runs top to bottom in a real Jupyter kernel (nbclient)."""

import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO

NOTEBOOK = REPO / "colab" / "quickstart.ipynb"


@pytest.mark.parametrize("path", sorted((REPO / "colab").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_every_notebook_starts_with_a_guarded_install_cell(path):
  first = nbformat.read(path, as_version=4).cells[0]
  assert first.cell_type == "code"
  assert 'find_spec("specjax") is None' in first.source
  assert '"pip", "install"' in first.source and "SPECJAX_SOURCE" in first.source


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.full
def test_quickstart_notebook_runs_in_a_kernel(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
  # The kernel is a fresh process: it must import this checkout's specjax.
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  assert len([c for c in notebook.cells if c.cell_type == "code"]) >= 5
  NotebookClient(notebook, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  text = "".join(o.get("text", "") for c in notebook.cells
                 if c.cell_type == "code" for o in c.outputs)
  assert not [o for c in notebook.cells if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
  found = re.search(r"greedy speculative == greedy autoregressive; tokens "
                    r"per target call: ([0-9.]+)", text)
  assert found and float(found.group(1)) >= 1.0, text
