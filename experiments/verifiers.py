r"""Verifier comparison: tokens per target call and speedup vs gamma.

  python -m experiments.verifiers               # configs/verifiers.py:lab
  python -m experiments.verifiers --config=configs/verifiers.py:tiny
  python -m experiments.verifiers --config=configs/verifiers.py:trees
  python -m experiments.verifiers --config=configs/verifiers.py:paired \
      --config.quick_drafts=bigram --results_dir=/tmp/paired

configs/verifiers.py holds every preset, its command and what it writes.

config.models=lab or tiny: for every verifier (token, block, lossy
baselines) and gamma, decodes the same prompts with
`speculative_generate(..., verifier=...)` (same draft, same gamma: equal
draft compute) and the autoregressive baseline, and writes
`verifiers_<models>.csv` (one row per cell, with a "lossy" column and, for
the lab models, the verifier's exact TV to the target from
`specjax.lab.verifiers`) and `fig_verifiers_<models>.png`.

config.models=quick: the zoo's target-3m with its quick drafts, held-out
prompts, T = 1. For every entry of config.trees (a tree, or a chain
verifier at a gamma) and the chain "token" at its depth, writes
`trees_quick.csv` (tokens per target call with a 95% interval, the ratio
tree / chain with its interval, wall-clock seconds of the compiled call, the
fewest of 3 timed by turns with the chain's: noise on a shared box) and
`fig_trees_quick.png`; with config.paired_gammas, block against token on the
same drafts instead, Rao-Blackwellised: `paired_quick.csv` and
`paired_quick.md`.

Flags beside --config: --results_dir (default: config.results_dir), and the
distributed and dtype flags of `specjax.distributed`.
"""

from __future__ import annotations

import csv
import functools
import os
import time

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import distributed
from specjax import lab
from specjax import sharding
from specjax.decode import verifiers as vf
from specjax.harness import drafts as drafts_lib
from specjax.harness import expected_tokens
from specjax.harness import measure
from specjax.lab import models as lab_models
from specjax.lab import verifiers as lab_verifiers
from specjax.models.ngram import NGramLM
from specjax.train import recipes
from configs import reproduce
from experiments import flag_checks

_CONFIG = flag_checks.define_config(
    "verifiers.py:lab", "The study's config, e.g. configs/verifiers.py:trees.")
flags.declare_key_flag("config")  # in --help, with this file's flags
_RESULTS = flags.DEFINE_string(
    "results_dir", None, "Output directory (default: config.results_dir).")
distributed.define_flags()
distributed.define_dtype_flags()
flag_checks.require_results_dir(optional=True)


def _models(kind):
  if kind == "lab":
    pair = lab.make_markov_pair(1.5, 0.5, 0)
    target, draft = lab_models.markov_lms(pair)
    return target, draft, pair
  config = sj.TransformerConfig(vocab_size=64, d_model=128, num_layers=4,
                                num_heads=4, max_positions=256)
  target = sj.TransformerLM.create(config, 0).astype(
      **distributed.dtypes_from_flags())
  state = jax.tree_util.tree_map_with_path(
      lambda path, x: 3.0 * x if "embed" in jax.tree_util.keystr(path) else x,
      target.state)
  target = target.replace(state=state)
  prompts = np.random.default_rng(0).integers(0, 64, (128, 4)).astype(np.int32)
  samples = sj.generate(target, prompts, np.full(128, 4, np.int32),
                        jax.random.key(0), max_new_tokens=128)
  draft = NGramLM.fit(np.asarray(samples.tokens).reshape(-1), 64, order=2)
  return target, draft, None


# Timed calls per decoder; each keeps its fewest seconds (`measure`, "Noise").
_REPEATS = 3


def _side_by_side(fn, beside):
  """(fn()'s result, {name: fewest seconds}) for `fn` (named "this") and
  the decoders `beside` ({name: fn}), the calls taking turns: a ratio of
  two of them is measured side by side (`measure.best_times`)."""
  out = fn()  # compiles; the timed calls reuse the program
  return out, measure.best_times({**beside, "this": fn}, _REPEATS)


