r"""EAGLE head vs token drafts: acceptance alpha on the quick target.

  python -m experiments.eagle                       # trains what is missing
  python -m experiments.eagle --num_prompts=8 --max_new_tokens=32   # smoke

Loads from the zoo (training into the cache when missing) the quick job's
target-3m (configs/reproduce.py:quick) and, each with the same budget as the
quick job's distilled draft (300 steps of 16 x 256 bytes):

  eagle-head@target-3m             the feature-level head (560,960 parameters
                                   of its own: input norms, fc, one block;
                                   the target's embedding and LM head are
                                   shared)
  distilled-draft-0.5m@target-3m   an independent draft of the same size
                                   (561,024 parameters, all its own),
                                   distilled from the target (forward KL)
  draft-0.5m                       the same size trained on the corpus text
  distilled-draft-0.1m@target-3m   the quick job's distilled draft (118,224)

then decodes the same held-out prompts with each at every gamma and
temperature and reports alpha = accepted / verified drafts with a 95%
interval. Rows are the independent units (positions within a row are not),
so the interval is the ratio estimator's delta-method interval over rows:
alpha +- 1.96 sqrt(n / (n - 1) * sum_i (a_i - alpha v_i)^2) / sum_i v_i.
`one_minus_tv` (mean sum_x min(p, q) over the verified positions) estimates
the same acceptance with less noise. alpha is a count, not a timing, so it is
valid on a busy machine.

Writes `<results_dir>/eagle.csv` and `<results_dir>/eagle.md`.
"""

from __future__ import annotations

import csv
import math
import os

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import data
from specjax import distributed
from specjax import stats
from specjax.harness import drafts as drafts_lib
from specjax.train import eagle as eagle_train
from specjax.train import recipes
from configs import reproduce
from experiments import flag_checks

_GAMMAS = flags.DEFINE_list("gammas", ["1", "4"], "Draft lengths.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"],
                                  "Sampling temperatures (0: greedy).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 64,
                                    "Held-out prompts (decoded as one batch).",
                                    lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt bytes.",
                                   lower_bound=1)
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per prompt.",
                            lower_bound=1)
_STEPS = flags.DEFINE_integer(
    "num_steps", 300, "Training steps of every draft and of the head (16 x "
    "256 bytes each; the quick job's distilled draft uses 300).",
    lower_bound=1)
_TARGET_STEPS = flags.DEFINE_integer(
    "target_steps", None, "Train the target this many steps of 16 x 256 "
    "bytes instead of the quick job's 150 (a stronger target; every draft "
    "is then distilled from it).", lower_bound=1)
_HEAD_WORKDIR = flags.DEFINE_string(
    "head_workdir", None, "Evaluate the head checkpoint in this training "
    "workdir (e.g. a zoo entry's .partial while it trains) instead of the "
    "zoo's finished eagle-head entry.")
_HEAD_STEP = flags.DEFINE_integer("head_step", None, "With --head_workdir: "
                                  "the checkpoint step (default: latest).")
_SEED = flags.DEFINE_integer("seed", 0, "Prompts and decoding keys.")
_CACHE = flags.DEFINE_string("cache_dir", None, "Zoo cache (default: "
                             "$SPECJAX_CACHE or ~/.cache/specjax).")
_RESULTS = flags.DEFINE_string("results_dir", "results/eagle", "Output.")
distributed.define_compilation_cache_flag()
# Checked when the flags are parsed, before any model is trained. An empty
# list would train every model and then have no row to write.
flags.register_validator(
    "gammas",
    lambda v: bool(v) and flag_checks.positive_ints(v),
    "--gammas must be one or more ints >= 1, e.g. --gammas=1,4")
flags.register_validator(
    "temperatures", lambda v: bool(v) and all(_nonnegative(t) for t in v),
    "--temperatures must be one or more numbers >= 0 (0: greedy), e.g. "
    "--temperatures=0,1")


def _nonnegative(text: str) -> bool:
  try:
    return math.isfinite(float(text)) and float(text) >= 0
  except ValueError:
    return False


# The quick models' context (target-3m and the drafts): a round scores the
# prompt, the new tokens and gamma - 1 drafts past them.
_MAX_POSITIONS = recipes.SIZES[reproduce.get_config("quick").target][
    "max_positions"]
flags.register_multi_flags_validator(
    ["prompt_len", "max_new_tokens", "gammas"],
    lambda f: (not flag_checks.positive_ints(f["gammas"] or ["x"])
               or f["prompt_len"] + f["max_new_tokens"]
               + max(map(int, f["gammas"])) - 1 <= _MAX_POSITIONS),
    f"--prompt_len + --max_new_tokens + the largest --gammas - 1 must be <= "
    f"{_MAX_POSITIONS}, the quick models' max_positions")
flags.register_validator(
    "head_workdir", lambda v: v is None or os.path.isdir(v),
    "--head_workdir must be an existing training workdir (a train_head run's)")
flags.register_multi_flags_validator(
    ["head_workdir", "head_step"],
    lambda f: f["head_step"] is None or f["head_workdir"] is not None,
    "--head_step picks a checkpoint of --head_workdir; pass both, or neither")
flag_checks.require_results_dir()


