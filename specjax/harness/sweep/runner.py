"""Running a sweep's grid: decoding, timing and scoring every cell.

For one target, each cell of `grid.plan`'s grid, `run` decodes the same
held-out prompts (at batch 1 by default, the latency setting of the papers)
with `speculative_generate`, and the autoregressive baseline `generate`
decodes them too, alternating batch by batch; it records, per cell, the
acceptance statistics of `specjax.stats.summarize`, every cost of the loop
timed on its own shapes by `measure.loop_costs` (c and r among them), the
measured end-to-end and decode-only speedups, what `measure.predict`
predicts for each from the measured alpha and costs, and `measure.decompose`'s
account of any gap (acceptance, draft, verify or baseline). A row is one
cell; the field names are the schema `specjax.harness.figures` reads.
`run_config` does the whole thing for a `configs/reproduce.py` config:
models from the zoo, prompts from the corpus' held-out split, each model's
held-out bits per byte (`model_summaries`), result files with full metadata
(`io.write`).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import time
from typing import Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from specjax import data
from specjax import jit_memory
from specjax import sampling as sampling_lib
from specjax import stats
from specjax.decode import loop
from specjax.harness import autotune
from specjax.harness import distortion
from specjax.harness import drafts as drafts_lib
from specjax.harness import measure
from specjax.harness.sweep import grid
from specjax.harness.sweep import io as io_lib
from specjax.train import losses


def _decode_interleaved(decoders: Sequence[Callable], prompts: np.ndarray,
                        prompt_len: int, seed: int, batch_size: int = 1,
                        repeats: int = 1) -> list[tuple[list, np.ndarray]]:
  """Runs every decoder on each batch of prompts, in turn, and times them.

  Taking turns per batch (same key for all) keeps slow drifts of the
  machine's speed out of the ratios between them: the sweep passes the
  baseline and every speculative cell of a (temperature, batch, draft)
  group, so each cell's call on a batch sits beside the baseline's on the
  same batch, and the baseline is timed once for the group. Each decoder
  is first run once untimed, so compilation is not counted. Each batch's
  round of calls is made `repeats` times (the same inputs and key, so the
  same output) and each decoder keeps its fewest seconds: the estimator of
  `specjax.harness.measure` (its docstring, "Noise").

  Returns:
    one `(results [N / batch], seconds float [N / batch])` per decoder.
  """
  lengths = np.full((batch_size,), prompt_len, np.int32)
  key = jax.random.key(seed)
  out = [([], []) for _ in decoders]
  # Made before the timed calls: fold_in compiles on its first use.
  keys = [jax.random.fold_in(key, i)
          for i in range(prompts.shape[0] // batch_size)]
  jit_memory.relieve_if_needed("sweep")  # before the warm-ups compile
  with jit_memory.deferred():
    for fn in decoders:
      jax.block_until_ready(fn(prompts[:batch_size], lengths, key))
    with measure.no_compiles("sweep: the decoders' timed calls"):
      for i, key_i in enumerate(keys):
        batch = prompts[i * batch_size:(i + 1) * batch_size]
        calls = [functools.partial(fn, batch, lengths, key_i)
                 for fn in decoders]
        results = [None] * len(calls)
        best = [math.inf] * len(calls)
        for _ in range(repeats):
          for j, call in enumerate(calls):
            results[j], seconds = measure.timed(call)
            best[j] = min(best[j], seconds)
        for j, (kept, times) in enumerate(out):
          kept.append(results[j])
          times.append(best[j])
  return [(kept, np.asarray(times)) for kept, times in out]


def _distortion(target, cell: grid.Cell, prompts: np.ndarray, results,
                sampling) -> dict:
  """tv_per_token (and se) for a cell: 0 for exact verifiers (proved, and
  checked on the lab), the estimate of `specjax.harness.distortion` for lossy ones
  (None where the verifier has no per-position law)."""
  if cell.verifier.exact:
    return {"tv_per_token": 0.0, "tv_per_token_se": 0.0}
  if not distortion.has_position_law(cell.verifier):
    return {"tv_per_token": None, "tv_per_token_se": None}
  est = distortion.per_token_tv(
      target, cell.draft.model, cell.verifier, sampling,
      prompts_BxP=prompts,
      prompt_lengths_B=np.full((prompts.shape[0],), prompts.shape[1], np.int32),
      tokens_BxN=np.concatenate([np.asarray(r.tokens) for r in results]),
      lengths_B=np.concatenate([np.asarray(r.lengths) for r in results]))
  return {"tv_per_token": est["tv_per_token"],
          "tv_per_token_se": est["tv_per_token_se"]}


def run(target, drafts: Sequence[drafts_lib.Draft], prompts: np.ndarray, *,
        temperatures: Sequence[float], gammas: Sequence[int | str],
        max_new_tokens: int, target_name: str,
        verifiers: Sequence[str] = ("token",),
        batch_sizes: Sequence[int] = (1,), seed: int = 0,
        step_seconds: float = 0.1, step_repeats: int = 5,
        call_repeats: int = 1,
        progress: Callable[[str], None] | None = None,
        skipped: list | None = None,
        on_row: Callable[[dict], None] | None = None) -> list[dict]:
  """Measures every cell of `grid.plan`'s grid; returns one dict each.

  Args:
    target: the target `CausalLM`.
    drafts: the drafts to compare (`drafts.make_draft`, `drafts.wrap`).
    prompts: int `[N, P]` held-out prompts (all of length P), decoded
      `batch_size` at a time.
    temperatures: e.g. (0.0, 1.0); 0 is greedy.
    gammas: draft lengths, e.g. range(1, 9), and/or "auto" (the `Goodput`
      rule with gamma_max = `autotune.AUTO_GAMMA_MAX`, its c and r measured at
      the cell's batch size).
    max_new_tokens: tokens generated per prompt.
    target_name: recorded in every row.
    verifiers: registry strings (`specjax.decode.verifiers`): "token",
      "block", "lenient:0.5", "typical:0.09,0.3", or any later registration.
    batch_sizes: rows decoded per call (each must divide N).
    seed: keys of the sampled runs.
    step_seconds, step_repeats: see `measure.pass_seconds`.
    call_repeats: timed calls per batch of prompts and decoder; the fewest
      seconds count (see `_decode_interleaved`).
    progress: called with a short description before each cell compiles.
    on_row: called with each row as soon as it is measured (e.g. to save
      it: `run_config` appends it to `sweep.partial.jsonl`).
    skipped: if given, a list that receives one dict per skipped cell (its
      axes and a "reason"): those of `grid.plan`, and cells whose decoder
      refuses the combination before tracing (a ValueError from
      `speculative_generate`, e.g. a verifier that fixes its own shape).

  The cells of each (temperature, batch size, draft) group are compiled
  first, then timed by turns beside one baseline `generate` on each batch
  of prompts (`_decode_interleaved`): each cell's ratio is measured side
  by side, and the baseline's calls are not repeated for every gamma and
  verifier.

  Each row holds the cell's axes (draft, temperature, verifier with its
  `exact` / `lossy` label, gamma with `gamma_mode` "fixed" or "auto" (gamma
  is then the rule's gamma_max), batch_size), `measure.compare`'s
  statistics, costs, measured and predicted speedups, `mean_draft_length`
  (draft tokens proposed per row per round) and `tv_per_token` (see
  `_distortion`). Costs come from `measure.loop_costs` on the loop's own
  shapes (one memo for the grid: each distinct pass or null loop is timed
  once), the draft/verify split from `measure.null_draft_round_seconds`.
  Auto rows carry no fixed-gamma prediction (None).
  """
  prompts = np.asarray(prompts, np.int32)
  num_prompts, prompt_len = prompts.shape
  cells, skips = grid.plan(drafts, temperatures=temperatures, gammas=gammas,
                           verifiers=verifiers, batch_sizes=batch_sizes,
                           num_prompts=num_prompts)
  target_params = drafts_lib.param_count(target)
  rows = []
  memo: dict = {}
  lengths = np.full((num_prompts,), prompt_len, np.int32)
  groups = itertools.groupby(
      cells, lambda c: (c.temperature, c.batch_size, c.draft.name))
  for index, (_, group) in enumerate(groups):
    # Every compiled program stays mapped in memory until its cache entry
    # goes: 80 cells of the adaptive grid (each with its timing loops and
    # the auto rule's verify widths) ran out of the kernel's memory-map
    # limit ("LLVM compilation error: Cannot allocate memory"). A finished
    # (temperature, batch, draft) group's programs are not used again; the
    # timings are memoised in `memo`, not in the caches.
    if index:
      jax.clear_caches()
    group = list(group)
    batch, sampling = group[0].batch_size, sampling_lib.SamplingConfig(
        temperature=group[0].temperature)
    baseline = functools.partial(loop.generate, target,
                                 max_new_tokens=max_new_tokens,
                                 sampling=sampling)
    live = []  # (cell, its decoder) for the cells that compile
    for cell in group:
      if progress:
        progress(f"{cell.draft.name}, T={cell.temperature:g}, "
                 f"{cell.verifier.spec}, gamma={cell.gamma}, B={batch}")
      try:  # compiles (cached for the timed calls) or refuses before tracing
        gamma = cell.gamma
        if gamma == grid.AUTO:  # a Goodput rule priced at this batch's shapes
          gamma = autotune.auto_rule(
              target, cell.draft.model, prompts[:batch], lengths[:batch],
              max_new_tokens=max_new_tokens, sampling=sampling,
              verifier=cell.verifier)
        speculative = functools.partial(
            loop.speculative_generate, target, cell.draft.model,
            gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling,
            verifier=cell.verifier)
        jax.block_until_ready(speculative(
            prompts[:batch], lengths[:batch], jax.random.key(seed)))
      except ValueError as e:
        skips.append({**cell.describe(), "reason": str(e)})
        continue
      live.append((cell, speculative))
    if not live:
      continue
    timed = _decode_interleaved([baseline] + [fn for _, fn in live], prompts,
                                prompt_len, seed, batch, call_repeats)
    ar_results, ar_seconds = timed[0]
    for (cell, _), (results, spec_seconds) in zip(live, timed[1:]):
      costs = measure.loop_costs(
          target, cell.draft.model, batch_size=batch, prompt_len=prompt_len,
          max_new_tokens=max_new_tokens, gamma=cell.gamma_max,
          sampling=sampling, verifier=cell.verifier, seconds=step_seconds,
          repeats=step_repeats, memo=memo)
      null_round = None
      if cell.gamma != grid.AUTO:
        null_round = measure.null_draft_round_seconds(
            target, cell.draft.model,
            measure.LoopShape(batch, prompt_len, max_new_tokens,
                              cell.gamma_max), sampling,
            prompts_BxP=prompts[:batch], prompt_lengths_B=lengths[:batch],
            key=jax.random.key(seed), costs=costs, repeats=step_repeats,
            verifier=cell.verifier, memo=memo)
      # An auto row's fixed-gamma predictions are None (its rounds draft
      # fewer than gamma_max); its formula is priced at the rounds' lengths.
      measured = measure.compare(costs, ar_results, ar_seconds, results,
                                 spec_seconds, null_round)
      summary = stats.summarize(results)
      rows.append({
          "draft": cell.draft.name, "draft_kind": cell.draft.kind,
          "draft_params": cell.draft.params, "target": target_name,
          "target_params": target_params,
          "temperature": float(cell.temperature),
          "verifier": cell.verifier.spec, "exact": bool(cell.verifier.exact),
          "lossy": not cell.verifier.exact,
          "gamma": cell.gamma_max,
          "gamma_mode": "auto" if cell.gamma == grid.AUTO else "fixed",
          "batch_size": int(batch), "rows": int(num_prompts),
          "max_new_tokens": int(max_new_tokens),
          "mean_draft_length": (summary["draft_calls"] / summary["rounds"]
                                if summary["rounds"] else None),
          **_distortion(target, cell, prompts, results, sampling),
          **measured})
      if on_row:
        on_row(rows[-1])
  for skip in skips:
    logging.warning("sweep: skipped %s: %s", {k: v for k, v in skip.items()
                                              if k != "reason"},
                    skip["reason"])
  if skipped is not None:
    skipped.extend(skips)
  return rows


def check_config(config, results_dir: str) -> dict:
  """Raises, naming the field, for a bad `configs/reproduce.py` ConfigDict
  or `results_dir`; returns the grid's axes (`grid.plan`'s keyword arguments).
  `run_config` calls it before any model is loaded or trained (minutes, for
  the quick job's models); the entry points call it to refuse bad flags."""
  axes = grid.config_axes(config)
  io_lib.check_results_dir(results_dir)
  return axes


def run_config(config, results_dir: str,
               dtypes: dict | None = None) -> list[dict]:
  """Loads (or trains) a config's models, runs its grid, writes the results.

  `config` is a `configs/reproduce.py` ConfigDict. Writes `sweep.jsonl`,
  `sweep.csv` and `metadata.json` into `results_dir` (see `io.write`).
  `dtypes` as `drafts.load_models` (recorded in the metadata). Every
  field, axis, draft and `results_dir` is checked, naming it, before a
  model loads.
  """
  start = time.time()
  axes = check_config(config, results_dir)
  os.makedirs(results_dir, exist_ok=True)
  corpus = data.stdlib_corpus()
  target, drafts = drafts_lib.load_models(config, corpus=corpus,
                                          dtypes=dtypes)
  heldout = corpus.tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, config.num_prompts, config.prompt_len,
                         config.seed)
  cells, _ = grid.plan(drafts, num_prompts=config.num_prompts, **axes)
  bar = tqdm.tqdm(total=len(cells), desc="sweep", unit="cell")

  def progress(what):  # called as each cell starts
    bar.set_postfix_str(what)
    bar.update(1)

  skipped: list = []
  # Kept if the grid dies; `io_lib.write` removes it.
  save = io_lib.partial_rows(results_dir)
  rows = run(target, drafts, prompts, max_new_tokens=config.max_new_tokens,
             target_name=config.target, seed=config.seed,
             step_seconds=config.step_seconds, step_repeats=config.step_repeats,
             call_repeats=config.get("call_repeats", 1),
             progress=progress, skipped=skipped, on_row=save, **axes)
  bar.close()
  if not rows:  # every cell refused by its decoder: nothing to write
    raise ValueError("no cell of the grid ran; the decoders refused every "
                     "one: " + "; ".join(s["reason"] for s in skipped))
  limits = [m.max_positions for m in [target] + [d.model for d in drafts]
            if m.max_positions is not None]
  window = min([256] + limits)
  windows = np.stack([data.batch_at(heldout, 8, window - 1, config.seed, i)
                      for i in range(2)])
  models = model_summaries(config.target, target, drafts, windows)
  metadata = io_lib.run_metadata(
      config, corpus=corpus.fingerprint(), models=models, dtypes=dtypes,
      seconds=time.time() - start, skipped=skipped)
  io_lib.write(rows, metadata, results_dir)
  return rows


def model_summaries(target_name: str, target, drafts: list[drafts_lib.Draft],
                    windows_NxBxT1: np.ndarray) -> dict[str, dict]:
  """metadata.json's "models": {name: {kind, params, heldout_bpb}}.

  A prompt-lookup draft has no law of its own over held-out text (it copies
  from the prompt), so its `heldout_bpb` is None; every other draft,
  self-drafts included (scored through their own cache), gets a number.
  """
  models = {target_name: {"kind": "target",
                          "params": drafts_lib.param_count(target),
                          "heldout_bpb": heldout_bpb(target, windows_NxBxT1)}}
  for d in drafts:
    models[d.name] = {"kind": d.kind, "params": d.params,
                      "heldout_bpb": (None if d.kind == "prompt_lookup"
                                      else heldout_bpb(d.model, windows_NxBxT1))}
  return models


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
