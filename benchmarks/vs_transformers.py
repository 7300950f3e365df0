r"""specjax vs Hugging Face transformers, same weights, greedy, side by side.

  pip install -e '.[reference]'     # torch (CPU wheel) + transformers
  python -m benchmarks.vs_transformers --batches=1,8 --repeats=3

A GPT-2-124M-shaped target with random weights (transformers' own init,
seed 0) and a draft made of its first `--draft_layers` blocks plus the shared
embeddings, final norm and head are written with `save_pretrained` and loaded
by both libraries. Per batch size it runs four variants:

* transformers greedy `generate(do_sample=False)`;
* transformers assisted generation (`assistant_model=`). transformers reads
  the draft length only from the ASSISTANT's `generation_config`
  (`AssistedCandidateGenerator`); `generate()` keyword arguments of the same
  names do not reach it. So the draft model's config is set to
  `num_assistant_tokens=gamma`, `num_assistant_tokens_schedule="constant"`
  and `assistant_confidence_threshold=0.0` (its default, 0.4, stops a draft
  early whenever the draft's top probability is below it). It raises at
  batch > 1, and the error is recorded as the result;
* specjax `generate` and `speculative_generate` (GREEDY).

What is measured:

* Forward passes, in the first (untimed, warm-up) call of each variant. For
  transformers, a forward pre-hook on the target and on the draft module
  counts every call of their `forward`; for specjax, the result's own
  counters (`RowStats`: passes after the prefill, plus one prefill pass of
  each model). The batch's passes are printed (every row rides along in each
  batched pass). transformers folds the prompt into its first pass; specjax
  runs a separate prefill that emits no token, so "tokens per target call"
  is tokens per row over the passes that emit tokens (transformers: all of
  them; specjax: those after the prefill, `stats.summarize`'s
  `tokens_per_target_call`).
* The configuration check. Per assisted round, the draft passes between two
  target passes are the tokens drafted; every round must draft gamma except
  a final run of rounds that transformers caps at the remaining budget
  minus one. And at greedy, with identical weights, both libraries' drafts
  propose the same tokens, which the target accepts up to the same point,
  so transformers assisted must make as many target passes as specjax
  speculative makes rounds, within a small tolerance for floating-point
  near-ties (torch and XLA can break an argmax tie of the draft differently
  without changing the output). Either check failing raises.
* Throughput: tokens/s of each variant, the median of `--repeats` timed
  calls after the warm-up, the four variants interleaved; the ratios; alpha
  of the speculative run; whether the four token streams are identical.
  Another busy process slows torch's CPU threads far more than XLA's, so
  time on a quiet host (the load average is printed at both ends).
* The host: CPU model and a read bandwidth (a jitted `jnp.sum` over a
  `--read_mb` float32 array, best of 5 calls, bytes per second), printed as
  a header, since both libraries' decoding speed follows it.

EOS is disabled on both sides so every row generates exactly
`--max_new_tokens` tokens. The prompts are random ids. The printout and
`--results_dir`/vs_transformers.json (metadata and rows) hold every number.
Timings depend on the machine and its load; say which.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import stats
from specjax.harness import roofline
from specjax.models import hf

_DRAFT_LAYERS = flags.DEFINE_integer("draft_layers", 2,
                                     "Blocks of the target kept as the draft.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "New tokens per row.")
_BATCHES = flags.DEFINE_list("batches", ["1", "8"], "Batch sizes to run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per variant.")
_READ_MB = flags.DEFINE_integer(
    "read_mb", 512, "Size of the float32 array the read bandwidth sums.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where the HF checkpoints go (default: a temp dir).")
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", "results/vs_transformers",
    "Where vs_transformers.json goes ('' writes nothing).")

VARIANTS = ("transformers greedy", "transformers assisted", "specjax generate",
            "specjax speculative")


def _read_bandwidth(megabytes: int, calls: int = 5) -> float:
  """Bytes/s of a jitted jnp.sum over a float32 array: best of `calls`."""
  read, read_bytes = roofline.read_probe(megabytes)
  best = float("inf")
  for _ in range(calls):
    start = time.perf_counter()
    read().block_until_ready()
    best = min(best, time.perf_counter() - start)
  return read_bytes / best


def _versions() -> dict:
  names = ("torch", "transformers", "jax", "jaxlib", "flax", "numpy")
  out = {"python": platform.python_version()}
  for name in names:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


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


def _configure_assistant(hf_draft, gamma: int) -> None:
  """gamma draft tokens every round, as transformers reads them.

  transformers' `AssistedCandidateGenerator` takes the draft length, its
  schedule and the confidence threshold from the assistant model's
  `generation_config` only (arguments of these names given to the target's
  `generate()` do not reach it). A threshold of 0 disables the confidence
  stopping criterion; a constant schedule keeps gamma from round to round.
  """
  config = hf_draft.generation_config
  config.num_assistant_tokens = gamma
  config.num_assistant_tokens_schedule = "constant"
  config.assistant_confidence_threshold = 0.0


@contextlib.contextmanager
def _count_passes(target, draft=None):
  """Counts forward calls of torch modules while the block runs.

  Yields a dict: `target` and `draft` pass counts, and `drafts_per_round`,
  the draft passes made since the previous target pass, recorded at each
  target pass (for assisted generation: the tokens each round drafted).
  """
  counts = {"target": 0, "draft": 0, "drafts_per_round": []}
  since = [0]

  def on_target(module, args):
    del module, args
    counts["target"] += 1
    counts["drafts_per_round"].append(since[0])
    since[0] = 0

  def on_draft(module, args):
    del module, args
    counts["draft"] += 1
    since[0] += 1

  handles = [target.register_forward_pre_hook(on_target)]
  if draft is not None:
    handles.append(draft.register_forward_pre_hook(on_draft))
  try:
    yield counts
  finally:
    for handle in handles:
      handle.remove()


def _specjax_passes(out, has_draft: bool) -> dict:
  """The batch's forward passes of a specjax result, from its counters."""
  summary = stats.summarize(out)
  row_stats = jax.tree.map(np.asarray, out.stats)
  # One prefill pass per model, then the loop's batched passes: a row's
  # counters run while it is active, so the longest row's are the batch's.
  target_passes = 1 + int(row_stats.target_calls.max())
  draft_passes = 1 + int(row_stats.draft_calls.max()) if has_draft else 0
  passes = {"target_passes": target_passes, "draft_passes": draft_passes,
            "tokens_per_target_call": summary["tokens_per_target_call"],
            "rounds": int(row_stats.rounds.max())}
  if has_draft:
    passes["alpha"] = summary["alpha_hat"]
  return passes


