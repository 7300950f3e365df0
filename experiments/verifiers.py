r"""Verifier comparison: tokens per target call and speedup vs gamma.

  python -m experiments.verifiers --models=lab --results_dir=results/verifiers
  python -m experiments.verifiers --models=tiny --results_dir=results/verifiers

For every verifier (token, block, lossy baselines) and gamma, decodes the same
prompts with `speculative_generate(..., verifier=...)` (same draft, same
gamma: equal draft compute) and the autoregressive baseline, and writes
`verifiers_<models>.csv` (one row per cell, with a "lossy" column and, for
the lab models, the verifier's exact TV to the target from
`specjax.lab.verifiers`) and `fig_verifiers_<models>.png`.

--models=lab: the lab's Markov target/draft (V = 8) as CausalLMs; tokens per
  target call is meaningful, wall-clock is not (target as cheap as draft).
--models=tiny: a random peaked Transformer target (d=128, 4 layers) and a
  bigram draft fitted to 16k of the target's own samples.

Draft trees against the chain (same draft, same depth = gamma):

  python -m experiments.verifiers --models=quick --rows=64 --max_new_tokens=64 \
      --results_dir=results/verifiers
  python -m experiments.verifiers --models=quick --rows=64 --max_new_tokens=64 \
      --quick_drafts=bigram --trees="tree-wor:4,3;tree-wor:8,1" \
      --results_dir=results/verifiers/depth2

--models=quick: the zoo's target-3m with distilled-draft-0.1m@target-3m and
  the bigram draft (or self:k, `--quick_drafts=self:1`, or the EAGLE head
  of `python -m experiments.eagle`, `eagle-head@target-3m`), held-out
  prompts, T = 1. For every tree in --trees
  (';'-separated registry strings) and the chain "token" at the tree's depth,
  writes `trees_quick.csv` (tokens per target call with a 95% interval, the
  ratio tree / chain with its interval, wall-clock seconds of the compiled
  call, the fewest of 3 timed by turns with the chain's: noise on a shared
  box) and `fig_trees_quick.png`.
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
from experiments import flag_checks

_MODELS = flags.DEFINE_enum("models", "lab", ["lab", "tiny", "quick"],
                            "Model pair (quick: zoo models, trees vs chain).")
_TREES = flags.DEFINE_string(
    "trees", "tree-wor:3,2,1;tree:3,2,1;tree-wor:4,1,1",
    "';'-separated verifiers set beside the token chain of the same depth "
    "(--models=quick): trees (each <= 16 nodes; the depth is theirs) or "
    "chain verifiers at a gamma, as '<verifier>@<gamma>' (block@4).")
_QUICK_DRAFTS = flags.DEFINE_list(
    "quick_drafts", ["distilled-draft-0.1m@target-3m", "bigram"],
    "Zoo drafts for --models=quick, self:k (the target's first k blocks, "
    "sharing its cache) or eagle-head@target-3m (experiments.eagle's head).")
_VERIFIERS = flags.DEFINE_string(
    "verifiers", "token;block;lenient:0.5;typical:0.09,0.3",
    "';'-separated registry strings (specjax.decode.verifiers); ';', since "
    "a verifier's own arguments take commas (typical:0.09,0.3).")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "2", "3", "4", "6"], "gammas.")
_ROWS = flags.DEFINE_integer("rows", 256, "Rows decoded per cell (a batch).",
                             lower_bound=1)
_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Tokens per row.",
                            lower_bound=1)
_RESULTS = flags.DEFINE_string("results_dir", "results/verifiers", "Output.")
_PAIRED = flags.DEFINE_list(
    "paired_gammas", [],
    "--models=quick: instead of trees, block vs token on the same drafts at "
    "these gammas, Rao-Blackwellised (specjax.harness.expected_tokens).")
_SAMPLES = flags.DEFINE_integer(
    "samples", 4, "--paired_gammas: draft blocks per context.", lower_bound=1)
distributed.define_flags()
distributed.define_dtype_flags()


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
  """(verifier, depth) of a --trees entry: a tree, or '<chain verifier>@g'."""
  name, _, gamma = spec.partition("@")
  v = vf.get_verifier(name)
  return v, (v.depth if isinstance(v, vf.TreeVerifier) else int(gamma))


def _quick_models(names, rows, prompt_len):
  """(target, {name: draft}, prompts, lengths) of the zoo's quick models
  (the quick job's recipes, configs/reproduce.py, so the cached models are
  reused, never retrained) and `rows` held-out prompts."""
  from configs import reproduce  # pylint: disable=import-outside-toplevel
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


def _specs(text):
  """The entries of a ';'-separated flag (--verifiers, --trees)."""
  return [v for v in text.split(";") if v]


@flags.validator("verifiers")
def _check_verifiers(text):
  # Else no cell runs, and an empty CSV replaces the last results.
  if not _specs(text):
    raise flags.ValidationError("--verifiers must name at least one verifier "
                                "(';'-separated), e.g. --verifiers=token;block")
  for spec in _specs(text):
    try:
      vf.get_verifier(spec)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from None
  return True


@flags.validator("trees")
def _check_trees(text):
  # Else a bad entry fails after the quick models load, an empty one when
  # plotting.
  if not _specs(text):
    raise flags.ValidationError("--trees must name at least one verifier "
                                "(';'-separated), e.g. --trees=tree-wor:3,2,1")
  for spec in _specs(text):
    try:
      _, depth = _at_depth(spec)
    except ValueError as e:
      raise flags.ValidationError(
          f"--trees entry {spec!r}: {e} (a tree, or '<chain verifier>@<gamma>'"
          ", e.g. block@4)") from None
    if depth < 1:
      raise flags.ValidationError(f"--trees entry {spec!r}: gamma >= 1.")
  return True


flags.register_validator(
    "quick_drafts", bool,
    "--quick_drafts must name at least one draft, e.g. --quick_drafts=bigram")


@flags.validator("quick_drafts")
def _check_quick_drafts(names):
  # Else a bad name failed after the quick target loaded.
  from configs import reproduce  # pylint: disable=import-outside-toplevel
  from specjax.train import recipes  # pylint: disable=import-outside-toplevel
  layers = recipes.SIZES[reproduce.get_config("quick").target]["num_layers"]
  for name in names:
    try:
      drafts_lib.check_spec(name, num_layers=layers)
    except (TypeError, ValueError) as e:
      raise flags.ValidationError(f"--quick_drafts {name!r}: {e}") from None
  return True


# Flags read by one mode only (given with another they were ignored): the
# mode, and whether (quick, paired) is it.
_READ_WITH = {
    "trees": ("--models=quick without --paired_gammas",
              lambda quick, paired: quick and not paired),
    "quick_drafts": ("--models=quick", lambda quick, paired: quick),
    "paired_gammas": ("--models=quick", lambda quick, paired: quick),
    "samples": ("--models=quick --paired_gammas=...",
                lambda quick, paired: quick and paired),
    "verifiers": ("--models=lab or tiny", lambda quick, paired: not quick),
    "gammas": ("--models=lab or tiny", lambda quick, paired: not quick),
}


def _check_modes():
  """A usage error for a flag the chosen mode does not read."""
  quick, paired = _MODELS.value == "quick", bool(_PAIRED.value)
  unread = [f"--{name} (read with {mode})"
            for name, (mode, reads) in _READ_WITH.items()
            if flags.FLAGS[name].present and not reads(quick, paired)]
  if unread:
    mode = f"--models={_MODELS.value}" + (" --paired_gammas=..."
                                          if quick and paired else "")
    raise app.UsageError(f"{mode} does not read {', '.join(unread)}.")


# Checked when the flags are parsed, before any model is loaded: an empty
# --gammas runs no cell and writes an empty CSV over the last results.
flags.register_validator(
    "gammas",
    lambda v: bool(v) and flag_checks.positive_ints(v),
    "--gammas must be one or more ints >= 1, e.g. --gammas=1,2,4")
flags.register_validator(
    "paired_gammas",
    flag_checks.positive_ints,
    "--paired_gammas must be ints >= 1, e.g. --paired_gammas=1,4")


flag_checks.require_results_dir()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  _check_modes()
  distributed.initialize_from_flags()
  with sharding.using(distributed.mesh_from_flags()):
    if _MODELS.value == "quick" and _PAIRED.value:
      records = run_paired([int(g) for g in _PAIRED.value],
                           _QUICK_DRAFTS.value, _ROWS.value, _NEW.value,
                           _SAMPLES.value)
    elif _MODELS.value == "quick":
      records = run_trees(_specs(_TREES.value),
                          _QUICK_DRAFTS.value, _ROWS.value, _NEW.value)
    else:
      records = run(_MODELS.value, _specs(_VERIFIERS.value),
                    [int(g) for g in _GAMMAS.value], _ROWS.value, _NEW.value)
  if not distributed.is_primary():
    return
  if _MODELS.value == "quick" and _PAIRED.value:
    os.makedirs(_RESULTS.value, exist_ok=True)
    stem = os.path.join(_RESULTS.value, "paired_quick")
    _write(records, stem)
    with open(stem + ".md", "w") as f:
      f.write(paired_markdown(records))
    print(paired_markdown(records))
    print(f"{len(records)} cells -> {stem}.csv, {stem}.md")
    return
  if _MODELS.value == "quick":
    os.makedirs(_RESULTS.value, exist_ok=True)
    stem = os.path.join(_RESULTS.value, "trees_quick")
    _write(records, stem)
    plot_trees(records, os.path.join(_RESULTS.value, "fig_trees_quick.png"))
    print(f"{len(records)} cells -> {stem}.csv")
    return
  os.makedirs(_RESULTS.value, exist_ok=True)
  stem = os.path.join(_RESULTS.value, f"verifiers_{_MODELS.value}")
  _write(records, stem)
  plot(records, os.path.join(_RESULTS.value,
                             f"fig_verifiers_{_MODELS.value}.png"))
  print(f"{len(records)} cells -> {stem}.csv")


if __name__ == "__main__":
  app.run(main)
