r"""Exact speculation across tokenizers, on the zoo's byte and BPE pairs.

  python -m benchmarks.cross_tokenizer --results_dir=results/cross_tokenizer

Two targets of one architecture and training budget (the quick job's
target-3m recipe), one over bytes (the zoo's target-3m) and one over a
byte-level BPE of 1,024 ids trained on the same corpus
(bpe1024-target-3m), each with the 0.1M draft distilled from it. Every
draft drafts for both targets: its own (the same-tokenizer baseline) and,
through a cross-tokenizer algorithm, the other. The rows are `DRAFTS`:
(algorithm, target, draft, builder), the builder turning the draft into a
draft over the target's ids; another algorithm is one more entry.

For each target and temperature (T = 0 greedy, T = 1), every decoder
(chain verifiers `token` and `block` at each gamma) and the target's own
autoregressive `generate` run the same prompts with the same key, taking
turns in the timing (`measure.interleaved_times`, the fastest of
`--repeats` calls). Prompts are the same text for both targets: windows of
the corpus's held-out files (`data.text_prompts`), encoded by each
target's tokenizer; budgets are `--max_new_tokens` target tokens.

Per row: alpha (accepted / verified drafts, with its standard error over
rows, `stats.clustered_alpha`), tokens per target call with a 95%
bootstrap interval over rows (its ratio to the same rows' autoregressive
tokens per call, 1 when no row stops early, `stats.paired_ratio_gain`),
tokens/s, and the speedup over the target's own autoregressive tokens/s;
at T = 0, whether the decoder's tokens are the target's own greedy tokens
(`greedy_equal`).

With `--results_dir`, writes cross_tokenizer.json and table.md (the
README's table) there, after each target and temperature, so a long run
stopped early keeps what it measured.
"""

from __future__ import annotations

import functools
import json
import os

from absl import app
from absl import flags
import jax
import numpy as np

import specjax as sj
from configs import reproduce
from specjax import data
from specjax import stats
from specjax.data.tokenizer_protocol import encode_batch
from specjax.harness import measure
from specjax.harness import roofline
from specjax.harness import zoo
from specjax.models import StringLevelDraft
from specjax.models import StringRejectionDraft
from specjax.models import string_level
from specjax.models import TokenIntersectionDraft

_RESULTS_DIR = flags.DEFINE_string("results_dir", None,
                                   "Write cross_tokenizer.json here.")
_ROWS = flags.DEFINE_integer("rows", 64, "Prompts (rows).", lower_bound=2)
_PROMPT_BYTES = flags.DEFINE_integer("prompt_bytes", 64,
                                     "Prompt text, in bytes.", lower_bound=2)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
    "max_new_tokens", 64, "Budget, in target tokens.", lower_bound=1)
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0.0", "1.0"],
                                  "Sampling temperatures.")
_GAMMAS = flags.DEFINE_list("gammas", ["4", "8"], "Draft lengths.")
_VERIFIERS = flags.DEFINE_list("verifiers", ["token", "block"],
                               "Chain verifiers.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed calls per decoder.",
                                lower_bound=1)
_ALGORITHMS = flags.DEFINE_list(
    "algorithms", None, "Run only these algorithms of DRAFTS (default: all);"
    " the autoregressive baseline always runs.")
_BPE_VOCAB = flags.DEFINE_integer("bpe_vocab", zoo.BPE_VOCABS[0],
                                  "The BPE's ids (the zoo's bpe<V>).",
                                  lower_bound=259, upper_bound=2**16)

_SLRS_NODES = flags.DEFINE_integer(
    "slrs_nodes", 128, "Trie nodes SLRS scores per proposal.", lower_bound=0)
_SLRS_SPLIT = flags.DEFINE_bool(
    "slrs_split_whitespace", True,
    "SLRS's cut follows GPT-2's whitespace-run split (the BPE's own).")

BYTE = "byte"
TLI_MAX_PER_TOKEN = 8
SLRS_MAX_PER_TOKEN = 7


def _names(vocab: int) -> dict[str, tuple[str, str]]:
  """{"byte" | "bpe": (target name, draft name)} in the zoo: the quick job's
  recipes, each draft distilled from the target of its own tokenizer."""
  bpe = f"bpe{vocab}"
  return {BYTE: ("target-3m", "distilled-draft-0.1m@target-3m"),
          "bpe": (f"{bpe}-target-3m",
                  f"distilled-{bpe}-draft-0.1m@{bpe}-target-3m")}


def _same(draft, draft_tok, target, target_tok, temperature):
  del draft_tok, target, target_tok, temperature
  return draft


def _tli(draft, draft_tok, target, target_tok, temperature):
  del temperature
  # A target token is read as at most 8 draft tokens (its last 8 bytes for
  # a byte draft): the draft's 1,024 positions then hold 128 target tokens,
  # the prompt, the budget and a round's gamma.
  return TokenIntersectionDraft.build(draft, draft_tok, target_tok,
                                      target_vocab_size=target.vocab_size,
                                      max_per_token=TLI_MAX_PER_TOKEN)