def _check_assisted(hf_counts: dict, sj_counts: dict, gamma: int) -> None:
  """Raises unless transformers assisted drafted gamma tokens per round.

  Two checks. Each round drafts gamma tokens, except a final run of rounds
  that transformers caps at the remaining budget minus one (the budget only
  shrinks, so once capped a round stays capped, and at most gamma rounds
  can be capped). And its target passes (its rounds) equal specjax's rounds
  within max(1, 5%): at greedy the same weights give the same drafts and the
  same accepted prefixes on both sides; only a floating-point near-tie in
  the draft's argmax, which torch and XLA may break differently without
  changing the output, can move a round.
  """
  drafts = hf_counts["drafts_per_round"]
  short = [i for i, d in enumerate(drafts) if d != gamma]
  tail_ok = (not short or (short == list(range(short[0], len(drafts)))
                           and len(short) <= gamma
                           and all(drafts[i] < gamma for i in short)))
  if not tail_ok:
    raise RuntimeError(
        f"transformers assisted drafted {drafts} tokens per round; gamma = "
        f"{gamma} was expected in every round but a final few capped at the "
        "budget. The assistant is misconfigured: transformers reads "
        "num_assistant_tokens, num_assistant_tokens_schedule and "
        "assistant_confidence_threshold from the assistant model's "
        "generation_config only.")
  hf_rounds, sj_rounds = hf_counts["target_passes"], sj_counts["rounds"]
  tolerance = max(1, round(0.05 * sj_rounds))
  print(f"  rounds: transformers assisted {hf_rounds} target passes, specjax "
        f"speculative {sj_rounds} (+1 prefill); tolerance {tolerance}",
        flush=True)
  if abs(hf_rounds - sj_rounds) > tolerance:
    raise RuntimeError(
        f"transformers assisted made {hf_rounds} target passes, specjax "
        f"speculative {sj_rounds} rounds, beyond the tolerance of "
        f"{tolerance}: at greedy with identical weights both should accept "
        "the same drafts. Check the assistant's generation_config.")


