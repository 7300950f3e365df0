"""Keeps the test suite's persistent compilation cache bounded on disk.

The cache outlives a run (tests/conftest.py), and every change to a
compiled program adds entries that no later run reads: about 75 MB per
cold run of the suite. `prune` runs once per pytest session.
"""

import os


def prune(directory: str, max_bytes: int = 1 << 30) -> int:
  """Deletes the oldest-written files of `directory` while it holds more than
  `max_bytes`, down to half of that; returns how many it deleted. A missing
  directory is empty. (JAX's own limit, jax_compilation_cache_max_size,
  needs the filelock package.)"""
  try:
    stats = [(st.st_mtime, st.st_size, e.path)
             for e in os.scandir(directory) if e.is_file()
             for st in [e.stat()]]
  except FileNotFoundError:
    return 0
  stats.sort()
  total = sum(size for _, size, _ in stats)
  if total <= max_bytes:
    return 0
  deleted = 0
  for _, size, path in stats:
    if total <= max_bytes // 2:
      break
    try:
      os.remove(path)
    except FileNotFoundError:  # another session pruned it
      pass
    total -= size
    deleted += 1
  return deleted
