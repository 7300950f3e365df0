"""The measurement grid behind the paper figures: drafts x temperatures x gamma.

For one target, each draft, each temperature and each gamma, `run` decodes
the same held-out prompts at batch 1 (the latency setting of the papers) with
`speculative_generate`, and the autoregressive baseline `generate` decodes
them too, alternating prompt by prompt; it records, per cell, the acceptance
statistics of `specjax.stats.summarize`, every cost of the loop timed on its
own shapes by `measure.loop_costs` (c and r among them), the measured
end-to-end and decode-only speedups, what `measure.predict` predicts for
each from the measured alpha and costs, and `measure.decompose`'s account of
any gap (acceptance, draft, verify or baseline). A row is one cell; the field names are the
schema `specjax.figures` reads. `run_config` does the whole thing for a
`configs/reproduce.py` config: models from the zoo, prompts from the corpus'
held-out split, result files with full metadata.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from specjax import data
from specjax import measure
from specjax import sampling as sampling_lib
from specjax import zoo
from specjax.decode import loop
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.train import losses


@dataclasses.dataclass(frozen=True)
class Draft:
  """A draft under test: display name, kind, size and the model itself."""
  name: str
  kind: str  # unigram | bigram | prompt_lookup | transformer | distilled
  params: int
  model: Any


def _param_count(model) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(model)))


def make_draft(name: str, kind: str, model) -> Draft:
  """A `Draft` whose size is the number of array entries in the model."""
  return Draft(name=name, kind=kind, params=_param_count(model), model=model)


def _decode_interleaved(baseline, speculative, prompts: np.ndarray,
                        prompt_len: int, seed: int, repeats: int = 1):
  """Runs both decoders on each prompt at batch 1, alternating, and times them.

  Alternating per prompt (same key for both) keeps slow drifts of the
  machine's speed out of the ratio. Each decoder is first run once untimed,
  so compilation is not counted. Each prompt's pair of calls is made
  `repeats` times (the same inputs and key, so the same output) and each
  decoder keeps its fewest seconds: the estimator of `specjax.measure`
  (its docstring, "Noise").

  Returns:
    (baseline results, baseline seconds [N], speculative results, seconds [N]).
  """
  lengths = np.array([prompt_len], np.int32)
  key = jax.random.key(seed)
  for fn in (baseline, speculative):
    jax.block_until_ready(fn(prompts[:1], lengths, key))
  out = ([], [], [], [])
  for i in range(prompts.shape[0]):
    calls = [functools.partial(fn, prompts[i:i + 1], lengths,
                               jax.random.fold_in(key, i))
             for fn in (baseline, speculative)]
    results, best = [None, None], [math.inf, math.inf]
    for _ in range(repeats):
      for j, call in enumerate(calls):
        results[j], seconds = measure.timed(call)
        best[j] = min(best[j], seconds)
    for j in range(2):
      out[2 * j].append(results[j])
      out[2 * j + 1].append(best[j])
  return out[0], np.asarray(out[1]), out[2], np.asarray(out[3])


def run(target, drafts: Sequence[Draft], prompts: np.ndarray, *,
        temperatures: Sequence[float], gammas: Sequence[int],
        max_new_tokens: int, target_name: str, seed: int = 0,
        step_seconds: float = 0.1, step_repeats: int = 5,
        call_repeats: int = 1,
        progress: Callable[[str], None] | None = None) -> list[dict]:
  """Measures every (draft, temperature, gamma) cell; returns one dict each.

  Args:
    target: the target `CausalLM`.
    drafts: the drafts to compare (`make_draft`).
    prompts: int `[N, P]` held-out prompts (all of length P), decoded one at
      a time.
    temperatures: e.g. (0.0, 1.0); 0 is greedy.
    gammas: draft lengths, e.g. range(1, 9).
    max_new_tokens: tokens generated per prompt.
    target_name: recorded in every row.
    seed: keys of the sampled runs.
    step_seconds, step_repeats: see `measure.pass_seconds`.
    call_repeats: timed calls per prompt and decoder; the fewest seconds
      count (see `_decode_interleaved`).
    progress: called with a short description before each cell.

  Every cell's costs come from `measure.loop_costs` on the loop's own shapes
  (one memo for the grid: each distinct pass or null loop is timed once),
  and its draft/verify split in the loop from
  `measure.null_draft_round_seconds`.
  """
  prompts = np.asarray(prompts, np.int32)
  num_prompts, prompt_len = prompts.shape
  target_params = _param_count(target)
  rows = []
  memo: dict = {}
  for temperature in temperatures:
    sampling = sampling_lib.SamplingConfig(temperature=temperature)

    def baseline(p, l, k):
      return loop.generate(target, p, l, k, max_new_tokens=max_new_tokens,
                           sampling=sampling)

    for draft in drafts:
      for gamma in gammas:
        if progress:
          progress(f"{draft.name}, T={temperature:g}, gamma={gamma}")
        costs = measure.loop_costs(
            target, draft.model, batch_size=1, prompt_len=prompt_len,
            max_new_tokens=max_new_tokens, gamma=gamma, sampling=sampling,
            seconds=step_seconds, repeats=step_repeats, memo=memo)
        ar_results, ar_seconds, results, spec_seconds = _decode_interleaved(
            baseline,
            lambda p, l, k: loop.speculative_generate(
                target, draft.model, p, l, k, gamma=gamma,
                max_new_tokens=max_new_tokens, sampling=sampling),
            prompts, prompt_len, seed, repeats=call_repeats)
        null_round = measure.null_draft_round_seconds(
            target, draft.model,
            measure.LoopShape(1, prompt_len, max_new_tokens, gamma), sampling,
            prompts_BxP=prompts[:1],
            prompt_lengths_B=np.array([prompt_len], np.int32),
            key=jax.random.key(seed), costs=costs, repeats=step_repeats,
            memo=memo)
        rows.append({
            "draft": draft.name, "draft_kind": draft.kind,
            "draft_params": draft.params, "target": target_name,
            "target_params": target_params, "temperature": float(temperature),
            "gamma": int(gamma), "rows": int(num_prompts),
            "max_new_tokens": int(max_new_tokens),
            **measure.compare(costs, ar_results, ar_seconds, results, spec_seconds,
                       null_round)})
  return rows


# -- from a config to result files ---------------------------------------------


def git_commit() -> str:
  """HEAD of the checkout this file lives in (+ "-dirty"), or "unknown"."""
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, check=True,
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=here, capture_output=True, text=True).stdout
    return out + ("-dirty" if dirty.strip() else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def device_description() -> str:
  """Platform, device kind and count, and the host's cores."""
  d = jax.devices()[0]
  return (f"{d.platform}:{d.device_kind} x{jax.device_count()} "
          f"({os.cpu_count()} CPU cores, {platform.machine()})")


