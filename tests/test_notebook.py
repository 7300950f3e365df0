"""colab/quickstart.ipynb runs top to bottom (its code cells, in one namespace)."""

import json

from conftest import REPO


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
  notebook = json.loads((REPO / "colab" / "quickstart.ipynb").read_text())
  namespace = {}
  cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
  assert len(cells) >= 4
  for cell in cells:
    exec(compile("".join(cell["source"]), "quickstart.ipynb", "exec"), namespace)
  assert namespace["greedy_sd"].summary()["tokens_per_target_call"] >= 1.0
