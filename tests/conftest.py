"""Puts the repository root on sys.path: `configs/` and `experiments/` are
top-level folders of the checkout, not part of the installed package."""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))
