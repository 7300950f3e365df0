"""Flag and config checks the experiment scripts share: a bad value fails
before any model is loaded, trained or timed, with a usage message naming
the flag or config field, not a traceback."""

from __future__ import annotations

import math
import os

import functools
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

import configs
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


class _OneLineErrors(flags.ArgumentParser):
  """A config file flag's parser, its errors one line each: a missing file
  came as three lines (and only once the config was read), an unknown
  preset (a ValueError of `get_config`) as a traceback."""

  def __init__(self, parser):
    self._parser = parser

  def parse(self, argument):
    file = argument.split(":", 1)[0]
    if not os.path.isfile(file):
      raise ValueError(
          f"No such file {file!r} (a path from the working directory "
          f"{os.getcwd()}); the configs are {configs.path('*.py')}")
    try:
      return self._parser.parse(argument)
    except (TypeError, ValueError) as e:
      # config_flags raises a new error holding the traceback; the error
      # get_config raised is its context. (absl reports either type as a
      # bad flag value.)
      cause = e.__context__ or e
      raise ValueError(" ".join(str(cause).split())) from None

  def flag_type(self):
    return self._parser.flag_type()


def define_config(default: str | None, help_string: str):
  """`--config`, a config file of configs/ and its preset ('eagle.py:quick')
  by default (None: no default), found from any working directory;
  `--config.<field>=value` overrides a field. Returns the flag's holder."""
  holder = config_flags.DEFINE_config_file(
      "config", default and configs.path(default), help_string,
      lock_config=True)
  flag = flags.FLAGS[holder.name]
  flag.parser = _OneLineErrors(flag.parser)
  return holder


def loaded_config(config_flag):
  """The ConfigDict of a `config_flags` flag. A config file that failed to
  load (missing, a syntax error, an unknown preset) gives a stand-in that
  raises only when read, which a type check then reported as "got
  _ErrorConfig": here it is a usage error with the loader's message."""
  value = config_flag.value
  try:
    value.get  # pylint: disable=pointless-statement
  except IOError as e:  # its cause says why (e.g. no such file)
    raise app.UsageError(f"--{config_flag.name}: "
                         + " ".join(str(e.__cause__ or e).split())) from None
  return value


def overridden(config_flag) -> set[str]:
  """The fields given on the command line (`--config.<field>=...`)."""
  return set(config_flags.get_override_values(flags.FLAGS[config_flag.name]))


def as_usage_error(check, *args, **kwargs):
  """Runs a library check (raising ValueError or TypeError naming the bad
  config field) and reports its failure as a usage error, not a traceback.
  For checks made before any work only: errors of the work itself keep
  their tracebacks."""
  try:
    return check(*args, **kwargs)
  except (ValueError, TypeError) as e:
    raise app.UsageError(str(e)) from None


# Checks of config fields, each raising ValueError that names the field and
# shows an override that passes (`--config.<name>=<example>`).


def require_fields(config, fields, what: str) -> None:
  """Raises unless `config` holds every field of `fields`: a config of
  another entry point (`what` says which configs this one reads)."""
  missing = [f for f in fields if f not in config]
  if missing:
    raise ValueError(f"--config has no field(s) {', '.join(missing)}: it is "
                     f"not a config of this experiment; {what}.")


def ints(config, name: str, *, example: str, empty: bool = False
         ) -> list[int]:
  """`config.<name>`, a tuple of ints >= 1 (`--config.<name>=1,2,4`; an
  empty override, `--config.<name>=`, is no int), as a list; `empty`: none
  is allowed."""
  values = [v for v in _items(config[name]) if v != ""]
  if (not values and not empty) or not all(
      isinstance(v, int) and not isinstance(v, bool) and v >= 1
      for v in values):
    raise ValueError(
        f"config.{name} must be {'' if empty else 'one or more '}ints >= 1, "
        f"e.g. --config.{name}={example}; got {config[name]!r}")
  return values


def numbers(config, name: str, *, example: str) -> list[float]:
  """`config.<name>`, a tuple of one or more finite numbers >= 0
  (`--config.<name>=0,1`), as a list of floats."""
  values = [v for v in _items(config[name]) if v != ""]
  if not values or not all(
      isinstance(v, (int, float)) and not isinstance(v, bool)
      and math.isfinite(v) and v >= 0 for v in values):
    raise ValueError(
        f"config.{name} must be one or more numbers >= 0, e.g. "
        f"--config.{name}={example}; got {config[name]!r}")
  return [float(v) for v in values]


def names(config, name: str, *, sep: str = ",", example: str) -> list[str]:
  """`config.<name>`, a `sep`-separated string naming at least one thing,
  as a list."""
  text = config[name]
  values = [v for v in text.split(sep) if v] if isinstance(text, str) else []
  if not values:
    raise ValueError(
        f"config.{name} must name at least one ('{sep}'-separated), e.g. "
        f"--config.{name}='{example}'; got {text!r}")
  return values


def positive(config, *fields) -> None:
  """Each `config.<field>` is an int >= 1."""
  for name in fields:
    _checks.check_int(f"config.{name}", config[name], low=1)


def results_dir(config, flag) -> str:
  """`--results_dir` if given, else `config.results_dir`: a directory, or a
  path where one can be created."""
  path = flag.value or config.results_dir
  if not _checks.dir_or_creatable(path):
    raise ValueError(
        f"config.results_dir={path!r} must be a directory, or a path where "
        "one can be created (not an existing file); pass another "
        "--results_dir")
  return path


def _items(value):
  return value if isinstance(value, (tuple, list)) else (value,)


def one_line_usage_errors(main):
  """`main`, with a usage error (a bad flag or config value found after
  parsing) printed as one line, `error: <message>`, and exit status 1,
  instead of absl's usage text with the message at its end."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)

  return wrapped
