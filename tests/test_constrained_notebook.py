"""colab/constrained_decoding.ipynb runs top to bottom in a real kernel
(nbclient): 500 speculative rows under a JSON schema, each one valid."""

import os

import pytest

from conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.full
def test_constrained_notebook_runs(monkeypatch):
  # The kernel is a subprocess: make it import this checkout's specjax.
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [str(REPO), os.environ.get("PYTHONPATH", "")]))
  notebook = nbformat.read(REPO / "colab" / "constrained_decoding.ipynb",
                           as_version=4)
  nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(REPO / "colab")}}
                          ).execute()
  text = "".join(out.get("text", "") for cell in notebook.cells
                 if cell.cell_type == "code" for out in cell.outputs)
  assert "500 rows, all valid" in text
  assert "greedy speculative == greedy generate: True" in text
