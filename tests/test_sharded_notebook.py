"""colab/sharded_decoding.ipynb runs top to bottom in a real kernel (nbclient)
on 8 fake CPU devices, as CI has no TPU."""

import os

import pytest

from conftest import REPO

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")


def test_sharded_decoding_notebook_runs(monkeypatch):
  # The kernel inherits this environment: 8 host devices, this checkout.
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "")
                     + " --xla_force_host_platform_device_count=8")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # Several CPU devices: no persistent compilation cache (as
  # conftest.host_devices_env, which builds a subprocess's environment).
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [str(REPO), os.environ.get("PYTHONPATH", "")]))
  nb = nbformat.read(REPO / "colab" / "sharded_decoding.ipynb", as_version=4)
  nbclient.NotebookClient(
      nb, timeout=600, kernel_name="python3",
      resources={"metadata": {"path": str(REPO / "colab")}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells
                    if c.cell_type == "code" for o in c.get("outputs", []))
  assert "8 devices" in outputs
  assert outputs.count("identical on 1x1 and 2x4: True") == 2
  assert "4x2 generate == one-device generate: True" in outputs
  assert "4.00x smaller" in outputs or "x smaller" in outputs