def run(kind, verifiers, gammas, rows, max_new_tokens):
  target, draft, pair = _models(kind)
  rng = np.random.default_rng(1)
  prompts = rng.integers(0, target.vocab_size, (rows, 4)).astype(np.int32)
  lengths = np.full(rows, 4, np.int32)
  base = lambda: sj.generate(target, prompts, lengths, jax.random.key(0),
                             max_new_tokens=max_new_tokens)
  records = []
  for spec in verifiers:
    v = vf.get_verifier(spec)
    for gamma in gammas:
      out, secs = _side_by_side(
          lambda: sj.speculative_generate(
              target, draft, prompts, lengths, jax.random.key(gamma),
              gamma=gamma, max_new_tokens=max_new_tokens, verifier=v),
          {"generate": base})
      s = out.summary()
      per_row = (np.asarray(out.lengths)
                 / np.maximum(np.asarray(out.stats.target_calls), 1))
      lab_tv = (lab_verifiers.verifier_tv(pair, gamma, 4, v)
                if pair is not None and gamma <= 4 else float("nan"))
      records.append(dict(
          models=kind, verifier=v.spec, lossy=not v.exact, gamma=gamma,
          tokens_per_target_call=s["tokens_per_target_call"],
          tokens_per_target_call_se=float(per_row.std(ddof=1)
                                          / np.sqrt(len(per_row))),
          alpha_hat=s["alpha_hat"], one_minus_tv=s["one_minus_tv"],
          speedup=secs["generate"] / secs["this"],
          lab_exact_tv_4_tokens=lab_tv))
      print({k: (round(x, 4) if isinstance(x, float) else x)
             for k, x in records[-1].items()}, flush=True)
  return records


