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
"""

from __future__ import annotations

import csv
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
from specjax.lab import models as lab_models
from specjax.lab import verifiers as lab_verifiers
from specjax.models.ngram import NGramLM

_MODELS = flags.DEFINE_enum("models", "lab", ["lab", "tiny"], "Model pair.")
_VERIFIERS = flags.DEFINE_list(
    "verifiers", ["token", "block", "lenient:0.5", "typical:0.09,0.3"],
    "Registry strings (specjax.decode.verifiers).")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "2", "3", "4", "6"], "gammas.")
_ROWS = flags.DEFINE_integer("rows", 256, "Rows decoded per cell (a batch).")
_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Tokens per row.")
_RESULTS = flags.DEFINE_string("results_dir", "results/verifiers", "Output.")
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


def _timed(fn):
  jax.block_until_ready(fn().tokens)  # compile
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - start


def run(kind, verifiers, gammas, rows, max_new_tokens):
  target, draft, pair = _models(kind)
  rng = np.random.default_rng(1)
  prompts = rng.integers(0, target.vocab_size, (rows, 4)).astype(np.int32)
  lengths = np.full(rows, 4, np.int32)
  base, base_s = _timed(lambda: sj.generate(
      target, prompts, lengths, jax.random.key(0),
      max_new_tokens=max_new_tokens))
  records = []
  for spec in verifiers:
    v = vf.get_verifier(spec)
    for gamma in gammas:
      out, secs = _timed(lambda: sj.speculative_generate(
          target, draft, prompts, lengths, jax.random.key(gamma),
          gamma=gamma, max_new_tokens=max_new_tokens, verifier=v))
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
          speedup=base_s / secs, lab_exact_tv_4_tokens=lab_tv))
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


def main(argv):
  del argv
  distributed.initialize_from_flags()
  with sharding.using(distributed.mesh_from_flags()):
    records = run(_MODELS.value, _VERIFIERS.value,
                  [int(g) for g in _GAMMAS.value], _ROWS.value, _NEW.value)
  if not distributed.is_primary():
    return
  os.makedirs(_RESULTS.value, exist_ok=True)
  stem = os.path.join(_RESULTS.value, f"verifiers_{_MODELS.value}")
  with open(stem + ".csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
  plot(records, os.path.join(_RESULTS.value,
                             f"fig_verifiers_{_MODELS.value}.png"))
  print(f"{len(records)} cells -> {stem}.csv")


if __name__ == "__main__":
  app.run(main)
