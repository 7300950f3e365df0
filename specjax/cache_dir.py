"""Where specjax keeps what it builds: trained models (the harness's zoo)
and compiled programs (`distributed.use_compilation_cache`).

`cache_dir=` where a function takes one, else $SPECJAX_CACHE, else
~/.cache/specjax.
"""

from __future__ import annotations

import os

CACHE_ENV = "SPECJAX_CACHE"


def resolve_cache_dir(override: str | os.PathLike | None = None) -> str:
  """The cache directory: `override`, else $SPECJAX_CACHE, else
  ~/.cache/specjax, as an absolute path."""
  if override is not None and not isinstance(override, (str, os.PathLike)):
    raise TypeError(f"cache_dir must be a path (str or os.PathLike) or None, "
                    f"got {type(override).__name__}.")
  if override is not None and not os.fspath(override):
    # Else it would fall back to the default cache, silently.
    raise ValueError("cache_dir must be a non-empty path, or None for "
                     f"${CACHE_ENV} or ~/.cache/specjax.")
  path = override or os.environ.get(CACHE_ENV) or os.path.join(
      "~", ".cache", "specjax")
  # Else "~/x" in $SPECJAX_CACHE would make a directory named "~" here.
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) and not os.path.isdir(path):
    raise NotADirectoryError(
        f"specjax's cache directory {path!r} is a file; pass another "
        f"cache_dir or ${CACHE_ENV}.")
  return path
