r"""gamma="auto" (and the confidence rule) against every fixed gamma, per draft and batch.

  python -m experiments.adaptive_gamma          # configs/adaptive_gamma.py
  python -m experiments.adaptive_gamma \
      --config=configs/adaptive_gamma.py:grid_t1 --config.drafts=self:1 \
      --results_dir=/tmp/specjax/adaptive_gamma

configs/adaptive_gamma.py holds the presets, their commands and every
field. Flags beside --config: --results_dir (default: config.results_dir),
and the distributed and dtype flags of `specjax.distributed`.

For every (draft, batch) cell it times, after compilation and interleaved
call by call, `generate` and `speculative_generate` with each fixed gamma,
with
gamma="auto" (the Goodput rule planning widths 1, 2, 4, ... up to the
largest gamma, each width's round priced at that batch by the loop's own
round, `measure_goodput`), with auto priced by the
verify passes timed alone ("auto alone": `measure_goodput(calibrate=False)`,
the default before), with auto warm-started from a pilot call on other
held-out prompts of the same batch ("auto+warm": `Goodput.warm_start`, so
rows start from the pilot's acceptance instead of the default prior's
3/4), with auto as it was before `Goodput.prompt_prior` ("auto no prompt":
rows start from the prior's 3/4, not from their prompts, teacher-forced),
with auto from the prior `config.prior` if given ("auto prior a:b"), with auto
planning the widths `config.widths` instead if given, with and without its
prompt ("auto widths 1,2,3,4,5,6,7,8", "... no prompt":
`measure_goodput(widths=...)`; the planned loop holds a loop of rounds per
width) and with auto
plus a confidence stop (`config.threshold`), over the same held-out prompts,
every call (warm-up and repeats) drawing its own sample. Per cell it prints
one line per variant, side by side: speedup over `generate` (total time
over every call, as a ratio), the ratio to the cell's best fixed gamma,
alpha, draft passes per round, and the speedup taken apart: tokens per row
per loop round (a count over every repeat's samples; at batch > 1 the loop
runs its slowest row's rounds) over a loop round's cost in `generate` steps
(timed, the call's fixed costs included), beside the cost that auto's
pricing put each fixed gamma's round at. Then each auto variant's ratio
to the best fixed gamma, with a 95% bootstrap interval
(`measure.versus_best_fixed`): the prompts
are resampled, each with all its repeats (the units every variant was
timed in together), and the best fixed gamma is picked again in each
resample. That best is picked on the calls it is scored on, the largest of
several noisy speedups, so it is biased up; beside it, each variant's
ratio to the "held-out fixed" gamma (`measure.held_out_best`: each prompt
timed under the fixed gamma the other prompts pick, biased down where
gammas are close). Rows go to `adaptive_gamma.jsonl`, with every timed
call's seconds (`seconds_UxN`), and the figure to `.png`.

Drafts: `self:K` is `SelfDraft(target, layers=K, share_cache=True)`;
`self:K+adapter` adds the zoo's trained exit adapter (quick target only);
any other name is loaded from `specjax.harness.zoo` (e.g. bigram,
distilled-draft-0.1m@target-3m, trained on first use). `config.target=quick`
is the quick job's trained target-3m; a preset name (byte-85m) has RANDOM
weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import _checks
from specjax import data
from specjax import distributed
from specjax import sharding
from specjax.harness import autotune
from specjax.harness import drafts
from specjax.harness import measure
from specjax.models import transformer
from specjax.train import recipes
from configs import reproduce
from experiments import flag_checks

_CONFIG = flag_checks.define_config(
    "adaptive_gamma.py:self_drafts",
    "The study's config, e.g. configs/adaptive_gamma.py:grid_t1.")
flags.declare_key_flag("config")  # in --help, with this file's flags
_RESULTS = flags.DEFINE_string(
    "results_dir", None, "Where to write the rows and the figure (default: "
    "config.results_dir).")
distributed.define_flags()
distributed.define_dtype_flags()
flag_checks.require_results_dir(optional=True)

# The fields of a study config (configs/adaptive_gamma.py's study presets).
_FIELDS = ("target", "drafts", "batches", "gammas", "threshold",
           "temperature", "prompts", "prompt_len", "max_new_tokens",
           "repeats", "prior", "widths", "results_dir")


def load_target(name):
  """(target, description): `config.target`'s model, the quick job's trained
  target for 'quick' (the benchmarks on the quick models load it here)."""
  if name == "quick":
    config = reproduce.get_config("quick")
    return drafts.load_target(config), f"quick job's trained {config.target}"
  model = sj.TransformerLM.create(sj.TransformerConfig.preset(name), 0)
  return model, f"{name} with RANDOM weights (untrained)"


def _prior(text):
  """config.prior 'a:b' -> (a, b), two positive pseudo-counts; '' -> None."""
  if not isinstance(text, str):
    raise TypeError(f"config.prior must be a str 'a:b' (or '' for none), got "
                    f"{text!r}.")
  if not text:
    return None
  try:
    a, b = (float(x) for x in text.split(":"))
  except ValueError:
    raise ValueError(f"config.prior must be 'a:b', two pseudo-counts, got "
                     f"{text!r}.") from None
  if not (a > 0 and b > 0):
    raise ValueError(f"config.prior pseudo-counts must be > 0, got {text!r}.")
  return a, b


def check_config(config) -> dict:
  """The study's settings from `config` (configs/adaptive_gamma.py), every
  field checked before any model is loaded or trained: raises ValueError or
  TypeError naming the field."""
  flag_checks.require_fields(
      config, _FIELDS, "the study's presets are configs/adaptive_gamma.py:"
      "self_drafts, grid_t0 and grid_t1; its sweep presets "
      "(configs/adaptive_gamma.py:sweep) run with python -m experiments.sweep")
  target = config.target
  if target != "quick" and target not in transformer.PRESETS:
    raise ValueError(
        "config.target must be 'quick' (the quick job's trained target) or a "
        f"preset name: {', '.join(sorted(transformer.PRESETS))}; got "
        f"{target!r}")
  # An empty list would time no cell (or no fixed gamma to compare against)
  # and fail only when the rows are plotted; widths may be empty (no "auto
  # widths" variant).
  names = flag_checks.names(config, "drafts", example="self:1,self:2")
  batches = flag_checks.ints(config, "batches", example="1,8")
  gammas = flag_checks.ints(config, "gammas", example="1,2,4")
  widths = flag_checks.ints(config, "widths", example="1,2,3,4", empty=True)
  flag_checks.positive(config, "prompts", "prompt_len", "max_new_tokens",
                       "repeats")
  if _checks.check_float("config.temperature", config.temperature) < 0:
    raise ValueError("config.temperature must be >= 0 (0: greedy), got "
                     f"{config.temperature}")
  # Confidence(threshold=...) takes a probability; else it raises only inside
  # the first cell, after the target loaded.
  if not 0 <= _checks.check_float("config.threshold", config.threshold) <= 1:
    raise ValueError(
        "config.threshold must be in [0, 1]: the draft stops after a token "
        "whose largest draft probability is below it; got "
        f"{config.threshold}")
  prior = _prior(config.prior)
  if target == "quick":
    layers = recipes.SIZES[reproduce.get_config("quick").target]["num_layers"]
  else:
    layers = sj.TransformerConfig.preset(target).num_layers
  for name in names:
    try:
      drafts.check_spec(name, num_layers=layers)
    except (TypeError, ValueError) as e:
      raise ValueError(f"config.drafts {name!r}: {e}") from None
    if name.endswith("+adapter") and target != "quick":
      raise ValueError(f"config.drafts {name!r}: an exit adapter is the "
                       "zoo's, trained for the quick target: "
                       "--config.target=quick.")
  return dict(target=target, drafts=names, batches=batches, gammas=gammas,
              widths=widths, prior=prior, threshold=float(config.threshold),
              temperature=float(config.temperature), prompts=config.prompts,
              prompt_len=config.prompt_len,
              max_new_tokens=config.max_new_tokens, repeats=config.repeats)


def held_out_calls(calls, batch, prompt_len):
  """int32 `[calls + 1, batch, prompt_len]`: the held-out prompts a cell
  times, call 0 the "auto+warm" pilot's (the benchmarks that count what
  this experiment times read the same)."""
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  return data.prompts(heldout, (calls + 1) * batch, prompt_len, 0).reshape(
      calls + 1, batch, prompt_len)


def run_cell(target, draft, prompts_NxBxP, pilot_BxP, sampling, gammas,
             threshold, max_new, repeats, prior=None, widths=None):
  """Speedups of every variant over `generate` for one (draft, batch);
  `pilot_BxP`: other prompts, for the pilot call of "auto+warm"; `prior`:
  (a, b) pseudo-counts of an "auto prior a:b" variant, or None; `widths`:
  the draft lengths of the "auto widths" variants, or None."""
  batch, width = prompts_NxBxP.shape[1:]
  lengths = np.full((batch,), width, np.int32)
  keys = [jax.random.key(i) for i in range(len(prompts_NxBxP))]
  def measured(**kw):
    # gamma="auto"'s widths unless told otherwise.
    kw.setdefault("widths", autotune.doubling_widths(max(gammas)))
    return autotune.measure_goodput(
        target, draft, batch_size=batch, gamma_max=max(gammas),
        prompt_len=width, max_new_tokens=max_new, sampling=sampling, **kw)
  # What gamma="auto" runs: its widths priced by the loop's own rounds.
  auto = measured()
  variants = {f"gamma={g}": g for g in gammas}
  variants["auto"] = auto
  # The default before: verify passes priced as timed alone.
  variants["auto alone"] = measured(calibrate=False)
  pilot = sj.speculative_generate(
      target, draft, pilot_BxP, lengths, jax.random.key(len(keys)),
      gamma=auto, max_new_tokens=max_new, sampling=sampling)
  variants["auto+warm"] = auto.warm_start(pilot)
  variants["auto no prompt"] = dataclasses.replace(auto, prompt_prior=0.0)
  if prior is not None:
    variants["auto prior {:g}:{:g}".format(*prior)] = dataclasses.replace(
        auto, prior=prior)
  if widths:
    name = "auto widths " + ",".join(map(str, widths))
    variants[name] = measured(widths=widths)
    variants[name + " no prompt"] = dataclasses.replace(variants[name],
                                                        prompt_prior=0.0)
  variants["auto+conf"] = dataclasses.replace(auto, threshold=threshold,
                                             probe=None)

  def call(gamma, prompts_BxP, key):
    # Every call draws its own sample (the key folded with the call's
    # count), and keeps its result. At T > 0 a variant's tokens per round
    # depend on the texts it happens to sample: with one key per prompt,
    # the repeats timed one sample again and again, and the alpha of the
    # T1_overlap cells' variants moved by up to .05 between them (self:1,
    # batch 1: .763-.811), a few percent of each speedup. Greedy, every
    # call is the same text.
    outputs = []

    def fn():
      sample = jax.random.fold_in(key, len(outputs))
      if gamma is None:
        out = sj.generate(target, prompts_BxP, lengths, sample,
                          max_new_tokens=max_new, sampling=sampling)
      else:
        out = sj.speculative_generate(
            target, draft, prompts_BxP, lengths, sample, gamma=gamma,
            max_new_tokens=max_new, sampling=sampling)
      outputs.append(out)
      return out
    return fn, outputs

  everyone = {"baseline": None, **variants}
  # Interleaved call by call (every variant on one prompt, then the next
  # prompt), so that a slow spell of the machine, seconds long, falls on
  # every variant alike. Interleaved variant by variant (one variant's calls
  # in a row), the ratio of auto to the best fixed gamma moved from 0.49 to
  # 1.33 between the repeats of one cell.
  calls = {(name, i): call(g, p, k)
           for i, (p, k) in enumerate(zip(prompts_NxBxP, keys))
           for name, g in everyone.items()}
  per_call = measure.interleaved_times(
      {cell: fn for cell, (fn, _) in calls.items()}, repeats)
  # A `generate` step in the rule's units (target passes on 1 token): what
  # its round costs are priced against below.
  step = 1.0 + auto.overhead
  row = {"c": auto.c, "r": list(auto.r), "c_first": auto.c_first,
         "overhead": auto.overhead,
         "r_alone": list(variants["auto alone"].r), "loop_round_steps": [
             cost / step for cost in auto.round_costs()[-auto.gamma_max:]],
         # The widths auto timed; the others' prices are interpolated.
         "priced_widths": [w for w in auto.planned_widths if w]}
  # One unit is a prompt in one repeat, where every variant was timed in
  # one spell: seconds_UxN and, from the timed calls' own results (each
  # call's last `repeats` runs were the timed ones, after its warm-up), the
  # loop rounds each one ran.
  units = [(i, t) for t in range(repeats) for i in range(len(keys))]
  names = list(everyone)
  seconds_UxN = np.array([[per_call[(name, i)][t] for name in names]
                          for i, t in units])
  summaries = {name: [calls[(name, i)][1][t - repeats].summary()
                      for i, t in units] for name in variants}
  # Every row of every call generates max_new tokens: a speedup is a ratio
  # of total times, and it is tokens per loop round (a count over every
  # repeat's samples, no timer) over a round's cost in `generate` steps.
  speedup_N = seconds_UxN[:, 0].sum() / seconds_UxN.sum(0)
  steps = len(units) * max_new  # `generate`'s loop iterations, all units
  for n, name in enumerate(names[1:], 1):
    stats = summaries[name]
    tokens_per_round = steps / sum(s["loop_rounds"] for s in stats)
    row[name] = {
        "speedup": float(speedup_N[n]),
        "alpha": (sum(s["accepted"] for s in stats)
                  / max(1, sum(s["verified"] for s in stats))),
        "draft_passes_per_round": (sum(s["draft_calls"] for s in stats)
                                   / max(1, sum(s["rounds"] for s in stats))),
        "tokens_per_round": tokens_per_round,
        "steps_per_round": tokens_per_round / speedup_N[n],
    }
  fixed = [names.index(f"gamma={g}") for g in gammas]
  # The prompts are the resampled units (at T = 0 a prompt's repeats are
  # one text, at T > 0 samples after one prompt), each with all its
  # repeats: resampling (prompt, repeat) units counted a greedy text once
  # per repeat.
  seconds_PxN = seconds_UxN.reshape(repeats, len(keys), -1).sum(0)
  vs = measure.versus_best_fixed(seconds_PxN, fixed)
  best = gammas[vs["best"]]
  row["best_fixed"] = best
  row["autos"] = [name for name in variants if name.startswith("auto")]
  if "held_out_picks_P" in vs:
    row["held_out_fixed"] = {
        "speedup": float(vs["held_out_speedup"]),
        "picks": [gammas[p] for p in vs["held_out_picks_P"]]}
  for n, name in enumerate(names[1:], 1):
    row[name]["vs_best_fixed"] = float(vs["vs_best_N"][n])
    row[name]["vs_best_fixed_95"] = [float(x) for x in vs["vs_best_95_Nx2"][n]]
    if "vs_held_out_N" in vs:
      row[name]["vs_held_out_fixed"] = float(vs["vs_held_out_N"][n])
      row[name]["vs_held_out_fixed_95"] = [
          float(x) for x in vs["vs_held_out_95_Nx2"][n]]
  # Every timed call, for analyses after the run: seconds [unit, variant],
  # units (prompt, repeat) in `units`' order.
  row["variants"] = names
  row["seconds_UxN"] = seconds_UxN.tolist()
  return row


def report(row, gammas) -> str:
  """The cell's variants side by side, and auto against the best fixed."""
  lines = [f"{row['draft']}, batch {row['batch']}: c={row['c']:.3f} "
           f"c_first={row['c_first']:.3f} overhead={row['overhead']:.3f} "
           f"r={['%.2f' % x for x in row['r']]} (timed alone: "
           f"{['%.2f' % x for x in row['r_alone']]})",
           f"  {'variant':>11} {'speedup':>8} {'/best':>6} {'alpha':>6} "
           f"{'drafts/round':>12} {'tokens/round':>12} {'steps/round':>11}"
           f" {'(priced)':>8}"]
  # Rows written before the key: every width was timed.
  priced_widths = row.get("priced_widths", gammas)
  for name in [f"gamma={g}" for g in gammas] + row["autos"]:
    v = row[name]
    mark = " <- best fixed" if name == f"gamma={row['best_fixed']}" else ""
    priced = ""
    if name.startswith("gamma="):
      g = int(name[6:])
      timed = g in priced_widths
      priced = f"{row['loop_round_steps'][g - 1]:7.2f}{' ' if timed else '*'}"
    lines.append(f"  {name:>11} {v['speedup']:8.3f} {v['vs_best_fixed']:6.3f}"
                 f" {v['alpha']:6.3f} {v['draft_passes_per_round']:12.2f}"
                 f" {v['tokens_per_round']:12.2f} {v['steps_per_round']:11.2f}"
                 f" {priced:>8}{mark}")
  for name in row["autos"]:
    if name == "auto+conf":
      continue
    ratio = row[name]["vs_best_fixed"]
    low, high = row[name]["vs_best_fixed_95"]
    lines.append(f"  {name} / best fixed = {ratio:.3f} (95% "
                 f"{low:.3f}..{high:.3f})")
    if "vs_held_out_fixed" in row[name]:
      low, high = row[name]["vs_held_out_fixed_95"]
      lines.append(f"  {name} / held-out fixed = "
                   f"{row[name]['vs_held_out_fixed']:.3f} (95% {low:.3f}.."
                   f"{high:.3f})")
  if "held_out_fixed" in row:  # rows written before it have none
    held = row["held_out_fixed"]
    picks = ", ".join(f"gamma={g} x{held['picks'].count(g)}"
                      for g in sorted(set(held["picks"])))
    lines.append(f"  held-out fixed: each prompt under the fixed gamma the "
                 f"other prompts pick ({picks}), speedup "
                 f"{held['speedup']:.3f}")
  if any(int(g) not in priced_widths for g in gammas):
    lines.append("  * (priced): interpolated between the widths auto timed "
                 f"({', '.join(map(str, priced_widths))}), not timed")
  return "\n".join(lines)