def _slem(draft, draft_tok, target, target_tok, temperature,
          sampled=False):
  # SLEM: the draft writes its most likely text at every T; SLEM-T
  # (sampled): it samples its text at the target's temperature.
  return StringLevelDraft.build(draft, draft_tok, target_tok,
                                target_vocab_size=target.vocab_size,
                                max_per_token=TLI_MAX_PER_TOKEN,
                                draft_temperature=temperature if sampled
                                else 0.0)


_slem_sampled = functools.partial(_slem, sampled=True)


def _slrs(draft, draft_tok, target, target_tok, temperature):
  del temperature
  # 7 bytes per target token, not TLI's 8: the draft's 1,024 positions
  # then hold the tree's 128 trie nodes beside 128 target tokens.
  return StringRejectionDraft.build(draft, draft_tok, target_tok,
                                    target_vocab_size=target.vocab_size,
                                    max_per_token=SLRS_MAX_PER_TOKEN,
                                    max_nodes=_SLRS_NODES.value,
                                    split_whitespace=_SLRS_SPLIT.value)


# (algorithm, target tokenizer, draft tokenizer, builder); "bpe" is the
# zoo's bpe<V> of --bpe_vocab. A builder maps (draft, draft tokenizer,
# target, target tokenizer, temperature) to a draft over the target's ids.
DRAFTS = (
    ("same tokenizer", "bpe", "bpe", _same),
    ("TLI", "bpe", BYTE, _tli),
    ("SLEM", "bpe", BYTE, _slem),
    ("SLEM-T", "bpe", BYTE, _slem_sampled),
    ("SLRS", "bpe", BYTE, _slrs),
    ("same tokenizer", BYTE, BYTE, _same),
    ("TLI", BYTE, "bpe", _tli),
    ("SLEM", BYTE, "bpe", _slem),
    ("SLEM-T", BYTE, "bpe", _slem_sampled),
)


def _load(vocab: int) -> dict[str, dict]:
  """{"bpe" | "byte": {target, draft, tokenizer}} from the zoo (trained
  into the cache on first use)."""
  out = {}
  for tok_name, (target_name, draft_name) in _names(vocab).items():
    target, tok = zoo.load_with_tokenizer(
        target_name, overrides=reproduce.QUICK_TARGET)
    draft = zoo.load(draft_name, overrides=reproduce.QUICK_DRAFT,
                     teacher_overrides=reproduce.QUICK_TARGET)
    out[tok_name] = {
        "target": target, "draft": draft, "tokenizer": tok,
        "target_name": target_name, "draft_name": draft_name}
  return out


