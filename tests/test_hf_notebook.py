"""colab/hf_checkpoints.ipynb runs in a real kernel on the tiny checkpoints."""

import nbclient
import nbformat
import pytest

from conftest import REPO

DATA = REPO / "tests" / "data" / "hf"


@pytest.mark.full
def test_hf_notebook_runs_on_tiny_checkpoints(monkeypatch):
  monkeypatch.setenv("SPECJAX_HF_TARGET", str(DATA / "qwen2"))
  monkeypatch.setenv("SPECJAX_HF_DRAFT", str(DATA / "qwen2_draft"))
  monkeypatch.setenv("SPECJAX_HF_MAX_NEW_TOKENS", "16")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # The kernel imports specjax from this checkout.
  monkeypatch.setenv("PYTHONPATH", str(REPO))
  notebook = nbformat.read(REPO / "colab" / "hf_checkpoints.ipynb", as_version=4)
  nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(REPO)}}).execute()
  outputs = "".join(o.get("text", "") for c in notebook.cells
                    if c.cell_type == "code" for o in c.outputs)
  assert "alpha_hat" in outputs and "speedup" in outputs
