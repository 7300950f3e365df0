"""Text in, text out: a checkpoint target, timed generations.

The library side of `python -m experiments.generate` and
colab/hf_checkpoints.ipynb:

* `load_target(spec)`: a Hugging Face directory or `hf:<repo_id>` ->
  `(TransformerLM, HFTokenizer)`.
* drafts come from the one registry, `specjax.harness.drafts.make_draft(
  spec, target, tokenizer=..., prompt_ids=...)`.
* `parse_gamma(text)`: a `--gamma` flag (an int or "auto").
* `check_context(target, draft, tokenizer, texts, ...)`: refuses a
  max_new_tokens that does not fit the models' context, before anything is
  compiled or timed.
* `run(target, draft, tokenizer, texts, ...)`: speculative generation (and,
  with `compare=True`, the autoregressive baseline on the same prompts),
  each compiled once and then timed; returns texts and statistics.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from specjax import _checks
from specjax import _moved
from specjax import sampling as sampling_lib
from specjax import constraint as constraint_lib
from specjax.data.tokenizer_protocol import encode_batch
from specjax.decode import loop
from specjax.harness import autotune
from specjax.harness import measure
from specjax.harness import zoo
from specjax.models import hf


def load_target(spec: str, *, dtype: Any = None,
                max_positions: int | None = None):
  """`(model, tokenizer)` of a checkpoint directory or `hf:<repo_id>`;
  `max_positions` caps its context (`hf.load`). `zoo:<name>` is a model of
  the zoo (`specjax.harness.zoo`, trained on first use) with its tokenizer:
  the zoo's BPE for a BPE model, else the `ByteTokenizer`."""
  if isinstance(spec, str) and spec.startswith("zoo:"):
    if dtype is not None or max_positions is not None:
      raise ValueError("a zoo target loads as trained: no dtype or "
                       "max_positions.")
    return zoo.load_with_tokenizer(spec[len("zoo:"):])
  model, tok = hf.load(spec, dtype=dtype, max_positions=max_positions)
  if tok is None:
    raise FileNotFoundError(f"{spec} has no tokenizer.json; text generation "
                            "needs the checkpoint's fast tokenizer.")
  return model, tok


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


def _with_bos(tokenizer, add_bos: bool | None) -> bool:
  """`run`'s add_bos: None means when the tokenizer has a BOS distinct from
  its EOS ids (Llama-style yes, GPT-2 no)."""
  if add_bos is None:
    return (tokenizer.bos_id is not None
            and tokenizer.bos_id not in tokenizer.eos_ids)
  return add_bos


