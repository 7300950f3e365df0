"""The package's layers hold: pyproject.toml's import-linter contracts
(harness > oracle > core, the core's own order, no import cycle) pass, and
the same check fails on a graph that breaks them."""

import os
import pathlib
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
