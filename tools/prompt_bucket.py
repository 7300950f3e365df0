"""What the prompt-bucket floor costs a huge batch of very short prompts.

    python -m tools.prompt_bucket [ROWS] [PROMPT_LEN]

The loop pads prompts to a power of two of at least
`specjax.decode.loop.MIN_PROMPT_BUCKET` (16) positions, so short prompts of
any length share one compiled program. A statistical check or a lab sweep
runs 10^4-10^5 rows of a few tokens each, and there every padded position is
prefilled and attended to. This times one whole sampled generation (ROWS,
default 100000, of PROMPT_LEN, default 3, tokens; a 2-block Llama target
and its first block as a cache-sharing `SelfDraft`, gamma 2, 3 new tokens,
XLA's default optimizations) with the floor at 16 and at 1, alternately,
after one compiling call each, and prints the times and their ratio.
"""

import sys
import time

import jax
import numpy as np

import specjax as sj
from specjax.decode import loop


def _timed_call(target, draft, prompts, lengths, seed):
  start = time.perf_counter()
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(seed), gamma=2,
                                max_new_tokens=3,
                                sampling=sj.SamplingConfig(temperature=1.0))
  jax.block_until_ready(out.tokens)
  return time.perf_counter() - start


def main(argv):
  rows = int(argv[1]) if len(argv) > 1 else 100_000
  prompt_len = int(argv[2]) if len(argv) > 2 else 3
  target = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=8, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
      max_positions=64, flavour="llama"), 0)
  draft = sj.SelfDraft(target, layers=1, share_cache=True)
  prompts = np.tile(np.arange(1, prompt_len + 1, dtype=np.int32) % 8,
                    (rows, 1))
  lengths = np.full(rows, prompt_len, np.int32)
  floors = (loop.MIN_PROMPT_BUCKET, 1)
  seconds = {f: [] for f in floors}
  widths = {}
  for repeat in range(3):  # the first call of each floor compiles
    for floor in floors:
      loop.MIN_PROMPT_BUCKET = floor
      widths[floor] = loop.prompt_bucket(prompt_len)
      t = _timed_call(target, draft, prompts, lengths, repeat)
      if repeat:
        seconds[floor].append(t)
  best = {f: min(s) for f, s in seconds.items()}
  for floor in floors:
    print(f"floor {floor:2d}, prompts padded to {widths[floor]:2d}: "
          f"{best[floor]:.2f} s (best of {len(seconds[floor])})")
  print(f"{rows} rows of {prompt_len}-token prompts: floor {floors[0]} takes "
        f"{best[floors[0]] / best[1]:.2f}x the time of floor 1")


if __name__ == "__main__":
  main(sys.argv)