def _timed_calls(calls: dict, repeats: int) -> dict:
  """Seconds of each of `repeats` calls of each variant, interleaved."""
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, fn in calls.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return times


def run_batch(batch: int, hf_target, hf_draft, target, draft) -> dict:
  """One batch size: passes, the configuration check, then the timing."""
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
  streams, outs = {}, {}

  def hf_greedy():
    with torch.no_grad():
      streams["transformers greedy"] = hf_target.generate(ids, **common)[
          :, -new:].numpy()

  def hf_assisted():
    with torch.no_grad():
      streams["transformers assisted"] = hf_target.generate(
          ids, assistant_model=hf_draft, **common)[:, -new:].numpy()

  def sj_generate():
    out = sj.generate(target, prompts, lengths, key, max_new_tokens=new,
                      sampling=sj.GREEDY)
    streams["specjax generate"] = np.asarray(jax.block_until_ready(out.tokens))
    outs["specjax generate"] = out  # read after the timing, not inside it

  def sj_speculative():
    out = sj.speculative_generate(target, draft, prompts, lengths, key,
                                  gamma=gamma, max_new_tokens=new,
                                  sampling=sj.GREEDY)
    streams["specjax speculative"] = np.asarray(
        jax.block_until_ready(out.tokens))
    outs["specjax speculative"] = out

  calls = dict(zip(VARIANTS, (hf_greedy, hf_assisted, sj_generate,
                              sj_speculative)))
  rows = {name: {} for name in VARIANTS}
  # Warm-up (compile, allocate), untimed; it is also the counted call.
  for name, fn in list(calls.items()):
    hooked = {"transformers greedy": (hf_target, None),
              "transformers assisted": (hf_target, hf_draft)}.get(name)
    try:
      with (_count_passes(*hooked) if hooked else
            contextlib.nullcontext()) as counts:
        fn()
    except ValueError as e:
      if name != "transformers assisted" or batch == 1:
        raise
      # Assisted generation refuses batch > 1: recorded as its result.
      rows[name]["error"] = (f"raises {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:90]}")
      del calls[name]
      continue
    if hooked:
      rows[name].update(
          target_passes=counts["target"], draft_passes=counts["draft"],
          tokens_per_target_call=new / counts["target"])
      if name == "transformers assisted":
        rows[name]["drafts_per_round"] = counts["drafts_per_round"]
    else:
      passes = _specjax_passes(outs[name], name == "specjax speculative")
      rows[name].update(passes)
  if "transformers assisted" in calls:
    _check_assisted(rows["transformers assisted"],
                    rows["specjax speculative"], gamma)

  times = _timed_calls(calls, _REPEATS.value)
  for name, t in times.items():
    rows[name]["seconds"] = t
    rows[name]["tokens_per_s"] = batch * new / statistics.median(t)
  ref = streams["transformers greedy"]
  for name, s in streams.items():
    rows[name]["identical_to_transformers_greedy"] = bool(
        np.array_equal(s, ref))
  return {"batch_size": batch, "variants": rows,
          "alpha": rows["specjax speculative"]["alpha"]}


def _speed(row: dict, name: str) -> float:
  return row["variants"][name].get("tokens_per_s", float("nan"))


def _ratios(row: dict) -> dict:
  """Speed ratios; None where a variant raised."""
  s = lambda name: _speed(row, name)
  ratios = {
      "specjax generate / transformers greedy":
          s("specjax generate") / s("transformers greedy"),
      "specjax speculative / transformers assisted":
          s("specjax speculative") / s("transformers assisted"),
      "specjax speculative / transformers greedy":
          s("specjax speculative") / s("transformers greedy"),
  }
  return {k: (None if np.isnan(v) else v) for k, v in ratios.items()}


