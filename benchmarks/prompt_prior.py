r"""Does a prompt, teacher-forced, tell a row's acceptance? Counts, no timer.

  python benchmarks/prompt_prior.py [DRAFTS] [CALLS] [SAMPLES]
      # default: distilled-draft-0.1m@target-3m,bigram 16 3

`Goodput.prompt_prior` starts each row's acceptance estimate from its own
prompt: sum_x min(p, q) at the prompt's last positions, scored from both
models' prefills (`specjax.decode.loop._prefill`, `_prompt_overlap`).
This checks the premise on the quick job's target-3m: for each of CALLS
held-out prompts of 64 bytes (the ones `experiments.adaptive_gamma` times
at batch 1), the prompt's mean overlap over its last 16 positions (the
default rule's `prompt_window`, what the loop scores) and over all 63,
beside the acceptance the row then has generating 128 bytes at gamma 8
(SAMPLES samples at T = 1, one greedy), for each draft (comma-separated,
named as `experiments.adaptive_gamma --drafts` names them).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from absl import flags  # noqa: E402
import specjax as sj  # noqa: E402
from specjax.decode import draft_length  # noqa: E402
from specjax.decode import loop  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from experiments import adaptive_gamma  # noqa: E402
from configs import reproduce  # noqa: E402


def main():
  drafts = (sys.argv[1] if len(sys.argv) > 1
            else "distilled-draft-0.1m@target-3m,bigram").split(",")
  calls = int(sys.argv[2]) if len(sys.argv) > 2 else 16
  samples = int(sys.argv[3]) if len(sys.argv) > 3 else 3
  flags.FLAGS(sys.argv[:1])  # the experiment's loaders read its flags
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  prompts_NxP = adaptive_gamma.held_out_calls(calls, 1, 64)[1:, 0]
  lengths_N = jnp.full((calls,), 64, jnp.int32)
  one = np.full((1,), 64, np.int32)
  for name in drafts:
    draft = drafts_lib.make_draft(name, target,
                                  config=reproduce.get_config("quick")).model
    for temperature in (1.0, 0.0):
      sampling = sj.SamplingConfig(temperature=temperature)
      tokens_NxP = jnp.asarray(prompts_NxP)
      prompt_N = {}  # window -> each prompt's mean overlap there
      for window in (draft_length.Goodput(c=0.0, r=(1.0,)).prompt_window, 63):
        at_NxK, scored_NxK = loop._prompt_window(lengths_N, 64, window)
        logits = lambda m, a=at_NxK: loop._prefill(m, tokens_NxP, 64,
                                                   lengths_N, a)[1]
        scored_N, overlap_N = loop._prompt_overlap(
            logits(target), logits(draft), scored_NxK, draft, sampling)
        prompt_N[window] = np.asarray(overlap_N) / np.asarray(scored_N)
      generated_N = []
      for i, prompt_P in enumerate(prompts_NxP):
        kept = judged = 0
        for s in range(samples if temperature else 1):
          out = sj.speculative_generate(
              target, draft, prompt_P[None], one,
              jax.random.fold_in(jax.random.key(i), s), gamma=8,
              max_new_tokens=128, sampling=sampling).summary()
          kept, judged = kept + out["accepted"], judged + out["verified"]
        generated_N.append(kept / max(judged, 1))
      generated_N = np.array(generated_N)
      print(f"{name}, T={temperature:g}: generating {generated_N.mean():.3f}")
      for window, mean_N in prompt_N.items():
        print(f"  prompt's last {window}: {mean_N.mean():.3f} (correlation "
              f"over prompts {np.corrcoef(mean_N, generated_N)[0, 1]:.2f})")
      for label, x_N in ([(f"last {w}", x) for w, x in prompt_N.items()]
                         + [("generating", generated_N)]):
        print(f"  {label:10s} " + " ".join(f"{x:.2f}" for x in x_N))


if __name__ == "__main__":
  main()
