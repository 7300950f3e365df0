"""The README's decoding example runs as written."""

import re

from conftest import REPO


def test_readme_python_example_runs():
  text = (REPO / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  assert blocks, "README has no python example"
  namespace = {}
  for block in blocks:
    exec(compile(block, "README.md", "exec"), namespace)
  out = namespace["out"]
  assert out.tokens.shape == (2, 32)
  assert (out.lengths >= 1).all()
