r"""What a constraint costs, and what it does to speculation.

  python -m benchmarks.constrained --results_dir=results/constrained

One run, three parts, for one JSON schema of realistic size (an object of
six properties: an integer, bounded strings, an email, an array of enums,
a nested object with a pattern, a boolean):

* the tables: the schema compiled for the byte-level tokenizer (V = 259)
  and for a byte-level BPE of V = 50,257 trained on the built-in corpus
  (`specjax.data.bpe`, GPT-2's size): states, distinct mask rows, byte
  classes, bytes per state against V / 8, the shared bytes, compile time;
* the cost per pass: a verify pass of gamma + 1 positions at byte-85m and
  GPT-2 124M shapes (random weights, float32, batch 1, a cache 128
  positions long), alone and with the constraint's mask of its logits and
  the walk of its tokens in the same program, and the mask and walk alone
  on the pass's logits, timed interleaved; each ratio is the median of the
  per-turn ratios, with their 10-90% range;
* speculation on the quick job's models (the zoo's target-3m and the
  distilled 0.1M draft, trained on first use): tokens per target call,
  alpha and the rows in the language, with and without the constraint,
  at T = 1 and greedy.

With `--results_dir`, writes constrained.json there.
"""

from __future__ import annotations

import json
import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import specjax as sj
from configs import reproduce
from specjax import constraint as constraint_lib
from specjax.constraint import automaton
from specjax.data import bpe
from specjax.data import corpus as corpus_lib
from specjax.data import tokenizer as byte_tokenizer
from specjax.data.tokenizer_protocol import encode_batch
from specjax.harness import measure
from specjax.harness import roofline
from specjax.harness import zoo
from specjax.models import TransformerConfig
from specjax.models import TransformerLM

_RESULTS_DIR = flags.DEFINE_string("results_dir", None,
                                   "Write constrained.json here.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.",
                              lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 30, "Timed turns per pass.",
                                lower_bound=3)
_ROWS = flags.DEFINE_integer("rows", 64, "Rows of the speculation runs.",
                             lower_bound=1)
_BPE_BYTES = flags.DEFINE_integer(
    "bpe_bytes", 8_000_000, "Corpus bytes the BPE is trained on.",
    lower_bound=100_000)

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 24},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "maxItems": 4,
                 "items": {"enum": ["admin", "user", "guest", "bot"]}},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 16},
                                   "zip": {"type": "string",
                                           "pattern": "[0-9]{5}"}},
                    "required": ["city", "zip"]},
        "active": {"type": "boolean"}},
    "required": ["id", "name", "tags", "address", "active"]}

PASS_SHAPES = {259: "byte-85m", 50257: "gpt2-124m"}
CACHE_LEN = 128


def _tables(tokenizer) -> tuple[automaton.Constraint, dict]:
  start = time.perf_counter()
  c = constraint_lib.json_schema(SCHEMA, tokenizer)
  seconds = time.perf_counter() - start
  memory = c.memory()
  row = {**memory, "byte_classes": int(c.next_SxC.shape[1]),
         "v_over_8": memory["vocab_size"] / 8, "compile_s": seconds}
  print(f"V = {row['vocab_size']:6d}: {row['states']} states, "
        f"{row['masks']} distinct masks, {row['byte_classes']} byte classes; "
        f"{row['bytes_per_state']:.0f} bytes per state (V/8 = "
        f"{row['v_over_8']:.0f}), {row['shared_bytes']:,} shared; compiled "
        f"in {seconds:.1f} s")
  return c, row