def _cast(model, dtypes):
  """A Transformer in `dtypes` (`TransformerLM.astype` kwargs); other
  models (n-gram, prompt lookup) as they are."""
  return model.astype(**dtypes) if dtypes and hasattr(model, "astype") else model


def load_models(config, corpus, dtypes: dict | None = None):
  """(target, [Draft]) as a reproduce config names them, via the zoo.

  `dtypes`: `{"dtype": ..., "param_dtype": ...}` to decode the Transformers
  in (e.g. bfloat16; default: as trained, float32).
  """
  cache = config.cache_dir
  target = _cast(zoo.load(config.target, cache_dir=cache,
                          overrides=dict(config.target_overrides),
                          corpus=corpus), dtypes)
  drafts = []
  for spec in config.drafts:
    if spec.kind == "prompt_lookup":
      model = PromptLookupDraft(target.vocab_size, max_ngram=3)
    else:
      model = zoo.load(spec.name, cache_dir=cache,
                       overrides=dict(spec.overrides),
                       teacher_overrides=dict(spec.teacher_overrides) or None,
                       corpus=corpus)
    drafts.append(make_draft(spec.name, spec.kind, _cast(model, dtypes)))
  return target, drafts


def run_config(config, results_dir: str,
               dtypes: dict | None = None) -> list[dict]:
  """Loads (or trains) a config's models, runs its grid, writes the results.

  `config` is a `configs/reproduce.py` ConfigDict. Writes `sweep.jsonl`,
  `sweep.csv` and `metadata.json` into `results_dir` (see `write`).
  `dtypes` as `load_models` (recorded in the metadata).
  """
  start = time.time()
  corpus = data.stdlib_corpus()
  target, drafts = load_models(config, corpus, dtypes)
  heldout = corpus.tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, config.num_prompts, config.prompt_len,
                         config.seed)
  cells = len(config.temperatures) * len(drafts) * len(config.gammas)
  bar = tqdm.tqdm(total=cells, desc="sweep", unit="cell")

  def progress(what):  # called as each cell starts
    bar.set_postfix_str(what)
    bar.update(1)

  rows = run(target, drafts, prompts, temperatures=config.temperatures,
             gammas=config.gammas, max_new_tokens=config.max_new_tokens,
             target_name=config.target, seed=config.seed,
             step_seconds=config.step_seconds, step_repeats=config.step_repeats,
             call_repeats=config.get("call_repeats", 1),
             progress=progress)
  bar.close()
  limits = [m.max_positions for m in [target] + [d.model for d in drafts]
            if m.max_positions is not None]
  window = min([256] + limits)
  windows = np.stack([data.batch_at(heldout, 8, window - 1, config.seed, i)
                      for i in range(2)])
  models = {config.target: {"kind": "target", "params": _param_count(target),
                            "heldout_bpb": heldout_bpb(target, windows)}}
  for d in drafts:
    models[d.name] = {"kind": d.kind, "params": d.params,
                      "heldout_bpb": (None if d.kind == "prompt_lookup"
                                      else heldout_bpb(d.model, windows))}
  metadata = {
      "config": config.to_dict(), "corpus": corpus.fingerprint(),
      "models": models,
      "dtypes": dict(dtypes or {}),
      "jax_version": jax.__version__, "python": sys.version.split()[0],
      "device": device_description(), "seed": config.seed,
      "git_commit": git_commit(),
      "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
      "sweep_seconds": round(time.time() - start, 1),
  }
  write(rows, metadata, results_dir)
  return rows


