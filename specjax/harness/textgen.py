"""Text in, text out: a target/draft pair from specs, timed generations.

The library side of `python -m experiments.generate` and
colab/hf_checkpoints.ipynb:

* `load_target(spec)`: a Hugging Face directory or `hf:<repo_id>` ->
  `(TransformerLM, HFTokenizer)`.
* `make_draft(spec, target, tokenizer, prompts)`: `DIR` / `hf:ID` (another
  checkpoint; vocabularies reconciled, see specjax.models.vocab), `self:N`
  (`SelfDraft`: the target's first N blocks with its embeddings and head,
  sharing its weights and KV cache), `bigram`
  (fitted on the prompts, pairs within each), `prompt_lookup`.
* `parse_gamma(text)`: a `--gamma` flag (an int or "auto").
* `run(target, draft, tokenizer, texts, ...)`: speculative generation (and,
  with `compare=True`, the autoregressive baseline on the same prompts),
  each compiled once and then timed; returns texts and statistics.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from specjax import _checks
from specjax import sampling as sampling_lib
from specjax.data.hf_tokenizer import read_json
from specjax.data.tokenizer_protocol import encode_batch
from specjax.decode import loop
from specjax.harness import autotune
from specjax.harness import measure
from specjax.models import hf
from specjax.models import transformer as transformer_lib
from specjax.models import vocab
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models.self_draft import SelfDraft

# A bigram table is V x V float32: refuse beyond this vocabulary (256 MiB).
MAX_BIGRAM_VOCAB = 8192


def load_target(spec: str, *, dtype: Any = None,
                max_positions: int | None = None):
  """`(model, tokenizer)` of a checkpoint directory or `hf:<repo_id>`;
  `max_positions` caps its context (`hf.load`)."""
  model, tok = hf.load(spec, dtype=dtype, max_positions=max_positions)
  if tok is None:
    raise FileNotFoundError(f"{spec} has no tokenizer.json; text generation "
                            "needs the checkpoint's fast tokenizer.")
  return model, tok


def make_draft(spec: str, target, tokenizer, prompt_ids, *,
               dtype: Any = None, max_positions: int | None = None):
  """`(draft, target, description)` for a `--draft` spec.

  `dtype` and `max_positions` apply to a checkpoint draft (`hf.load`).

  `prompt_ids` (read by `bigram` only): the prompts' token ids, one integer
  array per prompt (a list, or a [B, P] array padded with -1), or one
  prompt's ids (a 1-D array or a list of ints). The bigram counts pairs
  within each prompt.

  The target is returned too because reconciling two checkpoints with
  padded vocabularies wraps both (see `specjax.models.vocab.reconcile`).
  """
  if not isinstance(spec, str):
    raise TypeError(f"spec must be a --draft string such as 'self:2', "
                    f"'bigram' or a checkpoint path, got {type(spec).__name__}.")
  if dtype is not None:
    # Checked for every kind, though only a checkpoint draft reads it: a
    # typo must not pass because the draft kind ignores it.
    dtype = transformer_lib.float_dtype_name("dtype", dtype)
  if not isinstance(target, transformer_lib.TransformerLM) and not (
      spec in ("prompt_lookup", "bigram")):
    # self:N views the target's blocks; a checkpoint is reconciled with it.
    raise TypeError(f"target must be a specjax TransformerLM (from "
                    f"load_target) for the draft {spec!r}, got "
                    f"{type(target).__name__}.")
  kind, _, arg = spec.partition(":")
  if kind == "self":
    num_layers = target.config.num_layers
    if not arg.isdecimal() or not 1 <= int(arg) <= num_layers:
      raise ValueError(f"--draft={spec}: use self:N with N the number of the "
                       f"target's blocks to keep, 1 <= N <= num_layers "
                       f"({num_layers}), e.g. self:{max(num_layers // 4, 1)}.")
    # A view, not a second model: the target's own arrays, and its KV cache
    # for the kept blocks (no draft prefill, no draft cache).
    draft = SelfDraft(target, layers=int(arg), share_cache=True)
    return draft, target, (f"self:{arg}: the target's first {int(arg)} of "
                           f"{num_layers} blocks (SelfDraft: shared weights "
                           "and KV cache)")
  if spec == "prompt_lookup":
    return (PromptLookupDraft(vocab_size=target.vocab_size), target,
            "prompt_lookup: n-grams of the prompt and output so far")
  if spec == "bigram":
    if target.vocab_size > MAX_BIGRAM_VOCAB:
      raise ValueError(
          f"--draft=bigram needs a [V, V] table; V = {target.vocab_size} is "
          f"above {MAX_BIGRAM_VOCAB}. Use prompt_lookup or self:N.")
    # One sequence per prompt: no pair joins a prompt's end to the next
    # one's start, a transition the draft never sees.
    if prompt_ids is None or (
        not prompt_ids if isinstance(prompt_ids, (list, tuple))
        else np.ndim(prompt_ids) > 2 or not np.size(prompt_ids)):
      raise ValueError(
          "prompt_ids: --draft=bigram counts the prompts' token pairs; give "
          "one integer array per prompt (a list, or a [B, P] array padded "
          f"with -1), got {prompt_ids!r:.80}.")
    if isinstance(prompt_ids, (list, tuple)):  # prompts, or one prompt's ids
      one = bool(prompt_ids) and np.isscalar(prompt_ids[0])
      rows = [prompt_ids] if one else prompt_ids
    else:
      rows = prompt_ids if np.ndim(prompt_ids) == 2 else [prompt_ids]
    rows = [np.asarray(row) for row in rows]
    draft = NGramLM.fit([row[row >= 0] for row in rows],  # -1 pads a batch
                        target.vocab_size, 2)
    return draft, target, "bigram: add-1 bigram counts of the prompts"
  if not spec.startswith("hf:") and not os.path.isdir(spec):
    raise FileNotFoundError(
        f"--draft={spec!r} is no directory; a draft is self:N (the target's "
        "first N blocks), prompt_lookup, bigram, a Hugging Face checkpoint "
        "directory (config.json, tokenizer.json, *.safetensors) or "
        "hf:<repo_id>.")
  directory = hf.resolve(spec)
  if max_positions is not None:
    # A cap for the target's sake; a draft with a shorter context keeps it.
    own = hf.context_length(read_json(directory, "config.json"))
    if isinstance(own, int):
      max_positions = min(max_positions, own)
  draft, draft_tok = hf.load(directory, dtype=dtype,
                             max_positions=max_positions)
  if draft_tok is None:
    raise FileNotFoundError(f"--draft={spec} has no tokenizer.json; it is "
                            "needed to check the vocabularies agree.")
  target, draft = vocab.reconcile(target, draft, tokenizer, draft_tok)
  return draft, target, f"{spec}: a checkpoint"


def parse_gamma(text: str) -> int | str:
  """A `--gamma` value as `speculative_generate` takes it: int >= 1 or "auto"."""
  if not isinstance(text, str):
    raise TypeError(f"parse_gamma reads a flag's text (e.g. '4' or 'auto'), "
                    f"got {type(text).__name__}.")
  if text.strip() == "auto":
    return "auto"
  try:
    gamma = int(text)
  except ValueError:
    gamma = 0
  if gamma < 1:
    raise ValueError(f"{text!r} is neither an int >= 1 (draft tokens per "
                     "round) nor 'auto'.")
  return gamma


@dataclasses.dataclass
class TextRun:
  """What `run` measured. `seconds`: median of timed calls, after compiling."""
  texts: list[str]
  summary: dict[str, Any]
  seconds: float
  tokens_per_s: float
  baseline_seconds: float | None = None
  baseline_tokens_per_s: float | None = None
  baseline_texts: list[str] | None = None

  @property
  def speedup(self) -> float | None:
    """tokens_per_s / baseline_tokens_per_s: per generated token, since a
    sampled run stopped by EOS need not emit as many tokens as the baseline
    (then the ratio of seconds is not the speedup)."""
    if self.baseline_tokens_per_s is None:
      return None
    return self.tokens_per_s / self.baseline_tokens_per_s


def _timed(fns: dict, *, min_seconds: float = 0.5, max_calls: int = 25
           ) -> tuple[dict, dict]:
  """`({name: fn()}, {name: median seconds of a call})` after one untimed
  (compiling) call of each, the calls taking turns until each has run
  `min_seconds` (at most `max_calls` turns; `measure.interleaved_times`):
  their ratio is measured side by side."""
  outs = {}
  times = measure.interleaved_times(fns, max_calls, min_seconds=min_seconds,
                                    outputs=outs)
  return outs, {name: float(np.median(t)) for name, t in times.items()}


def _texts(tokenizer, result) -> list[str]:
  """Each row's text, without the EOS that ended it: an EOS id need not be a
  special token (Llama 3's 119 is a byte), and would decode to junk."""
  tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
  eos = set(getattr(tokenizer, "eos_ids", None) or ())
  texts = []
  for row, n in enumerate(lengths):
    ids = tokens[row, :n]
    if n and int(ids[-1]) in eos:
      ids = ids[:-1]
    texts.append(tokenizer.decode(ids))
  return texts


def run(target, draft, tokenizer, texts: Sequence[str], *,
        gamma: int | str | Any = 4,
        max_new_tokens: int = 64,
        sampling: sampling_lib.SamplingConfig = sampling_lib.GREEDY,
        seed: int = 0, add_bos: bool | None = None,
        compare: bool = False,
        progress: Callable[[str], None] | None = None) -> TextRun:
  """Generates a continuation of each text, speculating with `draft`.

  Args:
    target, draft: `CausalLM`s over one vocabulary (see `make_draft`).
    tokenizer: the target's tokenizer (its `eos_ids` stop a row).
    texts: prompts, one row each.
    gamma, max_new_tokens, sampling, seed: as in `speculative_generate`
      (gamma: an int or a draft-length rule), or gamma "auto": first a
      `Goodput` rule priced on this machine (`autotune.auto_rule`).
    add_bos: prepend BOS; None means when the tokenizer has one distinct from
      its EOS ids (Llama-style yes, GPT-2 no).
    compare: also time `generate` (target only) on the same prompts, its
      calls taking turns with the speculative ones (`_timed`).
    progress: called with a line of text before and after gamma="auto"
      measures (it takes a while), e.g. `print`.

  Returns:
    A `TextRun`; each call is compiled by a first, untimed run.
  """
  if add_bos is None:
    add_bos = (tokenizer.bos_id is not None
               and tokenizer.bos_id not in tokenizer.eos_ids)
  # encode_batch refuses a bare string, but list() would split it first.
  if isinstance(texts, (str, bytes)):
    raise TypeError(f"texts must be a sequence of prompts, one row each, got "
                    f"a bare {type(texts).__name__}: pass [texts].")
  prompts, lengths = encode_batch(tokenizer, list(texts), add_bos=add_bos)
  key = jax.random.key(_checks.check_int("seed", seed, low=0,
                                        high=_checks.MAX_SEED))
  eos = tokenizer.eos_ids or None
  if isinstance(gamma, str):
    if gamma != "auto":
      raise ValueError(f"gamma must be an int >= 1, 'auto' or a draft-length "
                       f"rule, got {gamma!r}.")
    if progress is not None:
      progress("gamma=auto: timing the loop's passes and rounds on this "
               "machine to price a Goodput rule (once per process and "
               "shape) ...")
    gamma = autotune.auto_rule(target, draft, prompts, lengths,
                               max_new_tokens=max_new_tokens,
                               sampling=sampling)
    if progress is not None:
      progress(f"gamma=auto: draft lengths {gamma.planned_widths}, a draft "
               f"pass costing {gamma.c:.2f} target passes.")
  kwargs = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos)
  fns = {"speculative": lambda: loop.speculative_generate(
      target, draft, prompts, lengths, key, gamma=gamma, **kwargs)}
  if compare:
    fns["generate"] = lambda: loop.generate(target, prompts, lengths, key,
                                            **kwargs)
  outs, seconds = _timed(fns)
  out = outs["speculative"]
  generated = int(np.asarray(out.lengths).sum())
  result = TextRun(texts=_texts(tokenizer, out), summary=out.summary(),
                   seconds=seconds["speculative"],
                   tokens_per_s=generated / seconds["speculative"])
  if compare:
    base = outs["generate"]
    result.baseline_seconds = seconds["generate"]
    result.baseline_tokens_per_s = (
        int(np.asarray(base.lengths).sum()) / seconds["generate"])
    result.baseline_texts = _texts(tokenizer, base)
  return result
