"""Puts the repository root on sys.path: `configs/` and `experiments/` are
top-level folders of the checkout, not part of the installed package."""

import logging
import os
import pathlib
import sys

from hypothesis import settings

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

# A deliberately damaged checkpoint leaves orbax's async reads with futures
# whose (expected) errors asyncio logs at interpreter exit, after pytest's
# summary; they say nothing the test has not already asserted.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

# CI runs the same hypothesis examples every time, so a red run is
# reproducible; locally hypothesis keeps exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
  settings.load_profile("ci")
