r"""What a draft tree's size costs the compile, and a compiled call.

  python -m benchmarks.tree_compile                 # the default trees
  python -m benchmarks.tree_compile tree:8,8 tree-wor:64 ...

A tree round is traced level by level: the draft proposes each level's
children in one step, and the verifier's walk, unrolled, runs one step per
(depth, child slot), so the program and its compile grow with the tree's
fan-out unless the walk is looped. For each verifier string this prints
the tree's nodes, internal nodes, depth and widest fan-out, then the first
`speculative_generate` call (trace + compile + run) and the fastest of
three compiled calls: at T = 1 as the library runs it (a node of more than
`tree._UNROLL_CHILDREN` = 8 children has them judged in a loop), at T = 1
with every node's children unrolled (the walk before that loop), and
greedy (the greedy walk is its own code). Two bigram models over a 64-token
vocabulary (no `max_positions`, so no positional bound applies), batch 2,
16 new tokens.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

import specjax as sj
from specjax.decode import tree as tree_lib
from specjax.models.ngram import NGramLM

_DEFAULT = ("tree:2,2", "tree:4,4", "tree:8,8", "tree:16,16", "tree:16",
            "tree:64", "tree:128", "tree-wor:32", "tree:2,2,2,2,2,2")
_V = 64


def _models():
  rng = np.random.default_rng(0)
  text = rng.integers(0, _V, 4096)
  noisy = np.where(rng.random(4096) < 0.3, rng.integers(0, _V, 4096), text)
  return NGramLM.fit(text, _V), NGramLM.fit(noisy, _V)


def main(specs):
  target, draft = _models()
  prompts = np.tile(np.arange(8, dtype=np.int32), (2, 1))
  lengths = np.array([8, 5], np.int32)
  print(f"{'':<48}{'T = 1':>25}{'T = 1, unrolled':>25}{'greedy':>25}")
  print(f"{'verifier':<18}{'nodes':>7}{'internal':>9}{'depth':>6}"
        f"{'fan-out':>8}" + f"{'first call s':>13}{'compiled ms':>12}" * 3)
  loop_from = tree_lib._UNROLL_CHILDREN
  for spec in specs:
    topology = sj.get_verifier(spec).topology
    internal = sum(1 for u in range(-1, topology.num_nodes)
                   if topology.children(u))
    row = (f"{spec:<18}{topology.num_nodes:>7}{internal:>9}"
           f"{topology.max_depth:>6}{topology.max_children:>8}")
    for sampling, unroll in ((sj.SamplingConfig(temperature=1.0), loop_from),
                             (sj.SamplingConfig(temperature=1.0), 1 << 30),
                             (sj.GREEDY, loop_from)):
      tree_lib._UNROLL_CHILDREN = unroll
      call = lambda key: jax.block_until_ready(sj.speculative_generate(
          target, draft, prompts, lengths, jax.random.key(key),
          max_new_tokens=16, sampling=sampling, verifier=spec).tokens)
      start = time.perf_counter()
      call(0)
      first = time.perf_counter() - start
      best = np.inf
      for key in (1, 2, 3):
        start = time.perf_counter()
        call(key)
        best = min(best, time.perf_counter() - start)
      row += f"{first:>13.1f}{best * 1e3:>12.1f}"
      jax.clear_caches()
    tree_lib._UNROLL_CHILDREN = loop_from
    print(row, flush=True)


if __name__ == "__main__":
  main(tuple(sys.argv[1:]) or _DEFAULT)
