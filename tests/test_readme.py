"""The README's python examples run as written: the decoding example by
default, every block with `-m slow`."""

import re

import pytest

from conftest import REPO

from specjax.harness import autotune


def _run_blocks(monkeypatch, blocks):
  # gamma="auto" times the models at every draft length up to AUTO_GAMMA_MAX
  # and compiles that many verify widths: 8 of them made this the suite's
  # slowest test. The examples run as written with a shorter maximum ...
  monkeypatch.setattr(autotune, "AUTO_GAMMA_MAX", 2)
  # ... and time each pass briefly: the examples' outputs, not the costs
  # measured on a test machine, are what these tests check.
  monkeypatch.setattr(autotune.measure_goodput, "__kwdefaults__", {
      **autotune.measure_goodput.__kwdefaults__, "seconds": 0.002,
      "repeats": 1})
  namespace = {}
  for block in blocks:
    exec(compile(block, "README.md", "exec"), namespace)
  return namespace


def _blocks():
  text = (REPO / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  assert blocks, "README has no python example"
  return blocks


@pytest.mark.full
def test_readme_decoding_example_runs(monkeypatch):
  out = _run_blocks(monkeypatch, _blocks()[:1])["out"]
  assert out.tokens.shape == (2, 32)
  assert (out.lengths >= 1).all()


# Every block (self-drafts, gamma="auto", confidence, verifiers, trees: ~9
# more compiled loops, each API also tested on its own): opt-in, to keep the
# default run under CI's 10 minutes.
@pytest.mark.slow
def test_readme_python_examples_run(monkeypatch):
  namespace = _run_blocks(monkeypatch, _blocks())
  assert namespace["out"].tokens.shape == (2, 32)