def load_models(num_steps: int, cache_dir: str | None,
                head_workdir: str | None = None, head_step: int | None = None,
                target_steps: int | None = None):
  """(target, {name: draft}) from the zoo, every draft on the same budget.

  With `head_workdir`, the head is that checkpoint's instead of the zoo's;
  with `target_steps`, the target trains that long instead of the quick
  job's 150 steps.
  """
  config = reproduce.get_config("quick")
  config.cache_dir = cache_dir
  if target_steps:
    config.target_overrides = tuple(sorted({
        **dict(config.target_overrides), "num_steps": target_steps,
        "optim.warmup_steps": max(1, target_steps // 10)}.items()))
  target = drafts_lib.load_target(config)
  if head_workdir:
    head, meta = eagle_train.load_head(head_workdir, target, head_step)
    print(f"head from {head_workdir}, step {meta['step']}", flush=True)
  else:
    head = drafts_lib.make_draft(
        f"eagle-head@{config.target}", target, config=config,
        overrides=reproduce.head_budget(num_steps)).model
  # Distilled drafts learn from the target above (the config's).
  budget = reproduce.draft_budget(num_steps)
  drafts = {name.split("@")[0]: drafts_lib.make_draft(
      name, target, config=config, overrides=budget).model
            for name in (f"distilled-draft-0.5m@{config.target}",
                         "draft-0.5m",
                         f"distilled-draft-0.1m@{config.target}")}
  return target, {"eagle-head": head, **drafts}


def run(target, drafts, prompts_NxP, gammas, temperatures, max_new_tokens,
        seed):
  """One row per (draft, temperature, gamma)."""
  lengths_N = np.full(prompts_NxP.shape[0], prompts_NxP.shape[1], np.int32)
  rows = []
  for name, draft in drafts.items():
    for temperature in temperatures:
      sampling = sj.SamplingConfig(temperature=temperature)
      for gamma in gammas:
        out = sj.speculative_generate(
            target, draft, prompts_NxP, lengths_N, jax.random.key(seed),
            gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling)
        s = out.summary()
        alpha, se = stats.clustered_alpha(out.stats.accepted,
                                          out.stats.verified)
        low, high = alpha - 1.96 * se, alpha + 1.96 * se
        rows.append({
            "draft": name, "params": draft.param_count(),
            "temperature": temperature, "gamma": gamma,
            "alpha": alpha, "alpha_low": low, "alpha_high": high,
            "one_minus_tv": s["one_minus_tv"],
            "tokens_per_target_call": s["tokens_per_target_call"],
            "verified": int(np.sum(out.stats.verified))})
        print(f"{name:22s} T={temperature:g} gamma={gamma}: alpha "
              f"{alpha:.3f} [{low:.3f}, {high:.3f}], 1-TV "
              f"{s['one_minus_tv']:.3f}", flush=True)
  return rows


def write(rows, results_dir, header):
  os.makedirs(results_dir, exist_ok=True)
  with open(os.path.join(results_dir, "eagle.csv"), "w", newline="") as fh:
    writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  lines = [header, "",
           "| draft | params | T | gamma | alpha [95% interval] | 1 - TV | "
           "tokens / target call |", "| --- | --- | --- | --- | --- | --- | "
           "--- |"]
  for r in rows:
    lines.append(
        f"| {r['draft']} | {r['params']:,} | {r['temperature']:g} | "
        f"{r['gamma']} | {r['alpha']:.3f} [{r['alpha_low']:.3f}, "
        f"{r['alpha_high']:.3f}] | {r['one_minus_tv']:.3f} | "
        f"{r['tokens_per_target_call']:.2f} |")
  text = "\n".join(lines) + "\n"
  with open(os.path.join(results_dir, "eagle.md"), "w") as fh:
    fh.write(text)
  print(text)


def _command() -> str:
  """The flags that rerun this table: every one that shapes it, set or not
  (a rerun under other defaults would measure something else)."""
  parts = [f"--num_prompts={_NUM_PROMPTS.value}",
           f"--prompt_len={_PROMPT_LEN.value}",
           f"--max_new_tokens={_NEW.value}", f"--num_steps={_STEPS.value}",
           f"--gammas={','.join(_GAMMAS.value)}",
           f"--temperatures={','.join(_TEMPERATURES.value)}",
           f"--seed={_SEED.value}"]
  if _TARGET_STEPS.value:
    parts.append(f"--target_steps={_TARGET_STEPS.value}")
  if _HEAD_WORKDIR.value:
    parts.append(f"--head_workdir=<that dir> --head_step={_HEAD_STEP.value}")
  return " ".join(parts + [f"--results_dir={_RESULTS.value}"])


def main(argv):
  del argv
  distributed.use_compilation_cache(flags.FLAGS.compilation_cache)
  target, drafts = load_models(_STEPS.value, _CACHE.value,
                               _HEAD_WORKDIR.value, _HEAD_STEP.value,
                               _TARGET_STEPS.value)
  corpus = data.stdlib_corpus()
  heldout = corpus.tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, _NUM_PROMPTS.value, _PROMPT_LEN.value,
                         _SEED.value)
  gammas = [int(g) for g in _GAMMAS.value]
  temperatures = [float(t) for t in _TEMPERATURES.value]
  rows = run(target, drafts, prompts, gammas, temperatures, _NEW.value,
             _SEED.value)
  target_steps = _TARGET_STEPS.value
  header = (f"EAGLE head vs token drafts on the quick target-3m"
            + (f" trained {target_steps} steps (not 150)" if target_steps
               else "") + ": "
            f"{_NUM_PROMPTS.value} held-out prompts of {_PROMPT_LEN.value} "
            f"bytes, {_NEW.value} new bytes each, seed {_SEED.value}; every "
            f"draft trained {_STEPS.value} steps of 16 x 256 bytes.\n"
            "params: the draft's own (the head's excludes the target's "
            "shared embedding and LM head).\n"
            + (f"The head is the checkpoint at step {_HEAD_STEP.value} "
               f"(latest if None) of {_HEAD_WORKDIR.value}.\n"
               if _HEAD_WORKDIR.value else "")
            + "Command: python -m experiments.eagle " + _command())
  write(rows, _RESULTS.value, header)


if __name__ == "__main__":
  app.run(main)
