r"""Each part of a round timed alone and inside the real loop, side by side.

  python benchmarks/loop_ablation.py                      # quick models, T = 1
  python benchmarks/loop_ablation.py --draft=bigram --gammas=2,4 --trials=3

The cost model (`specjax.harness.measure.loop_costs`) times every pass ALONE, in a
jitted loop of passes on the decode loop's own shapes, and predicts a round as
draft + verify + other. This script checks that sum against the real loop,
part by part, by ablation: the same `speculative_generate` program run with
the draft, the target or both replaced by `measure.NullLM` (no layers, no
cache), so that

  draft in the loop  = round(null target, real draft) - other,
  verify in the loop = round(real target, null draft) - other,
  other              = round(null target, null draft),

each per loop round after the fixed call cost and the prefills. It prints,
per gamma and per trial (`--trials` re-measures everything, new processes
are not needed: the passes are re-timed, the programs are cached):

  real         seconds per round of the real loop,
  alone        the cost model's prediction (passes timed alone),
  in loop      the ablation's prediction (draft + verify + other in the loop),
  and each part, alone | in loop.

Every time is the fewest seconds of `--repeats` interleaved calls (see
`specjax.harness.measure`, "Noise"): the three loops of a row take turns call by
call (before 2026-12-04 each loop's calls ran as a block of their own). On
the 2-core CPU box this shows where the quick job's efficiency goes: the
target's few-token verify pass costs 0.5 ms in one measurement and 1.0-1.3
ms in another, by shape and by run, alone and in the loop alike, while the
draft's passes agree.
"""

from __future__ import annotations

import functools
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.decode import loop  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from specjax.harness import measure  # noqa: E402
from specjax.harness import sweep  # noqa: E402
from configs import reproduce  # noqa: E402

_DRAFT = flags.DEFINE_string("draft", "draft-0.1m",
                             "A draft of configs/reproduce.py:quick, by name.")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "2", "4", "8"], "Draft lengths.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens generated.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls per loop.")
_TRIALS = flags.DEFINE_integer("trials", 2, "Times the whole table is taken.")


def _per_round(loops, prompts, lengths, gamma, sampling):
  """Seconds per round of each loop: {name: (target, draft, fixed_s)}, the
  loops' calls interleaved (measure.best_times), so that a slow spell of
  the machine falls on all of them, not on one loop's block of calls."""
  calls = {name: functools.partial(
      loop.speculative_generate, target, draft, prompts, lengths,
      jax.random.key(0), gamma=gamma, max_new_tokens=_MAX_NEW.value,
      sampling=sampling) for name, (target, draft, _) in loops.items()}
  rounds = {name: int(np.asarray(call().stats.rounds).max())
            for name, call in calls.items()}
  seconds = measure.best_times(calls, _REPEATS.value)
  return {name: (seconds[name] - loops[name][2]) / rounds[name]
          for name in loops}


def main(argv):
  del argv
  config = reproduce.get_config("quick")
  config.drafts = [d for d in config.drafts if d.name == _DRAFT.value]
  if not config.drafts:
    raise app.UsageError(f"--draft={_DRAFT.value!r} is not a draft of the "
                         "quick config.")
  target, (draft,) = drafts_lib.load_models(config, corpus=data.stdlib_corpus())
  sampling = sj.SamplingConfig(temperature=_TEMPERATURE.value)
  plen = _PROMPT_LEN.value
  prompts = np.random.default_rng(0).integers(
      0, 256, size=(1, plen)).astype(np.int32)
  lengths = np.array([plen], np.int32)
  null_t, null_d = measure.NullLM.like(target), measure.NullLM.like(draft.model)
  ms = lambda s: f"{s * 1e3:6.3f}"
  print(f"target {config.target}, draft {draft.name}, T={_TEMPERATURE.value}, "
        f"batch 1, {plen} + {_MAX_NEW.value} tokens; ms per loop round "
        f"({sweep.device_description()})")
  print("trial gamma |   real  alone in loop |  draft:alone   loop | "
        "verify:alone   loop |  other")
  for trial in range(_TRIALS.value):
    for gamma in (int(g) for g in _GAMMAS.value):
      c = measure.loop_costs(
          target, draft.model, batch_size=1, prompt_len=plen,
          max_new_tokens=_MAX_NEW.value, gamma=gamma, sampling=sampling,
          seconds=0.05, repeats=5)
      prefills = c.target_prefill_s + c.draft_prefill_s
      per_round = _per_round({
          "real": (target, draft.model, c.call_s + prefills),
          "verify": (target, null_d, c.call_s + c.target_prefill_s),
          "draft": (null_t, draft.model, c.call_s + c.draft_prefill_s),
      }, prompts, lengths, gamma, sampling)
      real = per_round["real"]
      verify = per_round["verify"] - c.other_s
      drafting = per_round["draft"] - c.other_s
      print(f"{trial:5d} {gamma:5d} | {ms(real)} {ms(c.round_s)} "
            f"{ms(drafting + verify + c.other_s)} |      {ms(c.draft_s)} "
            f"{ms(drafting)} |       {ms(c.verify_s)} {ms(verify)} | "
            f"{ms(c.other_s)}", flush=True)


if __name__ == "__main__":
  app.run(main)
