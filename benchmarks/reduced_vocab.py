r"""What a reduced-vocabulary draft head does to the cost ratio c and to alpha.

  python -m benchmarks.reduced_vocab --draft_layers=2 --ks=2048,8192 \
      --batch=1 --gamma=4 --max_new_tokens=64

Target: GPT-2-124M-shaped (`gpt2-124m` preset, V = 50,257, random weights).
Drafts: its first `--draft_layers` blocks with the shared embeddings and head
(`self:N`), with the full head and with the head restricted to the K most
frequent tokens (`ReducedVocabLM`, q exactly 0 elsewhere). Frequencies are
counted on the target's own samples (temperature 1 and greedy) from
`--count_prompts` random prompts other than the ones timed.

Prints, per draft: c = draft forward (T=1) / target forward (T=1) at the
middle of the generation (specjax.harness.measure.pass_seconds), alpha_hat of a greedy
and a temperature-1 speculative run on fresh random prompts, and tokens per
target call. With random weights alpha says little about real text: a random
GPT-2's argmax mostly repeats the current token, which a K-token head cannot
propose unless it is among the K.
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax.harness import measure
from specjax.models import derived
from specjax.models import TransformerConfig
from specjax.models import TransformerLM
from specjax.models import vocab

_DRAFT_LAYERS = flags.DEFINE_integer("draft_layers", 2, "Draft blocks.")
_KS = flags.DEFINE_list("ks", ["2048", "8192"], "Reduced head sizes.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "New tokens per row.")
_COUNT_PROMPTS = flags.DEFINE_integer(
    "count_prompts", 16, "Prompts whose target samples give the frequencies.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  target = TransformerLM.create(TransformerConfig.preset("gpt2-124m"), 0)
  v, new = target.vocab_size, _MAX_NEW.value
  rng = np.random.default_rng(0)

  def prompts(n):
    return (rng.integers(0, v, (n, _PROMPT_LEN.value)).astype(np.int32),
            np.full((n,), _PROMPT_LEN.value, np.int32))

  # Frequencies: the target's own outputs (never the timed prompts).
  count_p, count_l = prompts(_COUNT_PROMPTS.value)
  seen = [np.asarray(sj.generate(target, count_p, count_l, jax.random.key(s),
                                 max_new_tokens=new, sampling=cfg).tokens)
          for s, cfg in enumerate((sj.GREEDY, sj.SamplingConfig(1.0)))]
  full = derived.truncate(target, _DRAFT_LAYERS.value)
  drafts = {f"self:{_DRAFT_LAYERS.value}, full head (K={v})": full}
  for k in (int(k) for k in _KS.value):
    keep = vocab.frequent_tokens(np.concatenate(seen), v, k)
    drafts[f"self:{_DRAFT_LAYERS.value}, K={k}"] = (
        vocab.ReducedVocabLM.create(full, keep))
  p, l = prompts(_BATCH.value)
  print(f"gpt2-124m random target, batch {_BATCH.value}, gamma {_GAMMA.value}"
        f", prompt {_PROMPT_LEN.value}, {new} new tokens")
  print(f"{'draft':32s} {'c':>6s} {'alpha greedy':>13s} {'alpha T=1':>10s} "
        f"{'tok/call T=1':>13s}")
  memo = {}
  for name, draft in drafts.items():
    context = _PROMPT_LEN.value + new // 2
    one_pass = lambda model: measure.pass_seconds(
        model, batch_size=_BATCH.value, num_tokens=1, capacity=context + 1,
        fill=context, memo=memo)
    c = one_pass(draft) / one_pass(target)
    alphas = []
    for cfg in (sj.GREEDY, sj.SamplingConfig(1.0)):
      out = sj.speculative_generate(target, draft, p, l, jax.random.key(7),
                                    gamma=_GAMMA.value, max_new_tokens=new,
                                    sampling=cfg)
      alphas.append(out.summary())
    print(f"{name:32s} {c:6.3f} {alphas[0]['alpha_hat']:13.3f} "
          f"{alphas[1]['alpha_hat']:10.3f} "
          f"{alphas[1]['tokens_per_target_call']:13.2f}")


if __name__ == "__main__":
  app.run(main)
