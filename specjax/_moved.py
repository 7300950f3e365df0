"""Names that moved to another module: using one raises an error that names
its new home, instead of a bare "has no attribute".

The error is an `ImportError`, so that `from old import name` shows the
message too (Python replaces an `AttributeError` raised there with its own
"cannot import name").
"""

from __future__ import annotations

from typing import Callable


def module_getattr(module: str, moved: dict[str, str]) -> Callable[[str], object]:
  """A module-level `__getattr__` for `module` whose `moved` names
  ({name: "new.module.name"}) raise `ImportError` naming the new home."""

  def __getattr__(name: str):
    if name in moved:
      raise ImportError(f"{module}.{name} moved to {moved[name]}; import it "
                        "from there.", name=name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")

  return __getattr__