def plot(rows, gammas, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  # One row of panels per batch size, one column per draft.
  drafts = list(dict.fromkeys(row["draft"] for row in rows))
  batches = list(dict.fromkeys(row["batch"] for row in rows))
  fig, axes = plt.subplots(len(batches), len(drafts),
                           figsize=(4 * len(drafts), 3.2 * len(batches)),
                           squeeze=False)
  for row in rows:
    ax = axes[batches.index(row["batch"])][drafts.index(row["draft"])]
    fixed = [row[f"gamma={g}"]["speedup"] for g in gammas]
    ax.plot(gammas, fixed, "o-", label="fixed gamma")
    styles = {"auto": ("--", "C1"), "auto alone": ("-.", "C3"),
              "auto+warm": ("-", "C4"), "auto no prompt": ((0, (1, 3)), "C5"),
              "auto+conf": (":", "C2")}
    for name in row["autos"]:
      style, color = styles.get(name, ((0, (3, 1, 1, 1)), "C6"))
      ax.axhline(row[name]["speedup"], ls=style, color=color, label=name)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_title(f"{row['draft']}, batch {row['batch']}")
    ax.set_xlabel("gamma")
    ax.set_ylabel("speedup vs autoregressive")
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _run(s):
  """Every (draft, batch) cell of the checked settings `s`: (rows, gammas)."""
  dtypes = distributed.dtypes_from_flags()
  target, what = load_target(s["target"])
  target = target.astype(**dtypes)
  gammas = s["gammas"]
  sampling = sj.SamplingConfig(temperature=s["temperature"])
  rows = []
  print(f"target: {what}; T={s['temperature']}; {s['prompts']} calls of "
        f"{s['prompt_len']} + {s['max_new_tokens']} tokens per row")
  for name in s["drafts"]:
    # A quick-job draft with that job's recipe (its cached model, never a
    # retrain under the default recipe); any other zoo name as named.
    draft = drafts.make_draft(
        name, target, config=(reproduce.get_config("quick")
                              if s["target"] == "quick" else None)
    ).model
    if hasattr(draft, "astype"):  # a zoo Transformer
      draft = draft.astype(**dtypes)
    for batch in s["batches"]:
      prompts = held_out_calls(s["prompts"], batch, s["prompt_len"])
      row = run_cell(target, draft, prompts[1:], prompts[0], sampling, gammas,
                     s["threshold"], s["max_new_tokens"], s["repeats"],
                     s["prior"], s["widths"])
      row.update(draft=name, batch=batch, target=what)
      # Each cell compiles a dozen loops; freed between cells, since one
      # process holding every cell's (the six cells of the README's run) ran
      # out of memory for LLVM's code on the 2-core box.
      jax.clear_caches()
      print(report(row, gammas), flush=True)
      rows.append(row)
  return rows, gammas


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = flag_checks.loaded_config(_CONFIG)
  settings = flag_checks.as_usage_error(check_config, config)
  results_dir = flag_checks.as_usage_error(flag_checks.results_dir, config,
                                           _RESULTS)
  distributed.initialize_from_flags()
  # SPMD: every process times the same calls, sharded over --mesh.
  with sharding.using(distributed.mesh_from_flags()):
    rows, gammas = _run(settings)
  if not distributed.is_primary():
    return
  os.makedirs(results_dir, exist_ok=True)
  with open(os.path.join(results_dir, "adaptive_gamma.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  plot(rows, gammas, os.path.join(results_dir, "adaptive_gamma.png"))
  print(f"wrote {results_dir} ({time.strftime('%H:%M UTC', time.gmtime())})")


if __name__ == "__main__":
  app.run(main)
