"""How fast this machine compiles right now: one line, a few seconds.

Most of the test suite's time is XLA tracing and compiling small programs,
and on the shared 2-core box that speed moved by a factor of two to three
within one day. `.ci/run` prints this line
before the tests, so a slow run can be told apart from a slow box: the
same fixed program is traced, lowered and compiled (at the suite's
settings, no compilation cache), run once and timed.

  python -m tools.box_speed       # from the repository's root

Prints one line: the seconds the program took and the machine's core count.
"""

import os
import time

# The suite's compile settings, set before jax loads.
from tests import compile_settings
compile_settings.apply()
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import specjax as sj  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  models = [sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=8, d_model=16, num_layers=1, num_heads=2, max_positions=32,
      flavour=flavour), seed) for seed, flavour in enumerate(("gpt2", "llama"))]
  prompts = np.tile(np.array([1, 2, 3], np.int32), (8, 1))
  lengths = np.full(8, 3, np.int32)
  start = time.perf_counter()
  out = sj.speculative_generate(*models, prompts, lengths, jax.random.key(0),
                                gamma=3, max_new_tokens=8)
  jax.block_until_ready(out.tokens)
  seconds = time.perf_counter() - start
  print(f"box speed: a whole-generation program (tiny models, gamma 3) "
        f"traced, compiled and run in {seconds:.1f} s on {os.cpu_count()} "
        "cores")


if __name__ == "__main__":
  main()