def heldout_bpb(model, windows_NxBxT1: np.ndarray) -> float:
  """Bits per byte of any `CausalLM` on held-out windows (int `[N, B, T+1]`).

  Scores each window in one cached forward pass, so it works for every model
  kind the decode loop accepts (the same measure as training's evaluation).
  """
  @jax.jit
  def totals(model, tokens_BxT1):
    def logits(inputs_BxT):
      cache = model.init_cache(*inputs_BxT.shape)
      return model(inputs_BxT, cache)[0]
    return losses.bits_and_bytes(logits, tokens_BxT1)

  sums = np.sum([jax.device_get(totals(model, jnp.asarray(w)))
                 for w in windows_NxBxT1], axis=0)
  return float(sums[0] / max(sums[1], 1.0))


def write(rows: list[dict], metadata: dict, results_dir: str) -> None:
  """sweep.jsonl and sweep.csv (overwritten, never appended), metadata.json."""
  os.makedirs(results_dir, exist_ok=True)
  with open(os.path.join(results_dir, "sweep.jsonl"), "w") as fh:
    for row in rows:
      fh.write(json.dumps(row) + "\n")
  with open(os.path.join(results_dir, "sweep.csv"), "w", newline="") as fh:
    writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows({k: (json.dumps(v) if isinstance(v, list) else v)
                      for k, v in row.items()} for row in rows)
  with open(os.path.join(results_dir, "metadata.json"), "w") as fh:
    json.dump(metadata, fh, indent=1, default=str)
