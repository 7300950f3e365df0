r"""Speculative text generation with Hugging Face checkpoints (absl entry point).

  python -m experiments.generate --target=tests/data/hf/llama3_tied \
      --draft=self:1 --prompt="the quick brown fox" --max_new_tokens=32 \
      --compare

  --target   DIR | hf:<repo_id>   (config.json + safetensors + tokenizer.json)
             | zoo:<name>       (a byte-level zoo model, e.g. zoo:target-3m)
  --draft    a spec of the draft registry (specjax.harness.drafts): DIR |
             hf:<repo_id> | self:N | skip:I,J | bigram | unigram |
             prompt_lookup[:n] | truncated:N | random:<preset> | perturbed
  --gamma    N | auto   (auto: timed here, or with --plan_device="H100 SXM"
             priced from that accelerator's roofline)
  --regex PATTERN | --json_schema FILE   constrained decoding

Prints each row's text, then alpha_hat, tokens per target call, tokens/s
and, with --compare, the speedup over target-only `generate`. Timings
exclude compilation (each program runs once untimed). All logic lives in
`specjax.harness.textgen`.
"""

from __future__ import annotations

import contextlib
import os

from absl import app
from absl import flags

from specjax import _checks
from specjax import constraint as constraint_lib
from specjax import distributed
from specjax import sampling as sampling_lib
from specjax.harness import drafts
from specjax.harness import roofline
from specjax.harness import textgen
from specjax.harness import zoo
from specjax.models import hf
from experiments import flag_checks

_TARGET = flags.DEFINE_string(
    "target", None, "Target: DIR, hf:<repo_id> or zoo:<name> (byte-level).")
_DRAFT = flags.DEFINE_string(
    "draft", "prompt_lookup",
    "Draft: a checkpoint DIR, hf:<repo_id>, self:N (the target's first N "
    "blocks + its embeddings and head, sharing its cache), skip:I,J, bigram "
    "or unigram (counts of the prompts), prompt_lookup[:n], ... "
    "(specjax.harness.drafts).")
_PROMPT = flags.DEFINE_multi_string(
    "prompt", None, "A prompt (repeat the flag for several rows).")
_PROMPTS_FILE = flags.DEFINE_string(
    "prompts_file", None, "A file with one prompt per line.")
_GAMMA = flags.DEFINE_string(
    "gamma", "4", "Draft tokens per round (an int >= 1), or 'auto': the "
    "Goodput rule, each row's draft length chosen in the loop from its "
    "acceptance and costs measured on this machine first (about a minute "
    "on 2 CPU cores).")
_PLAN_DEVICE = flags.DEFINE_string(
    "plan_device", None, "With --gamma=auto: price the Goodput rule from "
    "this accelerator's roofline (bytes and FLOPs of each pass at its "
    "bandwidth and peak) instead of timing this machine: one of "
    f"{', '.join(sorted(roofline.ACCELERATORS))}.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.0, "Sampling temperature (0 = greedy).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k sampling (0 = off).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 64,
                                       "New tokens per row.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.", lower_bound=0,
                             upper_bound=_checks.MAX_SEED)
_DTYPE = flags.DEFINE_string(
    "dtype", None, "Weight/compute dtype (default: the checkpoint's).")
_MAX_POSITIONS = flags.DEFINE_integer(
    "max_positions", None, "Cap the checkpoints' context at this many "
    "positions (default: their own). A Mistral or Qwen2 checkpoint whose "
    "sliding window is shorter than its context loads with a cap at most "
    "the window, where full attention is the same function.",
    lower_bound=1)
_REGEX = flags.DEFINE_string(
    "regex", None, "Constrain every row's text to match this regular "
    "expression in full (specjax.constraint; needs outlines-core).")
_JSON_SCHEMA = flags.DEFINE_string(
    "json_schema", None, "Constrain every row's text to a JSON document "
    "valid under the schema in this file.")
_COMPARE = flags.DEFINE_bool(
    "compare", False, "Also time target-only generate and print the speedup.")
flags.mark_flag_as_required("target")
distributed.define_compilation_cache_flag()
distributed.register_dtype_validator("dtype")


# Checked when the flags are parsed, before the target is loaded (the
# registry parses a spec without loading anything). A checkpoint's own
# errors name a path, not the flag; self:N's upper bound (the target's
# blocks) waits for the target.
@flags.validator("draft")
def _check_draft(spec):
  try:
    drafts.check_spec(spec)
  except (TypeError, ValueError) as e:
    raise flags.ValidationError(f"--draft: {e}") from None
  if drafts.is_zoo_model(spec):
    raise flags.ValidationError(
        f"--draft={spec} is a zoo model, byte-level and trained on the "
        "built-in corpus; a checkpoint target needs a draft of its own "
        "vocabulary: a checkpoint, hf:<repo_id>, self:N, skip:I,J, bigram, "
        "unigram or prompt_lookup.")
  if os.path.isdir(spec) and not os.path.isfile(
      os.path.join(spec, "config.json")):
    raise flags.ValidationError(
        f"--draft={spec} is a directory without config.json, not a "
        "checkpoint.")
  return True


@flags.validator("target")
def _check_target(spec):
  if (spec is None or (spec.startswith("hf:") and len(spec) > 3)
      or os.path.isfile(os.path.join(spec, "config.json"))):
    return True  # None: mark_flag_as_required says so
  if spec.startswith("zoo:"):
    if spec[len("zoo:"):] in zoo.names():
      return True
    raise flags.ValidationError(
        f"--target={spec}: the zoo has no such model; zoo.names() lists "
        "them (e.g. zoo:target-3m).")
  raise flags.ValidationError(
      "--target takes a checkpoint directory (with config.json), "
      f"hf:<repo_id> or zoo:<name>; {spec!r} is none of them.")


