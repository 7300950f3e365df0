r"""Does the batch-1 cache write's copying cost time? Scatter against select.

  python benchmarks/cache_write.py [DRAFT] [NEW] [CYCLES]
      # defaults: distilled-draft-0.1m@target-3m 128 30

At batch 1, XLA CPU compiles `KVCache.write`'s one-token scatter into an
in-place dynamic-update-slice with two consumers: the carried cache, and
the attention, which reads the layer without its size-1 batch axis. It
computes the update twice and copies the whole `[1, K, S, H]` layer four
times a step (32 copies in `generate`'s loop body on the quick target; none
at batch 8). A select over the slots writes the same values without most of
them. This compiles the quick job's loop programs (`generate`, and
`speculative_generate` at gamma 4 and 8; one 64-byte held-out prompt, NEW
new bytes, T = 1) twice, with the library's write and with a select for a
one-row, one-token write, and times them in one process, each of CYCLES
cycles running every program once in a seeded random order. Prints per
program the median ms of each, their ratio, the whole-layer copies in each
compiled program, and whether both wrote the same tokens.
"""

import os
import random
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from absl import flags  # noqa: E402
import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.decode import loop  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from specjax.models import cache as cache_lib  # noqa: E402
from configs import reproduce  # noqa: E402

SCATTER = cache_lib.KVCache.write


def select_write(self, layer, k_BxTxKxH, v_BxTxKxH, positions_BxT):
  """`KVCache.write`, selecting the slot where one row writes one token
  (the same values; a position past the end is dropped alike)."""
  if positions_BxT.shape != (1, 1):
    return SCATTER(self, layer, k_BxTxKxH, v_BxTxKxH, positions_BxT)

  def put(layers, new_BxTxKxH):
    cache_BxKxSxH = layers[layer]
    new_BxKxTxH = new_BxTxKxH.transpose(0, 2, 1, 3).astype(cache_BxKxSxH.dtype)
    hit_S = jnp.arange(cache_BxKxSxH.shape[2]) == positions_BxT[0, 0]
    updated = jnp.where(hit_S[None, None, :, None], new_BxKxTxH,
                        cache_BxKxSxH)
    return layers[:layer] + (updated,) + layers[layer + 1:]
  return self.replace(k=put(self.k, k_BxTxKxH), v=put(self.v, v_BxTxKxH))


def compile_calls(target, draft, prompts, lengths, new):
  """{name: (call, copies)}: the loop programs of `generate` and gamma 4, 8,
  compiled with `KVCache.write` as it is when called, and their counts of
  whole-layer copies."""
  programs = {}
  generate = loop._generate  # pylint: disable=protected-access
  for name, gamma in (("generate", None), ("gamma 4", 4), ("gamma 8", 8)):
    captured = {}

    def spy(*args, captured=captured, **kwargs):
      captured["call"] = (args, kwargs)
      return generate(*args, **kwargs)
    loop._generate = spy  # pylint: disable=protected-access
    try:
      if gamma is None:
        sj.generate(target, prompts, lengths, jax.random.key(0),
                    max_new_tokens=new)
      else:
        sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(0), gamma=gamma,
                                max_new_tokens=new)
    finally:
      loop._generate = generate  # pylint: disable=protected-access
    args, kwargs = captured["call"]
    compiled = generate.lower(*args, **kwargs).compile()
    copies = len(re.findall(r"= f32\[1,\d+,\d+,\d+\]\{3,2,1,0\} copy\(",
                            compiled.as_text()))
    # A compiled program takes the traced arguments alone.
    traced = {k: v for k, v in kwargs.items() if k == "draft_length_values"}
    programs[name] = (lambda c=compiled, a=args, t=traced: c(*a, **t),
                      copies)
  return programs


def main(argv):
  name = argv[1] if len(argv) > 1 else "distilled-draft-0.1m@target-3m"
  new = int(argv[2]) if len(argv) > 2 else 128
  cycles = int(argv[3]) if len(argv) > 3 else 30
  flags.FLAGS(argv[:1])  # the experiment's loaders read its flags
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  draft = drafts_lib.make_draft(name, target,
                                config=reproduce.get_config("quick")).model
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, 1, 64, seed=0)
  lengths = np.full((1,), 64, np.int32)
  scatter = compile_calls(target, draft, prompts, lengths, new)
  cache_lib.KVCache.write = select_write
  jax.clear_caches()
  try:
    select = compile_calls(target, draft, prompts, lengths, new)
  finally:
    cache_lib.KVCache.write = SCATTER
  programs = {(program, label): entry
              for label, group in (("scatter", scatter), ("select", select))
              for program, entry in group.items()}
  tokens = {key: np.asarray(call().tokens)
            for key, (call, _) in programs.items()}
  seconds = {key: [] for key in programs}
  rng = random.Random(0)
  for _ in range(cycles):
    for key in rng.sample(list(programs), len(programs)):
      call = programs[key][0]
      start = time.perf_counter()
      jax.block_until_ready(call().tokens)
      seconds[key].append(time.perf_counter() - start)
  print(f"{name}, batch 1, 64 + {new} tokens, T = 1, {cycles} cycles: "
        "median ms per call (whole-layer copies in the compiled program)")
  for program in scatter:
    ms = {w: 1e3 * statistics.median(seconds[program, w])
          for w in ("scatter", "select")}
    same = np.array_equal(tokens[program, "scatter"],
                          tokens[program, "select"])
    print(f"  {program:9s} scatter {ms['scatter']:6.2f} "
          f"({programs[program, 'scatter'][1]:2d}), select "
          f"{ms['select']:6.2f} ({programs[program, 'select'][1]:2d}), "
          f"select / scatter {ms['select'] / ms['scatter']:.3f}, "
          f"same tokens: {same}")


if __name__ == "__main__":
  main(sys.argv)
