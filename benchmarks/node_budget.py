r"""Exact verifiers at equal node budgets, on the quick job's models.

  python -m benchmarks.node_budget --results_dir=results/node_budget

A round's target pass scores its root and N draft nodes; this compares every
exact verifier the loop has at N = 4, 8 and 16 scored draft nodes: chains of
gamma = N (token, block), and trees of N nodes (SpecInfer's i.i.d. children
"tree", RSD's without replacement "tree-wor", Traversal Verification,
SpecTr's K-SEQ "spectr", Hu et al.'s greedy drafts "greedy-draft" and
Khisti et al.'s canonical verifier "canonical", on the trees of at most 2
children per node it judges: 2,1 and 2,1,1,1), on the zoo's quick target
(target-3m) with the draft distilled from it, at T = 1 and T = 0.7. Every
decoder runs the same prompts (windows of the corpus's held-out files) with
the same keys, so each row is paired across decoders: tokens per target
call, its gain over tree-wor at the same budget with a 95% bootstrap
interval over rows (`specjax.stats.paired_ratio_gain`), and tokens/s (the
fastest of `--repeats` calls, all decoders of a budget taking turns)
beside it.

With `--results_dir`, writes node_budget.json and its tables (tables.md)
there, after every budget.
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from configs import reproduce
from specjax import stats
from specjax.data import corpus as corpus_lib
from specjax.decode import verifiers as verifiers_lib
from specjax.harness import measure
from specjax.harness import roofline
from specjax.harness import zoo

_RESULTS_DIR = flags.DEFINE_string("results_dir", None,
                                   "Write node_budget.json here.")
_ROWS = flags.DEFINE_integer("rows", 512, "Prompts (rows).", lower_bound=2)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt bytes.",
                                   lower_bound=2)
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 64, "Budget.",
                                       lower_bound=1)
_TEMPERATURES = flags.DEFINE_list("temperatures", ["1.0", "0.7"],
                                  "Sampling temperatures.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per decoder.",
                                lower_bound=1)
_BUDGETS = flags.DEFINE_list("budgets", ["4", "8", "16"],
                             "Draft nodes per target pass (of 4, 8, 16).")

# Trees of exactly N nodes: k chains of N / k below the root.
TREES = {4: ("2,1", "4"), 8: ("2,1,1,1", "4,1"), 16: ("4,1,1,1", "8,1")}
BASELINE = "tree-wor"


def _decoders(budget: int) -> list[tuple[str, str, int | None]]:
  """(label, verifier spec, gamma) of every exact decoder at this budget."""
  out = [(f"token:{budget}", "token", budget),
         (f"block:{budget}", "block", budget)]
  for topology in TREES[budget]:
    for family in ("tree", "tree-wor", "traversal", "traversal-wor",
                   "spectr", "greedy-draft", "canonical"):
      spec = f"{family}:{topology}"
      try:
        verifiers_lib.get_verifier(spec)
      except ValueError:  # not registered in this checkout, or a tree the
        continue          # rule refuses (canonical: over 2 children a node)
      out.append((spec, spec, None))
  return out


def _prompts(rows: int, length: int) -> np.ndarray:
  tokens = corpus_lib.stdlib_corpus().tokens("heldout")
  rng = np.random.default_rng(0)
  starts = []
  while len(starts) < rows:
    s = int(rng.integers(0, tokens.size - length))
    window = tokens[s:s + length]
    if (window < 256).all():  # text only: no BOS or EOS inside
      starts.append(s)
  return np.stack([tokens[s:s + length] for s in starts]).astype(np.int32)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not set(int(b) for b in _BUDGETS.value) <= set(TREES):
    raise app.UsageError(f"--budgets takes some of {sorted(TREES)}.")
  host = roofline.host_reading()
  print(f"host: {host['cpu']}, {host['cores']} cores, read "
        f"{host['read_gb_per_s']:.1f} GB/s")
  target = zoo.load("target-3m", overrides=reproduce.QUICK_TARGET)
  draft = zoo.load("distilled-draft-0.1m@target-3m",
                   overrides=reproduce.QUICK_DRAFT,
                   teacher_overrides=reproduce.QUICK_TARGET)
  prompts = _prompts(_ROWS.value, _PROMPT_LEN.value)
  lengths = np.full(prompts.shape[0], prompts.shape[1], np.int32)
  key = jax.random.key(0)
  rows = []
  for temperature in (float(t) for t in _TEMPERATURES.value):
    sampling = sj.SamplingConfig(temperature=temperature)
    for budget in sorted(int(b) for b in _BUDGETS.value):
      decoders = _decoders(budget)
      calls = {label: (lambda spec=spec, gamma=gamma:
                       sj.speculative_generate(
                           target, draft, prompts, lengths, key, gamma=gamma,
                           verifier=spec, max_new_tokens=_MAX_NEW_TOKENS.value,
                           sampling=sampling))
               for label, spec, gamma in decoders}
      outs = {}
      times = measure.interleaved_times(calls, _REPEATS.value, outputs=outs)
      per_row = {label: (np.asarray(out.lengths),
                         np.asarray(out.stats.target_calls))
                 for label, out in outs.items()}
      baselines = {label: label for label in per_row
                   if label.startswith(BASELINE + ":")}
      print(f"--- T = {temperature}, {budget} draft nodes per target pass")
      for label, (tokens_R, calls_R) in per_row.items():
        # Against tree-wor on the same tree; a chain against the budget's
        # first tree.
        base = f"{BASELINE}:{label.split(':', 1)[1]}"
        if label.startswith(("token:", "block:")) or base not in baselines:
          base = f"{BASELINE}:{TREES[budget][0]}"
        gain = stats.paired_ratio_gain(tokens_R, calls_R, *per_row[base])
        row = {"temperature": temperature, "nodes": budget,
               "decoder": label, "baseline": base,
               "tokens_per_target_call": float(tokens_R.sum() / calls_R.sum()),
               "gain_vs_baseline": gain[0], "gain_low": gain[1],
               "gain_high": gain[2],
               "tokens_per_s": float(tokens_R.sum() / min(times[label]))}
        rows.append(row)
        print(f"{label:22s} {row['tokens_per_target_call']:.3f} tokens per "
              f"target call, vs {base}: {100 * gain[0]:+.1f}% "
              f"[{100 * gain[1]:+.1f}%, {100 * gain[2]:+.1f}%]; "
              f"{row['tokens_per_s']:.0f} tokens/s")
      # After every budget: a long run stopped early keeps what it measured.
      if _RESULTS_DIR.value:
        _write(host, prompts, rows)
      # No later budget reuses these programs, and every compiled program
      # stays mapped: a whole run held over half the kernel's limit on
      # memory maps (`specjax.jit_memory`).
      jax.clear_caches()


def _write(host, prompts, rows):
  os.makedirs(_RESULTS_DIR.value, exist_ok=True)
  path = os.path.join(_RESULTS_DIR.value, "node_budget.json")
  with open(path, "w") as f:
    json.dump({"host": host, "rows_per_decoder": int(prompts.shape[0]),
               "prompt_len": _PROMPT_LEN.value,
               "max_new_tokens": _MAX_NEW_TOKENS.value, "results": rows},
              f, indent=1)
  tables = os.path.join(_RESULTS_DIR.value, "tables.md")
  with open(tables, "w") as f:
    f.write(_markdown(host, rows))
  print(f"wrote {path} and {tables}")


def _markdown(host, rows) -> str:
  """The rows as one markdown table per (temperature, budget)."""
  out = [f"Host: {host['cpu']}, {host['cores']} cores, read "
         f"{host['read_gb_per_s']:.1f} GB/s.\n"]
  groups = {}
  for r in rows:
    groups.setdefault((r["temperature"], r["nodes"]), []).append(r)
  for (temperature, nodes), group in groups.items():
    out += [f"\n### T = {temperature:g}, {nodes} draft nodes per target "
            "pass\n",
            "| decoder | tokens per target call | vs tree-wor (same tree) | "
            "95% interval | tokens/s |",
            "| --- | --- | --- | --- | --- |"]
    out += [f"| {r['decoder']} | {r['tokens_per_target_call']:.3f} | "
            f"{100 * r['gain_vs_baseline']:+.1f}% ({r['baseline']}) | "
            f"[{100 * r['gain_low']:+.1f}%, {100 * r['gain_high']:+.1f}%] | "
            f"{r['tokens_per_s']:.0f} |" for r in group]
  return "\n".join(out) + "\n"


if __name__ == "__main__":
  app.run(main)
