r"""EAGLE head vs token drafts: acceptance alpha on the quick target.

  python -m experiments.eagle                       # trains what is missing
  python -m experiments.eagle --config=configs/eagle.py:smoke
  python -m experiments.eagle --config.gammas=1,2,4 --results_dir=/tmp/eagle

configs/eagle.py holds the presets, their commands and every field; flags
beside --config: --results_dir (default: config.results_dir) and
--compilation_cache.

Loads from the zoo (training into the cache when missing) the quick job's
target-3m (configs/reproduce.py:quick) and, each with the same budget as the
quick job's distilled draft (config.num_steps, 300 steps of 16 x 256 bytes):

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
import os

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from specjax import _checks
from specjax import data
from specjax import distributed
from specjax import stats
from specjax.harness import drafts as drafts_lib
from specjax.train import eagle as eagle_train
from specjax.train import recipes
from configs import reproduce
from experiments import flag_checks

_CONFIG = flag_checks.define_config(
    "eagle.py:quick", "The study's config, e.g. configs/eagle.py:target600.")
flags.declare_key_flag("config")  # in --help, with this file's flags
_RESULTS = flags.DEFINE_string(
    "results_dir", None, "Output directory (default: config.results_dir).")
distributed.define_compilation_cache_flag()
flag_checks.require_results_dir(optional=True)

# The fields of a config of configs/eagle.py.
_FIELDS = ("gammas", "temperatures", "num_prompts", "prompt_len",
           "max_new_tokens", "num_steps", "target_steps", "head_workdir",
           "head_step", "seed", "cache_dir", "results_dir")
# The quick models' context (target-3m and the drafts): a round scores the
# prompt, the new tokens and gamma - 1 drafts past them.
_MAX_POSITIONS = recipes.SIZES[reproduce.get_config("quick").target][
    "max_positions"]


def _optional_positive(config, name):
  if config[name] is not None:
    flag_checks.positive(config, name)


def check_config(config) -> dict:
  """The study's settings from `config` (configs/eagle.py), every field
  checked before any model is trained: raises ValueError or TypeError
  naming the field. An empty list would train every model and then have no
  row to write."""
  flag_checks.require_fields(
      config, _FIELDS, "its presets are configs/eagle.py:quick, target600 "
      "and smoke")
  gammas = flag_checks.ints(config, "gammas", example="1,4")
  temperatures = flag_checks.numbers(config, "temperatures", example="0,1")
  flag_checks.positive(config, "num_prompts", "prompt_len", "max_new_tokens",
                       "num_steps")
  _checks.check_int("config.seed", config.seed, low=0)
  _optional_positive(config, "target_steps")
  if (config.prompt_len + config.max_new_tokens + max(gammas) - 1
      > _MAX_POSITIONS):
    raise ValueError(
        "config.prompt_len + config.max_new_tokens + the largest "
        f"config.gammas - 1 must be <= {_MAX_POSITIONS}, the quick models' "
        f"max_positions; got {config.prompt_len} + {config.max_new_tokens} "
        f"+ {max(gammas)} - 1")
  if config.head_workdir is not None and not os.path.isdir(
      config.head_workdir):
    raise ValueError("config.head_workdir must be an existing training "
                     "workdir (a train_head run's), got "
                     f"{config.head_workdir!r}")
  if config.head_step is not None:
    if config.head_workdir is None:
      raise ValueError("config.head_step picks a checkpoint of "
                       "config.head_workdir; pass both, or neither")
    _checks.check_int("config.head_step", config.head_step, low=0)
  return dict(gammas=gammas, temperatures=temperatures)


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


def _command(config, results_dir) -> str:
  """The command that reruns this table: its preset and every field that
  shapes it, overridden or not (a rerun under other defaults would measure
  something else)."""
  parts = [f"--config=configs/eagle.py:{config.preset}",
           f"--config.num_prompts={config.num_prompts}",
           f"--config.prompt_len={config.prompt_len}",
           f"--config.max_new_tokens={config.max_new_tokens}",
           f"--config.num_steps={config.num_steps}",
           "--config.gammas=" + ",".join(map(str, config.gammas)),
           "--config.temperatures=" + ",".join(
               f"{float(t):g}" for t in config.temperatures),
           f"--config.seed={config.seed}"]
  if config.target_steps:
    parts.append(f"--config.target_steps={config.target_steps}")
  if config.head_workdir:
    parts.append("--config.head_workdir=<that dir> "
                 f"--config.head_step={config.head_step}")
  return " ".join(parts + [f"--results_dir={results_dir}"])


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = flag_checks.loaded_config(_CONFIG)
  s = flag_checks.as_usage_error(check_config, config)
  results_dir = flag_checks.as_usage_error(flag_checks.results_dir, config,
                                           _RESULTS)
  distributed.use_compilation_cache(flags.FLAGS.compilation_cache)
  target, drafts = load_models(config.num_steps, config.cache_dir,
                               config.head_workdir, config.head_step,
                               config.target_steps)
  corpus = data.stdlib_corpus()
  heldout = corpus.tokens("heldout").astype(np.int32)
  prompts = data.prompts(heldout, config.num_prompts, config.prompt_len,
                         config.seed)
  rows = run(target, drafts, prompts, s["gammas"], s["temperatures"],
             config.max_new_tokens, config.seed)
  target_steps = config.target_steps
  header = ("EAGLE head vs token drafts on the quick target-3m"
            + (f" trained {target_steps} steps (not 150)" if target_steps
               else "") + ": "
            f"{config.num_prompts} held-out prompts of {config.prompt_len} "
            f"bytes, {config.max_new_tokens} new bytes each, seed "
            f"{config.seed}; every draft trained {config.num_steps} steps of "
            "16 x 256 bytes.\n"
            "params: the draft's own (the head's excludes the target's "
            "shared embedding and LM head).\n"
            + (f"The head is the checkpoint at step {config.head_step} "
               f"(latest if None) of {config.head_workdir}.\n"
               if config.head_workdir else "")
            + "Command: python -m experiments.eagle "
            + _command(config, results_dir))
  write(rows, results_dir, header)


if __name__ == "__main__":
  app.run(main)
