"""The absl entry points: `python -m experiments.<name>`, each reading its
config (configs/<name>.py) or flags, calling the library and writing results.

Every entry point imports this package first. absl's `app.run` sets the
root logger to INFO, so JAX's note of each accelerator it probes and does
not find ("Unable to initialize backend 'tpu'", an INFO record of
jax._src.xla_bridge) printed at the start of every CPU run. That one logger
is raised to WARNING here, before any backend starts: its warnings, and
every other logger's records, still print.
"""

import logging

logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
