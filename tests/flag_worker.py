"""Runs one experiment module's absl `main` on several command lines, in one
process: `tests/test_experiment_flags.py` starts one of these per module
instead of one interpreter per command line (each start imports JAX and
specjax, about 3 CPU seconds on the 2-core box).

  python tests/flag_worker.py MODULE < JSON list of argument lists

Prints one line `RESULT [[exit_code, stderr], ...]`, in the input's order.
Each command line starts from the flags' defaults and runs through
`absl.app.run`, as `python -m MODULE ARGS` does; its stderr is the process's
file descriptor 2 while it runs, so absl's messages and tracebacks are in it.
"""

import importlib
import json
import os
import signal
import sys
import tempfile
import traceback

from absl import app
from absl import flags

# A command whose check is missing goes on to load or train a model: stop it
# here, well before the test's own timeout kills the whole process.
SECONDS_PER_COMMAND = 60


class _TookTooLong(Exception):
  pass


def _alarm(signum, frame):
  del signum, frame
  raise _TookTooLong(f"still running after {SECONDS_PER_COMMAND} s: the "
                     "bad flag was not refused before the work started")


def _fresh_config_flag(args):
  """As `python -m` starts with `args`, for a module's `--config`:
  config_flags reads the `--config.<field>` overrides from sys.argv when it
  parses the config (the default one at import), defining a flag for each.
  Drops the previous command's, sets sys.argv to this command line, and
  parses the default config again when the command names none."""
  sys.argv = [sys.argv[0], *args]
  for name in [n for n in flags.FLAGS if n.startswith("config.")]:
    delattr(flags.FLAGS, name)
  if "config" in flags.FLAGS:
    flag = flags.FLAGS["config"]
    flag._set_default(flag.default_unparsed)  # pylint: disable=protected-access


def run_one(module, args):
  """(exit code, stderr) of `python -m module *args`."""
  flags.FLAGS.unparse_flags()  # the previous command's values are gone
  _fresh_config_flag(args)
  with tempfile.TemporaryFile("w+") as err:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(err.fileno(), 2)
    signal.alarm(SECONDS_PER_COMMAND)
    try:
      app.run(module.main, argv=[module.__name__, *args])
      code = 0
    except SystemExit as e:
      if e.code is None or isinstance(e.code, int):
        code = e.code or 0
      else:  # sys.exit("message"): the interpreter prints it and exits 1
        print(e.code, file=sys.stderr)
        code = 1
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()  # what the interpreter prints for an uncaught one
      code = 1
    finally:
      signal.alarm(0)
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
    err.seek(0)
    return code, err.read()


def main():
  module = importlib.import_module(sys.argv[1])
  # absl's usage text is the __main__ module's docstring: the module's, as
  # under `python -m`.
  sys.modules["__main__"].__doc__ = module.__doc__
  signal.signal(signal.SIGALRM, _alarm)
  results = [run_one(module, args) for args in json.load(sys.stdin)]
  print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
  main()
