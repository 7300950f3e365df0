r"""Self-speculative drafts: alpha, c and measured speedup for every k.

One command, both targets (about 5 min on 2 idle cores once the quick
target and its adapters are in the zoo):

  python -m benchmarks.self_draft --gamma=4 --temperature=0 \
      --prompts=2 --max_new_tokens=48 --random_ks=0,1,2,4,6,8,10

Targets: `--quick` (default on) is the quick main job's trained target-3m
(from the zoo, trained on first use), run for every k in 0..L-1 without and,
for k >= 1, with its trained exit adapter (`exit-adapter-<k>@target-3m`
from the zoo, trained on first use: a few minutes each); `--random_target`
(default byte-85m, '' to skip) is a `TransformerConfig` preset with RANDOM
weights (every row says so), for the ks in `--random_ks` ('all' = 0..L-1).

Each draft is `SelfDraft(target, layers=k, share_cache=True[, adapter=])`:
a view of the target's arrays that reads and writes the target's first k
cache layers. No second model is loaded. Per row:

* alpha: accepted / judged drafts over all prompts, with a 95% interval
  (1.96 binomial standard errors; drafts of one round are not independent,
  so read it as approximate);
* c: the draft's 1-token pass / the target's 1-token pass, each timed on the
  loop's own shapes (`specjax.harness.measure.loop_costs`: cache capacity, fill,
  batch), which also gives `predicted`, the end-to-end speedup the cost
  model predicts at this alpha (`measure.predict`);
* speedup: `generate` time / `speculative_generate` time over the same
  prompts and keys, whole compiled calls, fastest of interleaved repeats;
* cache saved MiB: the KV cache a k-layer draft with its own cache would
  hold at this shape, which sharing the target's saves.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import data
from specjax import stats as stats_lib
from specjax.harness import drafts as drafts_lib
from specjax.harness import measure
from specjax.models import TransformerConfig
from specjax.models import TransformerLM

_QUICK = flags.DEFINE_bool("quick", True, "Run the quick job's trained "
                           "target-3m, with and without exit adapters.")
_QUICK_KS = flags.DEFINE_list("quick_ks", ["all"], "ks for the quick target "
                              "('all' = 0..L-1).")
_RANDOM = flags.DEFINE_string("random_target", "byte-85m", "A "
                              "TransformerConfig preset with random weights "
                              "('' to skip).")
_RANDOM_KS = flags.DEFINE_list("random_ks", ["all"], "ks for the random "
                               "target ('all' = 0..L-1).")
_ADAPTERS = flags.DEFINE_bool("adapters", True, "Also run the quick target's "
                              "ks >= 1 with their trained exit adapters.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.",
                              lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per generate call.",
                              lower_bound=1)
_PROMPTS = flags.DEFINE_integer("prompts", 2, "Held-out prompts (calls).",
                                lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt length.",
                                   lower_bound=1)
_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Tokens per row.",
                            lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (fastest).",
                                lower_bound=1)


def _quick_config():
  from configs import reproduce  # pylint: disable=import-outside-toplevel
  return reproduce.get_config("quick")


def _min_times(fns, repeats):
  """Fastest of `repeats` interleaved calls each, after a warm-up call.

  The minimum, not the median: on a machine shared with other jobs the
  noise only ever adds time, so the fastest run is the best estimate.
  """
  for fn in fns.values():
    jax.block_until_ready(fn())
  best = {name: float("inf") for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def cache_bytes(cache) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))


def _ks(spec: list[str], num_layers: int) -> list[int]:
  if spec == ["all"]:
    return list(range(num_layers))
  ks = [int(k) for k in spec]
  bad = [k for k in ks if not 0 <= k < num_layers]
  if bad:
    raise ValueError(f"ks {bad} are outside 0..{num_layers - 1} for a "
                     f"{num_layers}-layer target.")
  return ks


def run_target(target: TransformerLM, what: str, specs, prompts_NxBxP,
               config=None):
  """Prints one row per draft spec ("self:k" or "self:k+adapter"; `config`
  names the zoo target whose adapters these are)."""
  n, b, width = prompts_NxBxP.shape
  lengths = np.full((b,), width, np.int32)
  sampling = sj.SamplingConfig(temperature=_TEMPERATURE.value)
  gamma, new = _GAMMA.value, _NEW.value
  keys = [jax.random.key(i) for i in range(n)]
  capacity = measure.LoopShape(b, width, new, gamma).capacity(target)
  memo: dict = {}

  def baseline():
    return [sj.generate(target, p, lengths, k, max_new_tokens=new,
                        sampling=sampling) for p, k in zip(prompts_NxBxP, keys)]

  def speculative(draft):
    return lambda: [sj.speculative_generate(
        target, draft, p, lengths, k, gamma=gamma, max_new_tokens=new,
        sampling=sampling) for p, k in zip(prompts_NxBxP, keys)]

  print(f"\ntarget: {what}, {target.param_count():,} parameters, "
        f"{target.config.num_layers} layers; gamma={gamma}, T="
        f"{_TEMPERATURE.value}, batch {b}, {n} prompts of {width} + {new} "
        "new tokens; every draft shares the target's cache")
  print(f"{'k':>3} {'adapter':>7} {'alpha':>6} {'95% interval':>15} "
        f"{'c':>6} {'predicted':>9} {'speedup':>8} {'cache saved MiB':>15}")
  for spec in specs:
    draft = drafts_lib.make_draft(spec, target, config=config).model
    k, adapter = len(draft.layers), draft.adapter
    costs = measure.loop_costs(target, draft, batch_size=b, prompt_len=width,
                               max_new_tokens=new, gamma=gamma,
                               sampling=sampling, seconds=0.05, repeats=3,
                               memo=memo)
    fns = {"baseline": baseline, "speculative": speculative(draft)}
    times = _min_times(fns, _REPEATS.value)
    summary = stats_lib.summarize(fns["speculative"]())
    alpha, se = summary["alpha_hat"], summary["alpha_se"]
    predicted = measure.predict(costs, alpha)["speedup"]
    saved = cache_bytes(sj.SelfDraft(target, layers=k).init_cache(
        b, capacity)) / 2**20
    low, high = max(alpha - 1.96 * se, 0.0), min(alpha + 1.96 * se, 1.0)
    interval = f"[{low:.3f}, {high:.3f}]"
    print(f"{k:>3} {'yes' if adapter is not None else 'no':>7} {alpha:6.3f} "
          f"{interval:>15} {costs.c:6.3f} {predicted:9.3f} "
          f"{times['baseline'] / times['speculative']:8.3f} {saved:15.2f}",
          flush=True)


def main(argv):
  del argv
  start = time.time()
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  n, b, width = _PROMPTS.value, _BATCH.value, _PROMPT_LEN.value
  prompts = data.prompts(heldout, n * b, width, 0).reshape(n, b, width)
  if _QUICK.value:
    config = _quick_config()
    target = drafts_lib.load_target(config)
    ks = _ks(_QUICK_KS.value, target.config.num_layers)
    specs = [f"self:{k}" for k in ks]
    if _ADAPTERS.value:
      specs += [f"self:{k}+adapter" for k in ks if k >= 1]
    run_target(target, f"quick job's trained {config.target}", specs,
               prompts, config)
  if _RANDOM.value:
    target = TransformerLM.create(TransformerConfig.preset(_RANDOM.value), 0)
    ks = _ks(_RANDOM_KS.value, target.config.num_layers)
    run_target(target, f"{_RANDOM.value} with RANDOM weights (untrained): "
               "its alpha says nothing about a trained model",
               [f"self:{k}" for k in ks], prompts)
  print(f"\n({time.time() - start:.0f} s; "
        f"{time.strftime('%H:%M UTC', time.gmtime())}; timings from a box "
        "shared with other jobs are noise)")


if __name__ == "__main__":
  app.run(main)
