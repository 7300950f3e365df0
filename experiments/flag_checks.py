"""Flag checks the experiment scripts share, registered at parse time so that
a bad value fails before any model is loaded, trained or timed."""

from absl import flags

from specjax import _checks


def positive_ints(values) -> bool:
  """A DEFINE_list's strings are all ints >= 1 (empty passes: check that
  apart where an empty list means something)."""
  return all(v.strip().isdecimal() and int(v) >= 1 for v in values)


def require_results_dir(name: str = "results_dir") -> None:
  """`--<name>` must be a directory or creatable: else the results are
  written only after all the work, and the write then fails."""
  flags.register_validator(
      name, _checks.dir_or_creatable,
      f"--{name} must be a directory, or a path where one can be created "
      f"(not an existing file); pass another --{name}")
