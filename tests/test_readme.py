"""The README's decoding example runs as written."""

import re

from conftest import REPO

from specjax.decode import draft_length
from specjax.decode import loop


def test_readme_python_example_runs(monkeypatch):
  # gamma="auto" times the models at every draft length up to AUTO_GAMMA_MAX
  # and compiles that many verify widths: 8 of them made this the suite's
  # slowest test. The example runs as written with a shorter maximum.
  monkeypatch.setattr(loop, "AUTO_GAMMA_MAX", 2)
  # ... and times each pass briefly: the example's output, not the costs
  # measured on a test machine, is what this test checks.
  monkeypatch.setattr(draft_length.measure_goodput, "__kwdefaults__", {
      **draft_length.measure_goodput.__kwdefaults__, "seconds": 0.002,
      "repeats": 1})
  text = (REPO / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  assert blocks, "README has no python example"
  namespace = {}
  for block in blocks:
    exec(compile(block, "README.md", "exec"), namespace)
  out = namespace["out"]
  assert out.tokens.shape == (2, 32)
  assert (out.lengths >= 1).all()
