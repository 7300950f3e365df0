"""The package's layers hold: pyproject.toml's import-linter contracts
(harness > oracle > core, the core's own order, no import cycle) pass, and
the same check fails on a graph that breaks them."""

import importlib
import os
import pathlib
import re
import textwrap

from importlinter import cli
import pytest

from conftest import REPO


def _lint(config: pathlib.Path) -> int:
  # import-linter reads the package from sys.path (the checkout, conftest).
  return cli.lint_imports(config_filename=str(config), no_cache=True,
                          no_logo=True)


def test_import_contracts_are_kept():
  assert _lint(REPO / "pyproject.toml") == 0


@pytest.mark.parametrize("contract", [
    # The harness above the core, turned upside down.
    """
    type = "layers"
    layers = ["specjax.decode", "specjax.harness"]
    """,
    # Inside the core: the loop imports the steps it runs.
    """
    type = "layers"
    layers = ["specjax.decode.steps", "specjax.decode.loop"]
    """,
])
def test_a_broken_contract_fails(tmp_path, contract):
  config = tmp_path / "contracts.toml"
  config.write_text(textwrap.dedent("""
      [tool.importlinter]
      root_packages = ["specjax"]

      [[tool.importlinter.contracts]]
      name = "control"
      """) + textwrap.dedent(contract))
  assert _lint(config) == 1


def test_the_layers_are_written_in_the_package_docstring():
  import specjax  # pylint: disable=import-outside-toplevel
  for layer in ("core", "oracle", "harness"):
    assert layer in specjax.__doc__
  assert os.path.basename(__file__) in specjax.__doc__


@pytest.mark.parametrize("old, new", [
    ("specjax.measure_goodput", "specjax.harness.autotune.measure_goodput"),
    ("specjax.expected_tokens_per_round",
     "specjax.harness.expected_tokens.expected_tokens_per_round"),
    ("specjax.zoo", "specjax.harness.zoo"),
    ("specjax.decode.draft_length.measure_goodput",
     "specjax.harness.autotune.measure_goodput"),
    ("specjax.decode.loop.AUTO_GAMMA_MAX",
     "specjax.harness.autotune.AUTO_GAMMA_MAX"),
    ("specjax.harness.textgen.make_draft", "specjax.harness.drafts.make_draft"),
    ("specjax.harness.sweep.load_models", "specjax.harness.drafts.load_models"),
    ("specjax.lab.controls.wrong_fallback_rule",
     "specjax.decode.verifiers.controls.wrong_fallback_rule"),
])
def test_a_moved_name_names_its_new_home(old, new):
  """`from old import name` and `old.name` both say where it went, and it
  is there."""
  module, _, name = old.rpartition(".")
  with pytest.raises(ImportError, match=f"{re.escape(old)} moved to "
                     f"{re.escape(new)}"):
    exec(f"from {module} import {name}", {})  # pylint: disable=exec-used
  home, _, attr = new.rpartition(".")
  home = importlib.import_module(home)
  assert hasattr(home, attr) or importlib.import_module(new)


def test_importing_a_moved_module_names_its_new_home():
  with pytest.raises(ImportError, match="specjax.sweep moved to "
                     "specjax.harness.sweep"):
    importlib.import_module("specjax.sweep")
