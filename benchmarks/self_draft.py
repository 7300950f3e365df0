r"""Self-speculative drafts: alpha, c and measured speedup for every k.

  python benchmarks/self_draft.py \
      --target=quick --ks=0,1,2,3 --gamma=4 --temperature=0
  python benchmarks/self_draft.py --target=byte-85m --ks=0,1,2,4,6 --gamma=4

`--target=quick` is the quick main job's trained target-3m (from the zoo,
trained on first use); any `TransformerConfig` preset name (byte-85m) is an
independent model with RANDOM weights (the table says so).

For each k, `SelfDraft(target, layers=k)` runs in both cache modes:
own (a KV cache of k layers, prefilled) and shared (reads and writes the
target's first k layers; no prefill, no cache). Per row of the table:

* alpha: accepted / judged drafts over all prompts;
* c: draft forward (T = 1) / target forward (T = 1), timed as jitted loops of
  cached passes (`specjax.measure.pass_seconds`) at the generation's
  middle context length;
* speedup: `generate` time / `speculative_generate` time over the same
  prompts and keys, whole compiled calls, fastest of interleaved repeats,
  after compilation;
* draft cache MiB: memory the draft's own cache takes (0 when shared).

No second model is loaded: the drafts are pytree views of the target.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import data
from specjax import measure
from specjax import zoo
from specjax.models import TransformerConfig
from specjax.models import TransformerLM

_TARGET = flags.DEFINE_string(
    "target", "quick", "'quick' (the quick job's trained target-3m) or a "
    "TransformerConfig preset name (random weights).")
_KS = flags.DEFINE_list("ks", ["0", "1", "2", "3"], "Numbers of layers k.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per generate call.")
_PROMPTS = flags.DEFINE_integer("prompts", 4, "Held-out prompts (calls).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt length.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (median).")


def load_target(name: str) -> tuple[TransformerLM, str]:
  if name == "quick":
    from configs import reproduce  # pylint: disable=import-outside-toplevel
    config = reproduce.get_config("quick")
    model = zoo.load(config.target, overrides=dict(config.target_overrides))
    return model, f"quick job's trained {config.target}"
  model = TransformerLM.create(TransformerConfig.preset(name), 0)
  return model, f"{name} with RANDOM weights (untrained)"


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


def main(argv):
  del argv
  target, what = load_target(_TARGET.value)
  corpus = data.stdlib_corpus()
  heldout = corpus.tokens("heldout").astype(np.int32)
  n, b = _PROMPTS.value, _BATCH.value
  prompts = data.prompts(heldout, n * b, _PROMPT_LEN.value, 0).reshape(
      n, b, _PROMPT_LEN.value)
  lengths = np.full((b,), _PROMPT_LEN.value, np.int32)
  sampling = sj.SamplingConfig(temperature=_TEMPERATURE.value)
  gamma, new = _GAMMA.value, _NEW.value
  keys = [jax.random.key(i) for i in range(n)]
  buffer_len = sj.decode.prompt_bucket(_PROMPT_LEN.value) + new + gamma + 1
  context = _PROMPT_LEN.value + new // 2

  def baseline():
    return [sj.generate(target, p, lengths, k, max_new_tokens=new,
                        sampling=sampling) for p, k in zip(prompts, keys)]

  def speculative(draft):
    return lambda: [sj.speculative_generate(
        target, draft, p, lengths, k, gamma=gamma, max_new_tokens=new,
        sampling=sampling) for p, k in zip(prompts, keys)]

  one_pass = lambda model: measure.pass_seconds(
      model, batch_size=b, num_tokens=1, capacity=context + 1, fill=context)
  target_s = one_pass(target)
  print(f"target: {what}, {target.param_count():,} parameters, "
        f"{target.config.num_layers} layers; gamma={gamma}, T="
        f"{_TEMPERATURE.value}, batch {b}, {n} prompts of {_PROMPT_LEN.value}"
        f" + {new} new tokens; target step {target_s * 1e3:.2f} ms")
  print(f"{'k':>3} {'cache':>6} {'alpha':>6} {'c':>6} {'tok/pass':>8} "
        f"{'speedup':>8} {'draft cache MiB':>15}")
  for k in (int(x) for x in _KS.value):
    drafts = {"own": sj.SelfDraft(target, layers=k),
              "shared": sj.SelfDraft(target, layers=k, share_cache=True)}
    draft_s = one_pass(drafts["own"])
    fns = {"baseline": baseline,
           **{mode: speculative(d) for mode, d in drafts.items()}}
    times = _min_times(fns, _REPEATS.value)
    for mode, draft in drafts.items():
      results = fns[mode]()
      stats = [r.summary() for r in results]
      accepted = sum(s["accepted"] for s in stats)
      verified = sum(s["verified"] for s in stats)
      passes = sum(s["target_calls"] for s in stats)
      tokens = sum(s["generated_tokens"] for s in stats)
      mib = 0.0 if draft.share_cache else cache_bytes(
          draft.init_cache(b, buffer_len)) / 2**20
      print(f"{k:>3} {mode:>6} {accepted / max(verified, 1):6.3f} "
            f"{draft_s / target_s:6.3f} {tokens / passes:8.2f} "
            f"{times['baseline'] / times[mode]:8.3f} {mib:15.2f}", flush=True)
  print(f"(box shared with other jobs; {time.strftime('%H:%M UTC', time.gmtime())})")


if __name__ == "__main__":
  app.run(main)