# The sampling knobs as SamplingConfig checks them (its messages name them).
@flags.multi_flags_validator(["temperature", "top_p", "top_k"])
def _check_sampling(values):
  try:
    sampling_lib.SamplingConfig(temperature=values["temperature"],
                                top_p=values["top_p"], top_k=values["top_k"])
  except (TypeError, ValueError) as e:
    raise flags.ValidationError(f"--{e}") from None
  return True


def _prompts() -> list[str]:
  if bool(_PROMPT.value) == bool(_PROMPTS_FILE.value):
    raise app.UsageError("Give --prompt (repeatable) or --prompts_file, not "
                         "both and not neither.")
  if _PROMPT.value:
    return list(_PROMPT.value)
  with open(_PROMPTS_FILE.value, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f if line.strip()]
  if not lines:
    raise app.UsageError(f"--prompts_file {_PROMPTS_FILE.value} has no "
                         "non-empty line.")
  return lines


def _constraint(tok):
  """The --regex or --json_schema constraint compiled for `tok`, or None."""
  if _REGEX.value is not None and _JSON_SCHEMA.value is not None:
    raise app.UsageError("Give --regex or --json_schema, not both.")
  if _REGEX.value is not None:
    with _usage_errors("--regex"):
      return constraint_lib.regex(_REGEX.value, tok)
  if _JSON_SCHEMA.value is not None:
    with _usage_errors("--json_schema"):
      with open(_JSON_SCHEMA.value, encoding="utf-8") as f:
        return constraint_lib.json_schema(f.read(), tok)
  return None


@contextlib.contextmanager
def _usage_errors(flag: str):
  """Errors of loading what `flag` names, as a one-line usage error."""
  try:
    yield
  except hf.UnsupportedConfigError as e:
    # Its advice names load()'s argument; here that is a flag.
    raise app.UsageError(
        f"{flag}: {e}" + (" (On this command line: --max_positions.)"
                          if "max_positions" in str(e) else "")) from None
  except (OSError, ImportError, ValueError) as e:
    raise app.UsageError(f"{flag}: " + " ".join(str(e).split())) from None


@flag_checks.one_line_usage_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.use_compilation_cache(flags.FLAGS.compilation_cache)
  try:
    gamma = textgen.parse_gamma(_GAMMA.value)
  except ValueError as e:
    raise app.UsageError(f"--gamma: {e}") from None
  plan_device = None
  if _PLAN_DEVICE.value is not None:
    if gamma != "auto":
      raise app.UsageError("--plan_device prices --gamma=auto; pass "
                           "--gamma=auto, or leave --plan_device out.")
    try:
      plan_device = roofline.get_device(_PLAN_DEVICE.value)
    except ValueError as e:
      raise app.UsageError(f"--plan_device: {e}") from None
  texts = _prompts()
  sampling = sampling_lib.SamplingConfig(
      temperature=_TEMPERATURE.value, top_p=_TOP_P.value, top_k=_TOP_K.value)
  # The checkpoints the flags name, loaded and matched: a missing file, a
  # hub id while offline, a draft of another tokenizer or too many blocks
  # is the command line's fault, reported as one line naming the flag.
  with _usage_errors("--target"):
    target, tok = textgen.load_target(_TARGET.value, dtype=_DTYPE.value,
                                      max_positions=_MAX_POSITIONS.value)
  prompt_ids = [tok.encode(t) for t in texts]
  with _usage_errors("--draft"):
    draft = drafts.make_draft(
        _DRAFT.value, target, tokenizer=tok, prompt_ids=prompt_ids,
        dtype=_DTYPE.value, max_positions=_MAX_POSITIONS.value)
  target = draft.target
  with _usage_errors("--max_new_tokens"):
    textgen.check_context(target, draft.model, tok, texts, gamma=gamma,
                          max_new_tokens=_MAX_NEW_TOKENS.value)
  constraint = _constraint(tok)
  print(f"target: {_TARGET.value} ({target.vocab_size} ids); draft: "
        f"{draft.description}")
  result = textgen.run(target, draft.model, tok, texts, gamma=gamma,
                       max_new_tokens=_MAX_NEW_TOKENS.value,
                       sampling=sampling, seed=_SEED.value,
                       compare=_COMPARE.value, progress=print,
                       constraint=constraint, plan_device=plan_device)
  for row, (prompt, text) in enumerate(zip(texts, result.texts)):
    print(f"--- row {row}: {prompt!r}\n{prompt}{text}")
  if constraint is not None:
    done = sum(result.complete)
    print(f"--- in the language: {done} of {len(result.complete)} rows"
          + (" (the others stopped at --max_new_tokens)"
             if done < len(result.complete) else ""))
  s = result.summary
  print("---")
  print(f"alpha_hat              {s['alpha_hat']:.3f}")
  print(f"tokens per target call {s['tokens_per_target_call']:.2f}")
  print(f"tokens/s               {result.tokens_per_s:.1f} "
        f"({s['generated_tokens']} tokens in {result.seconds:.3f} s)")
  if _COMPARE.value:
    same = result.baseline_texts == result.texts
    print(f"generate tokens/s      {result.baseline_tokens_per_s:.1f}")
    print(f"speedup vs generate    {result.speedup:.2f}x"
          + (f" (identical text: {same})" if sampling.greedy else ""))


if __name__ == "__main__":
  app.run(main)
