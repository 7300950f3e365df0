r"""specjax vs Hugging Face transformers, same weights, greedy, side by side.

  pip install -e '.[reference]'     # torch (CPU wheel) + transformers
  python -m benchmarks.vs_transformers --draft_layers=2 --gamma=4 \
      --prompt_len=64 --max_new_tokens=128 --batches=1,8 --repeats=3

A GPT-2-124M-shaped target with random weights (transformers' own init,
seed 0) and a draft made of its first `--draft_layers` blocks plus the shared
embeddings, final norm and head are written with `save_pretrained` and loaded
by both libraries. One run times, per batch size (after one untimed warm-up
call each; the median of `--repeats` timed calls, the four interleaved):

* transformers greedy `generate(do_sample=False)`;
* transformers assisted generation (`assistant_model=`,
  `num_assistant_tokens=gamma`, constant schedule,
  `assistant_confidence_threshold=0`); it raises at batch > 1, and the error
  is recorded as the result;
* specjax `generate` and `speculative_generate` (GREEDY).

It prints tokens/s of each, the ratios, alpha of the speculative run, and
whether the four token streams are identical. EOS is disabled on both sides
so every row generates exactly `--max_new_tokens` tokens. The prompts are
random ids. Timings depend on the machine and its load; say which.
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax.models import hf

_DRAFT_LAYERS = flags.DEFINE_integer("draft_layers", 2,
                                     "Blocks of the target kept as the draft.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "New tokens per row.")
_BATCHES = flags.DEFINE_list("batches", ["1", "8"], "Batch sizes to run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per variant.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where the HF checkpoints go (default: a temp dir).")


def _save_checkpoints(root: pathlib.Path, draft_layers: int):
  """GPT-2-124M-shaped random target and its truncated draft, as HF dirs."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = transformers.GPT2Config()  # 124M: 12 x 768, V = 50257
  target = transformers.GPT2LMHeadModel(config).eval()
  draft_config = transformers.GPT2Config(n_layer=draft_layers)
  draft = transformers.GPT2LMHeadModel(draft_config).eval()
  # Same weights: every draft tensor is the target's of the same name (the
  # draft's blocks are the target's first ones).
  draft.load_state_dict({k: v for k, v in target.state_dict().items()
                         if k in draft.state_dict()})
  for model, name in ((target, "target"), (draft, "draft")):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(root / name, safe_serialization=True)
  return target, draft


def _median_times(calls: dict, repeats: int) -> dict:
  """Median seconds of each call, interleaved so load slows all alike."""
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, fn in calls.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def run_batch(batch: int, hf_target, hf_draft, target, draft) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  gamma, new = _GAMMA.value, _MAX_NEW.value
  rng = np.random.default_rng(batch)
  prompts = rng.integers(0, target.vocab_size, (batch, _PROMPT_LEN.value))
  lengths = np.full((batch,), _PROMPT_LEN.value, np.int32)
  ids = torch.tensor(prompts)
  mask = torch.ones_like(ids)
  common = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new,
                attention_mask=mask, pad_token_id=0, eos_token_id=None)
  key = jax.random.key(0)
  streams, results, last = {}, {}, {}

  def hf_greedy():
    with torch.no_grad():
      streams["transformers greedy"] = hf_target.generate(ids, **common)[
          :, -new:].numpy()

  def hf_assisted():
    with torch.no_grad():
      streams["transformers assisted"] = hf_target.generate(
          ids, assistant_model=hf_draft, num_assistant_tokens=gamma,
          num_assistant_tokens_schedule="constant",
          assistant_confidence_threshold=0.0, **common)[:, -new:].numpy()

  def sj_generate():
    out = sj.generate(target, prompts, lengths, key, max_new_tokens=new,
                      sampling=sj.GREEDY)
    streams["specjax generate"] = np.asarray(jax.block_until_ready(out.tokens))

  def sj_speculative():
    out = sj.speculative_generate(target, draft, prompts, lengths, key,
                                  gamma=gamma, max_new_tokens=new,
                                  sampling=sj.GREEDY)
    streams["specjax speculative"] = np.asarray(
        jax.block_until_ready(out.tokens))
    last["speculative"] = out  # summarised after the timing, not inside it

  calls = {"transformers greedy": hf_greedy,
           "transformers assisted": hf_assisted,
           "specjax generate": sj_generate,
           "specjax speculative": sj_speculative}
  for name, fn in list(calls.items()):  # warm-up: compile, allocate
    try:
      fn()
    except Exception as e:  # assisted generation refuses batch > 1
      results[name] = f"raises {type(e).__name__}: {str(e).splitlines()[0][:90]}"
      del calls[name]
  seconds = _median_times(calls, _REPEATS.value)
  for name, s in seconds.items():
    results[name] = batch * new / s
  results["alpha"] = last["speculative"].summary()["alpha_hat"]
  ref = streams["transformers greedy"]
  results["identical"] = {name: bool(np.array_equal(s, ref))
                          for name, s in streams.items()}
  return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(_WORKDIR.value or tempfile.mkdtemp(prefix="vs_hf_"))
  hf_target, hf_draft = _save_checkpoints(root, _DRAFT_LAYERS.value)
  target, _ = hf.load(root / "target")
  draft, _ = hf.load(root / "draft")
  print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}, jax {jax.__version__} "
        f"({jax.devices()[0].platform}); GPT-2-124M-shaped random target, "
        f"draft = its first {_DRAFT_LAYERS.value} blocks; prompt "
        f"{_PROMPT_LEN.value}, {_MAX_NEW.value} new tokens, greedy, gamma "
        f"{_GAMMA.value}; median of {_REPEATS.value}")
  for batch in (int(b) for b in _BATCHES.value):
    r = run_batch(batch, hf_target, hf_draft, target, draft)
    print(f"\nbatch {batch}                   tokens/s")
    for name in ("transformers greedy", "transformers assisted",
                 "specjax generate", "specjax speculative"):
      value = r[name]
      shown = f"{value:10.1f}" if isinstance(value, float) else f"  {value}"
      print(f"  {name:24s}{shown}")
    num = lambda k: r[k] if isinstance(r[k], float) else float("nan")
    print(f"  alpha (specjax speculative)         {r['alpha']:.3f}")
    print(f"  specjax speculative / transformers assisted  "
          f"{num('specjax speculative') / num('transformers assisted'):.2f}x")
    print(f"  specjax speculative / transformers greedy    "
          f"{num('specjax speculative') / num('transformers greedy'):.2f}x")
    print(f"  specjax generate / transformers greedy       "
          f"{num('specjax generate') / num('transformers greedy'):.2f}x")
    print(f"  token streams equal to transformers greedy: {r['identical']}")


if __name__ == "__main__":
  app.run(main)