def check_context(target, draft, tokenizer, texts: Sequence[str], *,
                  gamma: int | str | Any = 4, max_new_tokens: int = 64,
                  add_bos: bool | None = None) -> None:
  """Raises ValueError, naming max_new_tokens, unless the longest prompt
  (encoded as `run` encodes it) + max_new_tokens + a round's lookahead
  (gamma; "auto": its largest draft length, `autotune.AUTO_GAMMA_MAX`; a
  rule: its gamma_max) fits the target's and the draft's max_positions.

  `run` checks it first too: the decode loop would refuse it only after
  gamma="auto" spent a minute timing the loop.
  """
  if isinstance(texts, (str, bytes)):
    raise TypeError(f"texts must be a sequence of prompts, one row each, got "
                    f"a bare {type(texts).__name__}: pass [texts].")
  max_new_tokens = _checks.check_int("max_new_tokens", max_new_tokens, low=1)
  if isinstance(gamma, str):
    lookahead, what = autotune.AUTO_GAMMA_MAX, "gamma='auto' drafts up to it"
  elif hasattr(gamma, "gamma_max"):
    lookahead, what = gamma.gamma_max, "the rule's gamma_max"
  else:
    lookahead, what = _checks.check_int("gamma", gamma, low=1), "gamma"
  _, lengths = encode_batch(tokenizer, list(texts),
                            add_bos=_with_bos(tokenizer, add_bos))
  longest = int(lengths.max())
  # The last position a round scores: (longest - 1) + (max_new_tokens - 1)
  # + lookahead, as in the decode loop.
  needed = longest + max_new_tokens + lookahead - 1
  for name, model in (("target", target), ("draft", draft)):
    limit = getattr(model, "max_positions", None)
    if limit is not None and needed > limit:
      room = limit - longest - lookahead + 1
      raise ValueError(
          f"max_new_tokens={max_new_tokens} does not fit the {name}'s "
          f"context of {limit} positions: the longest prompt ({longest} "
          f"tokens) + max_new_tokens + a round's lookahead ({lookahead}: "
          f"{what}) - 1 needs {needed}. "
          + (f"Pass max_new_tokens <= {room}, a shorter prompt or a "
             "smaller gamma." if room >= 1 else
             "Pass a shorter prompt or a smaller gamma."))


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
  # Under a constraint: whether each row's text is in its language (a row
  # the budget cut is a prefix of a text in it).
  complete: list[bool] | None = None

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
        progress: Callable[[str], None] | None = None,
        constraint: Any = None, plan_device: Any = None) -> TextRun:
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
    constraint: a `specjax.constraint.Constraint` for both calls (compiled
      with `tokenizer`); not with gamma "auto".
    plan_device: with gamma "auto", price the rule from this device's
      roofline instead of timing this machine (`auto_rule(device=...)`: a
      `roofline.Device` or a name in `roofline.ACCELERATORS`).

  Returns:
    A `TextRun`; each call is compiled by a first, untimed run.
  """
  add_bos = _with_bos(tokenizer, add_bos)
  # encode_batch refuses a bare string, but list() would split it first.
  if isinstance(texts, (str, bytes)):
    raise TypeError(f"texts must be a sequence of prompts, one row each, got "
                    f"a bare {type(texts).__name__}: pass [texts].")
  if isinstance(gamma, str) and gamma != "auto":
    raise ValueError(f"gamma must be an int >= 1, 'auto' or a draft-length "
                     f"rule, got {gamma!r}.")
  if plan_device is not None and gamma != "auto":
    raise ValueError(f"plan_device prices gamma='auto'; got gamma={gamma!r}. "
                     "Pass gamma='auto', or leave plan_device out.")
  check_context(target, draft, tokenizer, texts, gamma=gamma,
                max_new_tokens=max_new_tokens, add_bos=add_bos)
  prompts, lengths = encode_batch(tokenizer, list(texts), add_bos=add_bos)
  key = jax.random.key(_checks.check_int("seed", seed, low=0,
                                        high=_checks.MAX_SEED))
  eos = tokenizer.eos_ids or None
  if isinstance(gamma, str):
    if constraint is not None:
      raise ValueError("gamma='auto' prices a draft-length rule, which "
                       "constraint= does not run with; pass an int gamma.")
    if progress is not None and plan_device is None:
      progress("gamma=auto: timing the loop's passes and rounds on this "
               "machine to price a Goodput rule (once per process and "
               "shape) ...")
    gamma = autotune.auto_rule(target, draft, prompts, lengths,
                               max_new_tokens=max_new_tokens,
                               sampling=sampling, device=plan_device)
    if progress is not None:
      progress(f"gamma=auto: draft lengths {gamma.planned_widths}, a draft "
               f"pass costing {gamma.c:.2f} target passes.")
  kwargs = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos,
                constraint=constraint)
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
  if constraint is not None:
    result.complete = [
        constraint_lib.accepts(constraint, row[:n]) for row, n in zip(
            np.asarray(out.tokens), np.asarray(out.lengths))]
  if compare:
    base = outs["generate"]
    result.baseline_seconds = seconds["generate"]
    result.baseline_tokens_per_s = (
        int(np.asarray(base.lengths).sum()) / seconds["generate"])
    result.baseline_texts = _texts(tokenizer, base)
  return result


# Moved names raise an error naming their new home.
__getattr__ = _moved.module_getattr(__name__, {
    "make_draft": "specjax.harness.drafts.make_draft",
    "MAX_BIGRAM_VOCAB": "specjax.harness.drafts.MAX_BIGRAM_VOCAB",
})
