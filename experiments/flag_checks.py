"""Flag checks the experiment scripts share, registered at parse time so that
a bad value fails before any model is loaded, trained or timed."""

from absl import app
from absl import flags

from specjax import _checks


def positive_ints(values) -> bool:
  """A DEFINE_list's strings are all ints >= 1 (empty passes: check that
  apart where an empty list means something)."""
  return all(v.strip().isdecimal() and int(v) >= 1 for v in values)


def require_results_dir(name: str = "results_dir", *,
                        optional: bool = False) -> None:
  """`--<name>` must be a directory or creatable: else the results are
  written only after all the work, and the write then fails. `optional`:
  unset (None) passes, for a flag whose default comes from the config."""
  flags.register_validator(
      name, lambda v: (optional and v is None) or _checks.dir_or_creatable(v),
      f"--{name} must be a directory, or a path where one can be created "
      f"(not an existing file); pass another --{name}")


def loaded_config(config_flag):
  """The ConfigDict of a `config_flags` flag. A config file that failed to
  load (missing, a syntax error, an unknown preset) gives a stand-in that
  raises only when read, which a type check then reported as "got
  _ErrorConfig": here it is a usage error with the loader's message."""
  value = config_flag.value
  try:
    value.get  # pylint: disable=pointless-statement
  except IOError as e:  # its cause says why (e.g. no such file)
    raise app.UsageError(f"--{config_flag.name}: {e.__cause__ or e}"
                         ) from None
  return value


def as_usage_error(check, *args, **kwargs):
  """Runs a library check (raising ValueError or TypeError naming the bad
  config field) and reports its failure as a usage error, not a traceback.
  For checks made before any work only: errors of the work itself keep
  their tracebacks."""
  try:
    return check(*args, **kwargs)
  except (ValueError, TypeError) as e:
    raise app.UsageError(str(e)) from None