def plot(records, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for spec in dict.fromkeys(r["verifier"] for r in records):
    cells = [r for r in records if r["verifier"] == spec]
    style = "--" if cells[0]["lossy"] else "-"
    label = spec + (" (lossy)" if cells[0]["lossy"] else "")
    g = [r["gamma"] for r in cells]
    axes[0].errorbar(g, [r["tokens_per_target_call"] for r in cells],
                     yerr=[1.96 * r["tokens_per_target_call_se"]
                           for r in cells], ls=style, marker="o", label=label)
    axes[1].plot(g, [r["speedup"] for r in cells], ls=style, marker="o",
                 label=label)
  axes[0].set(xlabel="gamma (draft tokens per round; equal draft compute)",
              ylabel="tokens per target call")
  axes[1].set(xlabel="gamma", ylabel="wall-clock speedup vs autoregressive")
  axes[1].axhline(1.0, color="grey", lw=0.5)
  axes[0].legend()
  fig.suptitle(f"verifiers on the {records[0]['models']} models (one run, "
               "shared CPU; lossy verifiers are not exact)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _ci95(values):
  values = np.asarray(values, np.float64)
  return 1.96 * float(values.std(ddof=1) / np.sqrt(len(values)))


def _at_depth(spec):
  """(verifier, depth) of a config.trees entry: a tree, or
  '<chain verifier>@<gamma>'."""
  name, _, gamma = spec.partition("@")
  v = vf.get_verifier(name)
  return v, (v.depth if isinstance(v, vf.TreeVerifier) else int(gamma))


def _quick_models(names, rows, prompt_len):
  """(target, {name: draft}, prompts, lengths) of the zoo's quick models
  (the quick job's recipes, configs/reproduce.py, so the cached models are
  reused, never retrained) and `rows` held-out prompts."""
  from specjax import data  # pylint: disable=import-outside-toplevel
  config = reproduce.get_config("quick")
  target = drafts_lib.load_target(config, train=False)

  def draft(name):
    # The EAGLE head experiments.eagle trains (300 steps).
    head = ({"overrides": reproduce.head_budget(300)}
            if name.startswith("eagle-head") else {})
    return drafts_lib.make_draft(name, target, config=config, train=False,
                                 **head).model

  loaded = {name: draft(name) for name in names}
  heldout = data.stdlib_corpus().tokens("heldout")
  prompts = data.prompts(heldout.astype(np.int32), rows, prompt_len, seed=0)
  return target, loaded, prompts, np.full(rows, prompt_len, np.int32)


def run_trees(trees, drafts, rows, max_new_tokens, prompt_len=64):
  """The token chain vs other verifiers of the same depth (trees, or chain
  verifiers at a gamma) on the zoo's quick models, T = 1."""
  target, loaded, prompts, lengths = _quick_models(drafts, rows, prompt_len)
  sampling = sj.SamplingConfig(temperature=1.0)
  records = []
  for name, draft in loaded.items():
    chains, chain_fns = {}, {}
    for spec in ["token"] + list(trees):
      v, depth = (vf.get_verifier("token"), None) if spec == "token" else (
          _at_depth(spec))
      depths = ([_at_depth(t)[1] for t in trees] if spec == "token"
                else [depth])
      for depth in dict.fromkeys(depths):
        tree = isinstance(v, vf.TreeVerifier)
        fn = functools.partial(
            sj.speculative_generate, target, draft, prompts, lengths,
            jax.random.key(depth), gamma=None if tree else depth,
            max_new_tokens=max_new_tokens, sampling=sampling, verifier=v)
        # Timed by turns with the chain of its depth, for seconds_vs_chain.
        out, secs = _side_by_side(
            fn, {} if spec == "token" else {"chain": chain_fns[depth]})
        if spec == "token":
          chain_fns[depth] = fn
        s = out.summary()
        per_row = (np.asarray(out.lengths)
                   / np.maximum(np.asarray(out.stats.target_calls), 1))
        rec = dict(
            models="quick", draft=name, verifier=v.spec,
            mode=getattr(v, "mode", "chain"), depth=depth,
            nodes=v.topology.num_nodes if tree else depth,
            tokens_per_target_call=s["tokens_per_target_call"],
            tokens_per_target_call_ci95=_ci95(per_row),
            alpha_hat=s["alpha_hat"], seconds=secs["this"],
            draft_calls_per_round=s["draft_calls"] / s["rounds"])
        if spec == "token":
          chains[depth] = rec
        else:
          chain = chains[depth]
          ratio = rec["tokens_per_target_call"] / chain[
              "tokens_per_target_call"]
          # The chain and this verifier run on the same key, so their
          # errors are somewhat correlated (their first tokens often agree):
          # adding the relative errors in quadrature, as for independent
          # runs, makes the interval a little wide, not narrow.
          rel = np.hypot(rec["tokens_per_target_call_ci95"]
                         / rec["tokens_per_target_call"],
                         chain["tokens_per_target_call_ci95"]
                         / chain["tokens_per_target_call"])
          rec.update(vs_chain=ratio, vs_chain_ci95=float(ratio * rel),
                     seconds_vs_chain=secs["chain"] / secs["this"])
        records.append(rec)
        print({k: (round(x, 4) if isinstance(x, float) else x)
               for k, x in rec.items()}, flush=True)
  return records


def run_paired(gammas, drafts, rows, max_new_tokens, samples,
               prompt_len=64):
  """Block vs token verification on the same drafts, Rao-Blackwellised
  (`specjax.harness.expected_tokens`), on the zoo's quick models, T = 1: the
  contexts are every position of `rows` texts sampled from the target."""
  target, loaded, prompts, lengths = _quick_models(drafts, rows, prompt_len)
  sampling = sj.SamplingConfig(temperature=1.0)
  text = sj.generate(target, prompts, lengths, jax.random.key(0),
                     max_new_tokens=max_new_tokens, sampling=sampling)
  records = []
  for name, draft in loaded.items():
    for gamma in gammas:
      start = time.perf_counter()
      out = expected_tokens.expected_tokens_per_round(
          target, draft, ("token", "block"), sampling, gamma=gamma,
          prompts_BxP=prompts, prompt_lengths_B=lengths,
          tokens_BxN=text.tokens, lengths_B=text.lengths,
          key=jax.random.key(gamma), samples=samples)
      (token, block), (token_se, block_se) = (out["tokens_per_round"],
                                              out["tokens_per_round_se"])
      rec = dict(models="quick", draft=name, gamma=gamma,
                 contexts=out["contexts"], blocks=out["blocks"],
                 token=token, token_ci95=1.96 * token_se,
                 block=block, block_ci95=1.96 * block_se,
                 block_vs_token=out["ratio"][1],
                 block_vs_token_ci95=1.96 * float(out["ratio_se"][1]),
                 seconds=time.perf_counter() - start)
      records.append(rec)
      print({k: (round(x, 4) if isinstance(x, float) else x)
             for k, x in rec.items()}, flush=True)
  return records


def paired_markdown(records) -> str:
  """The paired records as a README table: gain of block over token."""
  gammas = sorted({r["gamma"] for r in records})
  lines = ["| draft | " + " | ".join(f"gamma {g}" for g in gammas) + " |",
           "| --- |" + " --- |" * len(gammas)]
  for name in dict.fromkeys(r["draft"] for r in records):
    cells = {r["gamma"]: r for r in records if r["draft"] == name}
    lines.append(f"| {name} | " + " | ".join(
        f"{cells[g]['token']:.3f} -> {cells[g]['block']:.3f} "
        # (+ 0.0 turns a rounded -0.00, float noise at gamma 1, into +0.00)
        f"(**{round(100 * (cells[g]['block_vs_token'] - 1), 2) + 0.0:+.2f}% +- "
        f"{100 * cells[g]['block_vs_token_ci95']:.2f}**)"
        if g in cells else "" for g in gammas) + " |")
  return "\n".join(lines) + "\n"


def plot_trees(records, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  drafts = list(dict.fromkeys(r["draft"] for r in records))
  fig, axes = plt.subplots(1, len(drafts), figsize=(6 * len(drafts), 4.5),
                           squeeze=False)
  for ax, name in zip(axes[0], drafts):
    cells = [r for r in records if r["draft"] == name]
    labels = [f"{r['verifier']} ({r['nodes']})" for r in cells]
    colors = ["grey" if r["mode"] == "chain" else
              "tab:blue" if r["mode"] == "iid" else "tab:orange"
              for r in cells]
    ax.barh(range(len(cells)), [r["tokens_per_target_call"] for r in cells],
            xerr=[r["tokens_per_target_call_ci95"] for r in cells],
            color=colors)
    ax.set_yticks(range(len(cells)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="tokens per target call (95% CI)",
           title=f"target-3m / {name}, T=1")
  fig.suptitle("draft trees (blue iid, orange wor; nodes in brackets) vs "
               "the chain of the same depth (grey)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _write(records, stem):
  fields = list(dict.fromkeys(k for r in records for k in r))
  with open(stem + ".csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(records)


# The fields of a study config (configs/verifiers.py's study presets).
_FIELDS = ("models", "verifiers", "gammas", "trees", "quick_drafts",
           "paired_gammas", "samples", "rows", "max_new_tokens",
           "results_dir")
_MODELS = ("lab", "tiny", "quick")

# Fields read by one mode only (overridden with another they were ignored):
# the mode, and whether (quick, paired) is it.
_READ_WITH = {
    "trees": ("config.models=quick without config.paired_gammas",
              lambda quick, paired: quick and not paired),
    "quick_drafts": ("config.models=quick", lambda quick, paired: quick),
    "paired_gammas": ("config.models=quick", lambda quick, paired: quick),
    "samples": ("config.models=quick and config.paired_gammas",
                lambda quick, paired: quick and paired),
    "verifiers": ("config.models=lab or tiny",
                  lambda quick, paired: not quick),
    "gammas": ("config.models=lab or tiny", lambda quick, paired: not quick),
}


def check_config(config, given=()) -> dict:
  """The study's settings from `config` (configs/verifiers.py), every field
  checked before any model is loaded: raises ValueError or TypeError naming
  the field. `given`: the fields overridden on the command line, each of
  which the config's mode must read (else it was silently ignored)."""
  flag_checks.require_fields(
      config, _FIELDS, "the study's presets are configs/verifiers.py:lab, "
      "tiny, trees, ...; its sweep presets (configs/verifiers.py:sweep) run "
      "with python -m experiments.sweep")
  if config.models not in _MODELS:
    raise ValueError(f"config.models must be one of {', '.join(_MODELS)}, "
                     f"got {config.models!r}")
  flag_checks.positive(config, "rows", "max_new_tokens", "samples")
  # An empty list runs no cell, and an empty CSV replaces the last results.
  gammas = flag_checks.ints(config, "gammas", example="1,2,4")
  paired = flag_checks.ints(config, "paired_gammas", example="1,4",
                            empty=True)
  verifiers = flag_checks.names(config, "verifiers", sep=";",
                                example="token;block")
  for spec in verifiers:
    try:
      vf.get_verifier(spec)
    except ValueError as e:
      raise ValueError(f"config.verifiers entry {spec!r}: {e}") from None
  # Else a bad entry failed after the quick models loaded, an empty one when
  # plotting.
  trees = flag_checks.names(config, "trees", sep=";", example="tree-wor:3,2,1")
  for spec in trees:
    try:
      _, depth = _at_depth(spec)
    except ValueError as e:
      raise ValueError(
          f"config.trees entry {spec!r}: {e} (a tree, or '<chain verifier>@"
          "<gamma>', e.g. block@4)") from None
    if depth < 1:
      raise ValueError(f"config.trees entry {spec!r}: gamma >= 1.")
  # Else a bad name failed after the quick target loaded.
  drafts = flag_checks.names(config, "quick_drafts", example="bigram,self:1")
  layers = recipes.SIZES[reproduce.get_config("quick").target]["num_layers"]
  for name in drafts:
    try:
      drafts_lib.check_spec(name, num_layers=layers)
    except (TypeError, ValueError) as e:
      raise ValueError(f"config.quick_drafts {name!r}: {e}") from None
  quick = config.models == "quick"
  unread = [f"--config.{name} (read with {mode})"
            for name, (mode, reads) in _READ_WITH.items()
            if name in given and not reads(quick, bool(paired))]
  if unread:
    mode = f"config.models={config.models}" + (
        " with config.paired_gammas" if quick and paired else "")
    raise ValueError(f"{mode} does not read {', '.join(unread)}.")
  return dict(models=config.models, verifiers=verifiers, gammas=gammas,
              trees=trees, drafts=drafts, paired_gammas=paired,
              samples=config.samples, rows=config.rows,
              max_new_tokens=config.max_new_tokens)


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = flag_checks.loaded_config(_CONFIG)
  s = flag_checks.as_usage_error(check_config, config,
                                 flag_checks.overridden(_CONFIG))
  results_dir = flag_checks.as_usage_error(flag_checks.results_dir, config,
                                           _RESULTS)
  quick, paired = s["models"] == "quick", bool(s["paired_gammas"])
  distributed.initialize_from_flags()
  with sharding.using(distributed.mesh_from_flags()):
    if quick and paired:
      records = run_paired(s["paired_gammas"], s["drafts"], s["rows"],
                           s["max_new_tokens"], s["samples"])
    elif quick:
      records = run_trees(s["trees"], s["drafts"], s["rows"],
                          s["max_new_tokens"])
    else:
      records = run(s["models"], s["verifiers"], s["gammas"], s["rows"],
                    s["max_new_tokens"])
  if not distributed.is_primary():
    return
  os.makedirs(results_dir, exist_ok=True)
  if quick and paired:
    stem = os.path.join(results_dir, "paired_quick")
    _write(records, stem)
    with open(stem + ".md", "w") as f:
      f.write(paired_markdown(records))
    print(paired_markdown(records))
    print(f"{len(records)} cells -> {stem}.csv, {stem}.md")
    return
  if quick:
    stem = os.path.join(results_dir, "trees_quick")
    _write(records, stem)
    plot_trees(records, os.path.join(results_dir, "fig_trees_quick.png"))
    print(f"{len(records)} cells -> {stem}.csv")
    return
  stem = os.path.join(results_dir, f"verifiers_{s['models']}")
  _write(records, stem)
  plot(records, os.path.join(results_dir,
                             f"fig_verifiers_{s['models']}.png"))
  print(f"{len(records)} cells -> {stem}.csv")


if __name__ == "__main__":
  app.run(main)
