r"""What a new draft-length rule costs a call: a compile, or none.

  python benchmarks/rule_compile.py [DRAFT]   # distilled-draft-0.1m@target-3m

On the quick job's models (cached by `python -m experiments.reproduce`;
DRAFT may also be self:1 or self:2), one 64-token prompt, 96 new tokens,
default compile settings. Times `speculative_generate` calls, each from the
call to the tokens on the host: a `Goodput` rule (gamma_max 8, with probe
rounds), the same rule again (the compiled loop cached), the rule with
another acceptance prior and other costs (as `warm_start` and fresh
measurements give), one with another structure (no probe rounds), and
gamma 8. A rule's numbers are traced values of the loop (its
`traced_fields`), so only a change of structure compiles.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import specjax as sj  # noqa: E402
from specjax.decode import draft_length  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from configs import reproduce  # noqa: E402


def main(argv):
  draft_name = argv[1] if len(argv) > 1 else "distilled-draft-0.1m@target-3m"
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  draft = drafts_lib.make_draft(draft_name, target,
                                config=reproduce.get_config("quick")).model
  prompts = np.random.default_rng(0).integers(0, 256, (1, 64)).astype(np.int32)
  lengths = np.array([64], np.int32)
  rule = draft_length.Goodput(c=0.1, r=tuple(1.0 + 0.1 * g for g in range(8)),
                              probe=1.3)
  calls = [
      ("Goodput, first call", rule),
      ("the same rule again", rule),
      ("another prior and costs", dataclasses.replace(
          rule, prior=(9.0, 1.0), c=0.2, r=tuple(1.0 + 0.2 * g
                                                 for g in range(8)))),
      ("another structure (no probe)", dataclasses.replace(rule, probe=None)),
      ("gamma 8, first call", 8),
  ]
  print(f"quick target, draft {draft_name}, batch 1, 64 + 96 tokens, "
        f"{os.cpu_count()} cores")
  # The process's one-time start-up (backend, first dispatch, the models'
  # arrays on device) is paid here, by an unrelated loop, not by whichever
  # call below comes first.
  jax.block_until_ready(sj.generate(target, prompts, lengths,
                                    jax.random.key(0), max_new_tokens=2).tokens)
  for name, gamma in calls:
    start = time.perf_counter()
    out = sj.speculative_generate(target, draft, prompts, lengths,
                                  jax.random.key(0), gamma=gamma,
                                  max_new_tokens=96)
    jax.block_until_ready(out.tokens)
    print(f"  {name:30s} {time.perf_counter() - start:7.2f} s")


if __name__ == "__main__":
  main(sys.argv)