def _print_batch(row: dict) -> None:
  print(f"\nbatch {row['batch_size']:<22d}{'tokens/s':>10s}"
        f"{'tok/target call':>17s}{'target passes':>15s}"
        f"{'draft passes':>14s}")
  for name in VARIANTS:
    v = row["variants"][name]
    if "error" in v:
      print(f"  {name:24s}  {v['error']}")
      continue
    print(f"  {name:24s}{v['tokens_per_s']:10.1f}"
          f"{v['tokens_per_target_call']:17.2f}{v['target_passes']:15d}"
          f"{v['draft_passes']:14d}")
  assisted = row["variants"]["transformers assisted"]
  if "drafts_per_round" in assisted:
    d = assisted["drafts_per_round"]
    print(f"  transformers assisted drafts per round: {d}")
  print(f"  alpha (specjax speculative)                  "
        f"{row['alpha']:.3f}")
  for name, value in row["ratios"].items():
    print(f"  {name:45s}" + ("n/a" if value is None else f"{value:.2f}x"))
  same = {name: v.get("identical_to_transformers_greedy")
          for name, v in row["variants"].items() if "error" not in v}
  print(f"  token streams equal to transformers greedy: {same}")


def _write(rows: list, meta: dict) -> None:
  if not _RESULTS_DIR.value:
    return
  os.makedirs(_RESULTS_DIR.value, exist_ok=True)
  path = os.path.join(_RESULTS_DIR.value, "vs_transformers.json")
  with open(path, "w") as fh:
    json.dump({"metadata": meta, "rows": rows}, fh, indent=1)
  print(f"\nwrote {path}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.utils.logging.disable_progress_bar()
  root = pathlib.Path(_WORKDIR.value or tempfile.mkdtemp(prefix="vs_hf_"))
  hf_target, hf_draft = _save_checkpoints(root, _DRAFT_LAYERS.value)
  _configure_assistant(hf_draft, _GAMMA.value)
  target, _ = hf.load(root / "target")
  draft, _ = hf.load(root / "draft")
  cpu = roofline.cpu_model()
  bandwidth = _read_bandwidth(_READ_MB.value)
  versions = _versions()
  threads = {"os_cpu_count": os.cpu_count(),
             "affinity": len(os.sched_getaffinity(0)),
             "torch_intra_op": torch.get_num_threads(),
             "torch_inter_op": torch.get_num_interop_threads(),
             "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
  meta = {
      "command": "python -m benchmarks.vs_transformers "
                 + " ".join(sys.argv[1:]),
      "cpu_model": cpu, "read_bandwidth_bytes_per_s": bandwidth,
      "read_mb": _READ_MB.value, "jax_platform": jax.devices()[0].platform,
      "versions": versions, "threads": threads,
      "draft_layers": _DRAFT_LAYERS.value, "gamma": _GAMMA.value,
      "prompt_len": _PROMPT_LEN.value, "max_new_tokens": _MAX_NEW.value,
      "repeats": _REPEATS.value, "load_average": [os.getloadavg()[0]],
  }
  print(f"host: {cpu}, {threads['affinity']} CPUs, read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s (jitted jnp.sum over {_READ_MB.value} "
        f"MB float32, best of 5); load average "
        f"{meta['load_average'][0]:.2f}")
  print(f"torch {versions['torch']} ({threads['torch_intra_op']} threads), "
        f"transformers {versions['transformers']}, jax {versions['jax']} "
        f"({meta['jax_platform']}); GPT-2-124M-shaped random target, draft "
        f"= its first {_DRAFT_LAYERS.value} blocks; prompt "
        f"{_PROMPT_LEN.value}, {_MAX_NEW.value} new tokens, greedy, gamma "
        f"{_GAMMA.value}; median of {_REPEATS.value}", flush=True)
  rows = []
  for batch in (int(b) for b in _BATCHES.value):
    row = run_batch(batch, hf_target, hf_draft, target, draft)
    row["ratios"] = _ratios(row)
    _print_batch(row)
    rows.append(row)
  meta["load_average"].append(os.getloadavg()[0])
  print(f"\nload average at the end: {meta['load_average'][1]:.2f}")
  _write(rows, meta)


if __name__ == "__main__":
  app.run(main)