def _pass_cost(c: automaton.Constraint, preset: str, gamma: int,
               repeats: int) -> dict:
  """A verify pass alone and with the mask and walk, interleaved."""
  model = TransformerLM.create(TransformerConfig.preset(
      preset, max_positions=CACHE_LEN + gamma + 1), 0)
  cache = model.init_cache(1, CACHE_LEN + gamma + 1)
  cache = cache.replace(lengths=jnp.full((1,), CACHE_LEN - 1, jnp.int32))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, c.vocab_size - 1, (1, gamma + 1)),
                       jnp.int32)
  states = jnp.asarray(rng.integers(0, c.num_states - 1, (1, gamma + 1)),
                       jnp.int32)

  @jax.jit
  def plain(model, cache, tokens):
    return model(tokens, cache)[0]

  @jax.jit
  def masked(model, cache, tokens, c, states):
    logits = automaton.mask_logits(c, states, model(tokens, cache)[0],
                                   eos_ids=(c.vocab_size - 1,))
    return logits, automaton.advance_path(c, states[:, 0], tokens)

  @jax.jit
  def alone(logits, tokens, c, states):
    return (automaton.mask_logits(c, states, logits,
                                  eos_ids=(c.vocab_size - 1,)),
            automaton.advance_path(c, states[:, 0], tokens))

  logits = plain(model, cache, tokens)
  times = measure.interleaved_times({
      "pass": lambda: plain(model, cache, tokens),
      "pass + constraint": lambda: masked(model, cache, tokens, c, states),
      "constraint alone": lambda: alone(logits, tokens, c, states),
  }, repeats)
  ratio = np.array(times["pass + constraint"]) / np.array(times["pass"])
  share = np.array(times["constraint alone"]) / np.array(times["pass"])
  row = {"shape": preset, "vocab_size": model.vocab_size,
         "positions": gamma + 1,
         **{f"{k}_ms": 1e3 * float(np.median(v)) for k, v in times.items()},
         "overhead": float(np.median(ratio) - 1),
         "overhead_p10": float(np.quantile(ratio, 0.1) - 1),
         "overhead_p90": float(np.quantile(ratio, 0.9) - 1),
         "alone_share": float(np.median(share)),
         "alone_share_p10": float(np.quantile(share, 0.1)),
         "alone_share_p90": float(np.quantile(share, 0.9))}
  print(f"{preset:10s} V = {model.vocab_size:6d}: pass "
        f"{row['pass_ms']:.2f} ms, with the constraint "
        f"{row['pass + constraint_ms']:.2f} ms, the constraint alone "
        f"{row['constraint alone_ms']:.3f} ms; overhead "
        f"{100 * row['overhead']:+.1f}% [{100 * row['overhead_p10']:+.1f}%, "
        f"{100 * row['overhead_p90']:+.1f}%], the constraint alone "
        f"{100 * row['alone_share']:.2f}% of a pass "
        f"[{100 * row['alone_share_p10']:.2f}%, "
        f"{100 * row['alone_share_p90']:.2f}%]")
  return row


def _speculation(c: automaton.Constraint, gamma: int, rows: int) -> list:
  tok = byte_tokenizer.ByteTokenizer()
  target = zoo.load("target-3m", overrides=reproduce.QUICK_TARGET)
  draft = zoo.load("distilled-draft-0.1m@target-3m",
                   overrides=reproduce.QUICK_DRAFT,
                   teacher_overrides=reproduce.QUICK_TARGET)
  prompts, lengths = encode_batch(tok, ["# the user record as JSON\n"] * rows)
  out_rows = []
  for name, sampling in (("T = 1", sj.SamplingConfig()),
                         ("greedy", sj.GREEDY)):
    for constrained in (False, True):
      out = sj.speculative_generate(
          target, draft, prompts, lengths, jax.random.key(0), gamma=gamma,
          max_new_tokens=160, sampling=sampling, eos_id=tok.eos_id,
          constraint=c if constrained else None)
      s = out.summary()
      valid = np.mean([automaton.accepts(c, r[:n]) for r, n in zip(
          np.asarray(out.tokens), np.asarray(out.lengths))])
      row = {"sampling": name, "constraint": constrained,
             "tokens_per_target_call": s["tokens_per_target_call"],
             "alpha_hat": s["alpha_hat"], "in_language": float(valid),
             "mean_length": float(np.mean(np.asarray(out.lengths)))}
      print(f"{name:6s} {'with' if constrained else 'without':7s} the "
            f"schema: {row['tokens_per_target_call']:.2f} tokens per target "
            f"call, alpha {row['alpha_hat']:.3f}, in the language "
            f"{100 * valid:.0f}%, mean length {row['mean_length']:.0f}")
      out_rows.append(row)
  example = out
  print("example:", tok.decode(np.asarray(example.tokens)[0][
      :int(example.lengths[0])]))
  return out_rows


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  host = roofline.host_reading()
  print(f"host: {host['cpu']}, {host['cores']} cores, read "
        f"{host['read_gb_per_s']:.1f} GB/s")
  print("--- the tables")
  byte_c, byte_row = _tables(byte_tokenizer.ByteTokenizer())
  start = time.perf_counter()
  tok = bpe.train_bpe(corpus_lib.stdlib_corpus(max_bytes=_BPE_BYTES.value),
                      50257)
  print(f"(BPE of {tok.vocab_size} ids trained in "
        f"{time.perf_counter() - start:.1f} s)")
  bpe_c, bpe_row = _tables(tok)
  print(f"--- a verify pass of {_GAMMA.value + 1} positions, alone and "
        "with the constraint (interleaved)")
  passes = [_pass_cost(c, PASS_SHAPES[c.vocab_size], _GAMMA.value,
                       _REPEATS.value) for c in (byte_c, bpe_c)]
  print(f"--- speculation on the quick models (gamma = {_GAMMA.value}, "
        f"{_ROWS.value} rows)")
  spec = _speculation(byte_c, _GAMMA.value, _ROWS.value)
  if _RESULTS_DIR.value:
    os.makedirs(_RESULTS_DIR.value, exist_ok=True)
    path = os.path.join(_RESULTS_DIR.value, "constrained.json")
    with open(path, "w") as f:
      json.dump({"host": host, "schema": SCHEMA, "gamma": _GAMMA.value,
                 "tables": [byte_row, bpe_row], "passes": passes,
                 "speculation": spec}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
