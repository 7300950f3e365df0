"""colab/sharded_decoding.ipynb runs top to bottom in a real kernel (nbclient)
on 8 fake CPU devices, as CI has no TPU."""

import pytest

from conftest import REPO
from conftest import host_devices_env

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")


@pytest.mark.full
def test_sharded_decoding_notebook_runs():
  nb = nbformat.read(REPO / "colab" / "sharded_decoding.ipynb", as_version=4)
  # The kernel's environment: 8 host devices, this checkout, no persistent
  # compilation cache.
  nbclient.NotebookClient(
      nb, timeout=600, kernel_name="python3",
      resources={"metadata": {"path": str(REPO / "colab")}}).execute(
          env=host_devices_env(8))
  outputs = "".join(o.get("text", "") for c in nb.cells
                    if c.cell_type == "code" for o in c.get("outputs", []))
  assert "8 devices" in outputs
  assert outputs.count("identical on 1x1 and 2x4: True") == 2
  assert "4x2 generate == one-device generate: True" in outputs
  assert "4.00x smaller" in outputs or "x smaller" in outputs