def _row(label, tokens_R, calls_R, stats_, ar, seconds, ar_seconds):
  alpha = (None, None) if stats_ is None else stats.clustered_alpha(
      np.asarray(stats_.accepted), np.asarray(stats_.verified))
  ar_tokens_R, ar_calls_R = ar
  gain = stats.paired_ratio_gain(tokens_R, calls_R, ar_tokens_R, ar_calls_R)
  tpc_ar = ar_tokens_R.sum() / ar_calls_R.sum()
  tokens_per_s = float(tokens_R.sum() / seconds)
  return {"decoder": label, "alpha": alpha[0], "alpha_se": alpha[1],
          "tokens_per_target_call": float(tokens_R.sum() / calls_R.sum()),
          "tpc_low": float(tpc_ar * (1 + gain[1])),
          "tpc_high": float(tpc_ar * (1 + gain[2])),
          "tokens_per_s": tokens_per_s,
          "speedup": tokens_per_s / float(ar_tokens_R.sum() / ar_seconds)}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    temperatures = [float(t) for t in _TEMPERATURES.value]
    gammas = [int(g) for g in _GAMMAS.value]
  except ValueError as e:
    raise app.UsageError(f"--temperatures are floats, --gammas ints: {e}")
  if any(t < 0 for t in temperatures) or any(g < 1 for g in gammas):
    raise app.UsageError("--temperatures must be >= 0 and --gammas >= 1.")
  host = roofline.host_reading()
  print(f"host: {host['cpu']}, {host['cores']} cores, read "
        f"{host['read_gb_per_s']:.1f} GB/s")
  models = _load(_BPE_VOCAB.value)
  texts = data.text_prompts(data.stdlib_corpus(), _ROWS.value,
                               _PROMPT_BYTES.value)
  # How often SLEM's cut (longest match) is the BPE's own on the prompts.
  agreement = string_level.longest_match_agreement(
      texts, models["bpe"]["tokenizer"])
  print(f"longest match cuts {agreement:.3f} of the BPE's own tokens of "
        "the prompts")
  key = jax.random.key(0)
  setup = {"host": host, "rows": _ROWS.value,
           "prompt_bytes": _PROMPT_BYTES.value,
           "max_new_tokens": _MAX_NEW_TOKENS.value,
           "longest_match_agreement": agreement,
           "repeats": _REPEATS.value,
           "models": {k: {"target": v["target_name"],
                          "draft": v["draft_name"],
                          "tokenizer": v["tokenizer"].name,
                          "vocab_size": v["target"].vocab_size}
                      for k, v in models.items()},
           "recipes": {"target": reproduce.QUICK_TARGET,
                       "draft": reproduce.QUICK_DRAFT},
           "results": []}
  for target_key in ("bpe", BYTE):
    target = models[target_key]["target"]
    target_tok = models[target_key]["tokenizer"]
    prompts, lengths = encode_batch(target_tok, texts)
    for temperature in temperatures:
      sampling = sj.SamplingConfig(temperature=temperature)
      calls = {"autoregressive": lambda: sj.generate(
          target, prompts, lengths, key,
          max_new_tokens=_MAX_NEW_TOKENS.value, sampling=sampling)}
      built = {}
      for algorithm, t_key, d_key, builder in DRAFTS:
        if t_key != target_key or (_ALGORITHMS.value is not None
                                   and algorithm not in _ALGORITHMS.value):
          continue
        draft = builder(models[d_key]["draft"], models[d_key]["tokenizer"],
                        target, target_tok, temperature)
        for verifier in _VERIFIERS.value:
          for gamma in gammas:
            label = (f"{algorithm}, {models[d_key]['draft_name']}, "
                     f"{verifier}, gamma {gamma}")
            built[label] = (algorithm, d_key, verifier, gamma)
            calls[label] = (lambda draft=draft, verifier=verifier,
                            gamma=gamma: sj.speculative_generate(
                                target, draft, prompts, lengths, key,
                                gamma=gamma, verifier=verifier,
                                max_new_tokens=_MAX_NEW_TOKENS.value,
                                sampling=sampling))
      outs = {}
      times = measure.interleaved_times(calls, _REPEATS.value, outputs=outs)
      ar_out = outs["autoregressive"]
      ar = (np.asarray(ar_out.lengths), np.asarray(ar_out.stats.target_calls))
      ar_seconds = min(times["autoregressive"])
      print(f"--- target {models[target_key]['target_name']} "
            f"({target_tok.name}), T = {temperature}: autoregressive "
            f"{ar[0].sum() / ar_seconds:.0f} tokens/s")
      for label, out in outs.items():
        tokens_R = np.asarray(out.lengths)
        calls_R = np.asarray(out.stats.target_calls)
        row = _row(label, tokens_R, calls_R,
                   None if label == "autoregressive" else out.stats, ar,
                   min(times[label]), ar_seconds)
        algorithm, d_key, verifier, gamma = built.get(
            label, ("autoregressive", None, None, None))
        if temperature == 0.0:  # greedy: the target's own tokens
          row["greedy_equal"] = bool(np.array_equal(
              np.asarray(out.tokens), np.asarray(ar_out.tokens)))
        row.update(target=models[target_key]["target_name"],
                   target_tokenizer=target_tok.name,
                   temperature=temperature, algorithm=algorithm,
                   draft=None if d_key is None
                   else models[d_key]["draft_name"],
                   verifier=verifier, gamma=gamma)
        setup["results"].append(row)
        alpha = "-" if row["alpha"] is None else f"{row['alpha']:.3f}"
        print(f"{label:70s} alpha {alpha}, "
              f"{row['tokens_per_target_call']:.2f} tokens per target call "
              f"[{row['tpc_low']:.2f}, {row['tpc_high']:.2f}], "
              f"{row['tokens_per_s']:.0f} tokens/s, "
              f"x{row['speedup']:.2f}"
              + {None: "", True: ", the target's own greedy tokens",
                 False: ", NOT the target's greedy tokens"}[
                     row.get("greedy_equal")])
      if _RESULTS_DIR.value:
        _write(setup)


def table(results: list[dict]) -> str:
  """The rows as a markdown table (the README's)."""
  lines = ["| target | T | algorithm | draft | verifier | gamma | alpha | "
           "tokens / target call [95%] | tokens/s | speedup |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in results:
    alpha = ("-" if r["alpha"] is None
             else f"{r['alpha']:.3f} ± {r['alpha_se']:.3f}")
    lines.append(
        f"| {r['target']} | {r['temperature']:g} | {r['algorithm']} | "
        f"{r['draft'] or '-'} | {r['verifier'] or '-'} | "
        f"{r['gamma'] or '-'} | {alpha} | "
        f"{r['tokens_per_target_call']:.2f} [{r['tpc_low']:.2f}, "
        f"{r['tpc_high']:.2f}] | {r['tokens_per_s']:.0f} | "
        f"{r['speedup']:.2f} |")
  return "\n".join(lines) + "\n"


def _write(setup):
  os.makedirs(_RESULTS_DIR.value, exist_ok=True)
  path = os.path.join(_RESULTS_DIR.value, "cross_tokenizer.json")
  with open(path, "w") as f:
    json.dump(setup, f, indent=1)
  with open(os.path.join(_RESULTS_DIR.value, "table.md"), "w") as f:
    f.write(table(setup["results"]))
  print(f"wrote {path} and table.md")


if __name__ == "__main__":
  app.run(main)
