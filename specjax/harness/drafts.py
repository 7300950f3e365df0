"""The one draft registry: a draft spec -> a draft for a target.

Every entry point names drafts with these specs (`experiments.generate
--draft`, the sweep's configs, the experiments and the benchmarks), and
every one of them is resolved here:

  self:N              `SelfDraft`: the target's first N blocks (N >= 0) with its
                      embeddings, final norm and head, sharing its weights
                      and KV cache (no draft prefill, no draft cache)
  self:N+adapter      the same with the zoo's exit adapter trained for the
                      target (a zoo target, named by `config`)
  skip:I,J,...        `SelfDraft.skipping`: the target without blocks I, J,
                      ... (its weights, a cache of its own)
  truncated:N         the target's first N blocks as a `TransformerLM` of
                      its own (`models.derived.truncate`, shared arrays; N =
                      0: its embeddings, final norm and head)
  unigram, bigram     n-gram counts: of the prompts when `prompt_ids` are
                      given (pairs within each prompt), else the zoo's fit
                      of the built-in corpus' training split
  prompt_lookup[:n]   `PromptLookupDraft`: n-grams (up to n, default 3) of
                      the prompt and the output so far ("prompt-lookup" too)
  random:<preset>     an untrained `TransformerConfig` preset on the
                      target's vocabulary and dtypes
  random:D,L          an untrained Transformer of width D and L blocks
  perturbed[:s]       the target plus Gaussian noise of s (default 0.1) x
                      each array's RMS
  <zoo name>          a trained zoo model (`specjax.harness.zoo`):
                      draft-0.1m, distilled-draft-0.1m@target-3m,
                      eagle-head@target-3m, ...; trained on demand
  DIR, hf:<repo_id>   a Hugging Face checkpoint, its vocabulary reconciled
                      with the target's tokenizer (`models.vocab.reconcile`);
                      of another tokenizer, read through token-level
                      intersection (`models.TokenIntersectionDraft`)
  string:<draft>      a checkpoint (DIR, hf:<repo_id>) or a zoo model
                      (byte-level) of another tokenizer writing text, cut
                      into the target's tokens (`models.StringLevelDraft`,
                      string-level exact match)
  slrs:<draft>        a byte-level checkpoint or zoo model of another
                      tokenizer, proposing the target's tokens by the law
                      of its text's first token
                      (`models.StringRejectionDraft`, string-level
                      rejection sampling)

A config (`configs/reproduce.py`) supplies a zoo draft's recipe (its
entry in `config.drafts`, by name), the target that distilled drafts, EAGLE
heads and exit adapters are trained for, and the cache directory;
`load_models(config)` is the one loader of a config's target and drafts.

Adding a draft kind: one `_KINDS` entry below (its syntax, its figure kind,
a parse and a build function). Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.data.hf_tokenizer import read_json
from specjax.decode import validation
from specjax.harness import zoo
from specjax.models import derived
from specjax.models import hf
from specjax.models import transformer as transformer_lib
from specjax.models import vocab
from specjax.models.eagle import EagleDraft
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models.self_draft import SelfDraft
from specjax.models.string_level import StringLevelDraft
from specjax.models.string_rejection import StringRejectionDraft
from specjax.models.token_intersection import TokenIntersectionDraft
from specjax.models.transformer import TransformerConfig
from specjax.models.transformer import TransformerLM

# The kinds a draft is reported as, in the figures' order: the paper's
# columns first, then ours.
KINDS = ("unigram", "bigram", "prompt_lookup", "transformer", "distilled",
         "self", "eagle")

# A bigram table is V x V float32: refuse beyond this vocabulary (256 MiB).
MAX_BIGRAM_VOCAB = 8192


@dataclasses.dataclass(frozen=True)
class Draft:
  """A resolved draft.

  Attributes:
    name: its display name (the spec, unless given another).
    kind: one of `KINDS`.
    params: array entries its pass reads (a view's: the blocks it keeps).
    model: the draft `CausalLM`.
    description: one line saying what it is.
    target: the target to decode with: the one given, or for a checkpoint
      draft whose vocabulary was padded, the target wrapped to match.
  """
  name: str
  kind: str
  params: int
  model: Any
  description: str = ""
  target: Any = dataclasses.field(default=None, repr=False, compare=False)


class _Unset:
  def __repr__(self):
    return "<unset>"


# make_draft's recipe arguments when not given (None is a recipe value).
_UNSET = _Unset()


@dataclasses.dataclass(frozen=True)
class _Context:
  """What a build may read besides the spec and the target."""
  config: Any
  overrides: dict | None | _Unset
  teacher_overrides: dict | None | _Unset
  tokenizer: Any
  prompt_ids: Any
  corpus: Any
  dtype: Any
  max_positions: int | None
  seed: int
  train: bool


@dataclasses.dataclass(frozen=True)
class _Kind:
  syntax: str
  parse: Callable[[str], Any]  # spec -> args, or None where it is not this kind
  kind: Callable[[Any], str]   # args -> one of KINDS
  build: Callable[..., tuple[Any, str]]  # (args, target, ctx) -> (model, what)
  zoo: bool = False  # a model the zoo trains (byte-level, the corpus)
  # (args, the target's num_layers) -> raises where the spec names blocks
  # the target does not have; None: names no blocks.
  layers: Callable[[Any, int], None] | None = None


# ------------------------------------------------------------------ checks --


def _int_list(text: str) -> list[int] | None:
  parts = text.split(",")
  if not text or not all(p.isdecimal() and p.isascii() for p in parts):
    return None
  return [int(p) for p in parts]


def _transformer(target, spec: str) -> TransformerLM:
  if not isinstance(target, TransformerLM):
    raise TypeError(f"draft {spec!r} is built from the target's blocks: "
                    "target must be a specjax TransformerLM, got "
                    f"{type(target).__name__}.")
  return target


def _blocks(spec: str, k: int, n: int, low: int = 1) -> None:
  if not low <= k <= n:
    raise ValueError(f"draft {spec!r}: N must be in [{low}, {n}] (the "
                     f"target's blocks), e.g. {spec.split(':')[0]}:"
                     f"{max(n // 4, 1)}.")


# ------------------------------------------------------------------- kinds --


def _parse_self(spec):
  head, _, rest = spec.partition(":")
  if head != "self":
    return None
  k, plus, extra = rest.partition("+")
  if not (k.isdecimal() and k.isascii()) or (plus and extra != "adapter"):
    raise ValueError(f"draft {spec!r}: use self:N (the target's first N "
                     "blocks) or self:N+adapter.")
  return int(k), bool(plus)


def _build_self(args, target, ctx):
  k, adapter = args
  spec = f"self:{k}" + ("+adapter" if adapter else "")
  _blocks(spec, k, _transformer(target, spec).config.num_layers, low=0)
  trained = None
  if adapter:
    if ctx.config is None:
      raise ValueError(f"draft {spec!r}: the exit adapter is the zoo's, "
                       "trained for a zoo target; pass the config that names "
                       "it (config=...).")
    trained = _zoo(f"exit-adapter-{k}@{ctx.config.target}", ctx,
                   overrides=None,
                   teacher_overrides=dict(ctx.config.target_overrides))
  draft = SelfDraft(target, layers=k, share_cache=True, adapter=trained)
  n = target.config.num_layers
  return draft, (f"the target's first {k} of {n} blocks (SelfDraft: shared "
                 "weights and KV cache" + (", exit adapter)" if adapter
                                           else ")"))


def _parse_skip(spec):
  head, _, rest = spec.partition(":")
  if head != "skip":
    return None
  skip = _int_list(rest)
  if skip is None:
    raise ValueError(f"draft {spec!r}: use skip:I,J,... (block indices to "
                     "leave out, e.g. skip:1,2).")
  return tuple(skip)


def _check_skip(skip, n):
  if max(skip) >= n:
    raise ValueError(f"draft skip:{','.join(map(str, skip))}: block indices "
                     f"are in [0, {n}) (the target's blocks).")


def _build_skip(skip, target, ctx):
  del ctx
  _check_skip(skip, _transformer(target, "skip:").config.num_layers)
  draft = SelfDraft.skipping(target, skip=list(skip))
  return draft, (f"the target without blocks {list(skip)} (SelfDraft: "
                 "shared weights, its own cache)")


def _parse_truncated(spec):
  head, _, rest = spec.partition(":")
  if head != "truncated":
    return None
  if not (rest.isdecimal() and rest.isascii()):
    raise ValueError(f"draft {spec!r}: use truncated:N, N >= 0 of the "
                     "target's blocks.")
  return int(rest)


def _build_truncated(k, target, ctx):
  del ctx
  n = _transformer(target, "truncated:").config.num_layers
  _blocks(f"truncated:{k}", k, n, low=0)
  what = f"the target's first {k} of {n} blocks, its embeddings and head"
  if k == 0:
    # A TransformerConfig has at least one block; the view computes the
    # same function (embeddings, final norm, head) with a cache of its own.
    return SelfDraft(target, layers=0), what + " (a view)"
  return derived.truncate(target, k), what + " (shared arrays)"


def _parse_ngram(spec):
  return spec if spec in zoo.NGRAMS else None


def _build_ngram(name, target, ctx):
  order = zoo.NGRAMS[name]
  if ctx.prompt_ids is None:
    model = _zoo(name, ctx, *_recipe(name, None, ctx))
    if model.vocab_size != target.vocab_size:
      raise ValueError(
          f"draft {name!r} is the zoo's, over the built-in corpus' "
          f"{model.vocab_size} bytes, but the target has {target.vocab_size} "
          "ids; pass prompt_ids to count the prompts' n-grams instead.")
    return model, f"the zoo's {name} of the built-in corpus"
  if order == 2 and target.vocab_size > MAX_BIGRAM_VOCAB:
    raise ValueError(
        f"draft 'bigram' needs a [V, V] table; V = {target.vocab_size} is "
        f"above {MAX_BIGRAM_VOCAB}. Use prompt_lookup or self:N.")
  rows = _prompt_rows(ctx.prompt_ids)
  # One sequence per prompt: no pair joins a prompt's end to the next one's
  # start, a transition the draft never sees.
  model = NGramLM.fit([row[row >= 0] for row in rows],  # -1 pads a batch
                      target.vocab_size, order)
  return model, f"add-1 {name} counts of the prompts"


def _prompt_rows(prompt_ids) -> list[np.ndarray]:
  """Each prompt's ids, from a list of arrays, a [B, P] array padded with
  -1, or one prompt's ids (a 1-D array or a list of ints)."""
  if (not prompt_ids if isinstance(prompt_ids, (list, tuple))
      else np.ndim(prompt_ids) > 2 or not np.size(prompt_ids)):
    raise ValueError(
        "prompt_ids: an n-gram draft counts the prompts' tokens; give one "
        "integer array per prompt (a list, or a [B, P] array padded with -1), "
        f"got {prompt_ids!r:.80}.")
  if isinstance(prompt_ids, (list, tuple)):  # prompts, or one prompt's ids
    one = bool(prompt_ids) and np.isscalar(prompt_ids[0])
    rows = [prompt_ids] if one else prompt_ids
  else:
    rows = prompt_ids if np.ndim(prompt_ids) == 2 else [prompt_ids]
  return [np.asarray(row) for row in rows]


def _parse_prompt_lookup(spec):
  head, _, rest = spec.partition(":")
  if head not in ("prompt_lookup", "prompt-lookup"):
    return None
  if not rest:
    return 3
  if not (rest.isdecimal() and rest.isascii() and int(rest) >= 1):
    raise ValueError(f"draft {spec!r}: use prompt_lookup or prompt_lookup:n, "
                     "n >= 1 the longest n-gram looked up.")
  return int(rest)


def _build_prompt_lookup(max_ngram, target, ctx):
  del ctx
  return (PromptLookupDraft(vocab_size=target.vocab_size, max_ngram=max_ngram),
          f"n-grams (up to {max_ngram}) of the prompt and output so far")


def _parse_random(spec):
  head, _, rest = spec.partition(":")
  if head != "random":
    return None
  if rest in transformer_lib.PRESETS:
    return rest
  sizes = _int_list(rest)
  if sizes is None or len(sizes) != 2 or min(sizes) < 1:
    raise ValueError(f"draft {spec!r}: use random:<preset> (one of "
                     f"{', '.join(transformer_lib.PRESETS)}) or random:D,L "
                     "(width and blocks).")
  return tuple(sizes)


def _build_random(args, target, ctx):
  _transformer(target, f"random:{args}")
  c = target.config
  if isinstance(args, str):
    config = TransformerConfig.preset(args, vocab_size=c.vocab_size,
                                      dtype=c.dtype, param_dtype=c.param_dtype)
    what = f"an untrained {args!r} on the target's vocabulary"
  else:
    d, layers = args
    config = dataclasses.replace(
        c, d_model=d, num_layers=layers, num_heads=max(1, d // 64),
        num_kv_heads=None, head_dim=None, mlp_dim=None)
    what = f"an untrained Transformer, d_model {d}, {layers} blocks"
  return TransformerLM.create(config, ctx.seed + 1), what


def _parse_perturbed(spec):
  head, _, rest = spec.partition(":")
  if head != "perturbed":
    return None
  try:
    scale = float(rest) if rest else 0.1
  except ValueError:
    scale = -1.0
  if not (rest == "" or rest.replace(".", "", 1).isdecimal()) or scale <= 0:
    raise ValueError(f"draft {spec!r}: use perturbed or perturbed:s, s > 0 "
                     "the noise's scale relative to each array's RMS.")
  return scale


def _build_perturbed(scale, target, ctx):
  _transformer(target, "perturbed")
  leaves, treedef = jax.tree.flatten(target.state)
  keys = jax.random.split(jax.random.key(ctx.seed + 1), len(leaves))
  noisy = [x + scale * jnp.sqrt(jnp.mean(x * x)) * jax.random.normal(k, x.shape)
           for x, k in zip(leaves, keys)]
  return (target.replace(state=jax.tree.unflatten(treedef, noisy)),
          f"the target plus Gaussian noise of {scale:g} x each array's RMS")


# The figure kind of each zoo model kind.
_ZOO_KINDS = {"transformer": "transformer", "distilled": "distilled",
              "eagle": "eagle"}


def _parse_zoo(spec):
  try:
    zoo_kind, size, teacher = zoo.parse_name(spec)
  except ValueError:
    return None
  if zoo_kind not in _ZOO_KINDS:
    return None  # n-grams have their own entry; an exit adapter is no draft
  return _ZOO_KINDS[zoo_kind], size, teacher


def _zoo_draft(args, ctx):
  """(model, its tokenizer, its zoo name) of a zoo draft spec: a BPE
  model's tokenizer is the zoo's BPE, any other's the `ByteTokenizer`; an
  EAGLE head has its target's (None)."""
  kind, size, teacher = args
  name = (size if kind == "transformer" else f"eagle-head@{teacher}"
          if kind == "eagle" else f"distilled-{size}@{teacher}")
  overrides, teacher_overrides = _recipe(name, teacher, ctx)
  model = _zoo(name, ctx, overrides, teacher_overrides)
  tokenizer = (None if kind == "eagle" else zoo.tokenizer(
      name, cache_dir=None if ctx.config is None else ctx.config.get(
          "cache_dir"), overrides=overrides, corpus=ctx.corpus,
      verbose=False))
  return model, tokenizer, name


def _build_zoo(args, target, ctx):
  model, draft_tok, name = _zoo_draft(args, ctx)
  if draft_tok is None:  # an EAGLE head reads its target's own features
    return model, f"the zoo's {name}"
  if ctx.tokenizer is None:
    if model.vocab_size != target.vocab_size:
      raise ValueError(
          f"draft {name!r} has {model.vocab_size} ids and the target "
          f"{target.vocab_size}: it has another tokenizer. Pass the "
          "target's tokenizer (tokenizer=...) to speculate through "
          "token-level intersection, or use string:" + name + ".")
    return model, f"the zoo's {name}"
  try:
    vocab.check_same_tokenizer(ctx.tokenizer, draft_tok)
  except (ValueError, TypeError):
    # Another tokenizer: as a checkpoint of another tokenizer is.
    model = TokenIntersectionDraft.build(
        model, draft_tok, ctx.tokenizer, target_vocab_size=target.vocab_size)
    return model, (f"the zoo's {name}, of another tokenizer, through "
                   f"token-level intersection ({model.num_shared} shared "
                   "tokens)")
  return model, f"the zoo's {name}"


def _recipe(name: str, teacher: str | None, ctx) -> tuple[Any, Any]:
  """A zoo model's (overrides, teacher_overrides): as given, else the
  config's entry of this name, else (a model trained for the config's
  target) that target's recipe as the teacher's, else the zoo's defaults."""
  recipe = _config_recipe(ctx.config, name)
  overrides, teacher_overrides = ctx.overrides, ctx.teacher_overrides
  if overrides is _UNSET:
    overrides = None if recipe is None else dict(recipe.overrides)
  if teacher_overrides is _UNSET:
    teacher_overrides = None
    if recipe is not None:
      teacher_overrides = dict(recipe.teacher_overrides) or None
    elif ctx.config is not None and teacher == ctx.config.target:
      teacher_overrides = dict(ctx.config.target_overrides)
  return overrides, teacher_overrides


def _parse_checkpoint(spec):
  if spec.startswith("hf:") or os.path.isdir(spec):
    return spec
  return None


def _load_checkpoint(spec, ctx):
  """A checkpoint draft and its tokenizer, its context capped at the
  target's."""
  directory = hf.resolve(spec)
  max_positions = ctx.max_positions
  if max_positions is not None:
    # A cap for the target's sake; a draft with a shorter context keeps it.
    own = hf.context_length(read_json(directory, "config.json"))
    if isinstance(own, int):
      max_positions = min(max_positions, own)
  draft, draft_tok = hf.load(directory, dtype=ctx.dtype,
                             max_positions=max_positions)
  if draft_tok is None:
    raise FileNotFoundError(f"draft {spec!r} has no tokenizer.json; it is "
                            "needed to check the vocabularies agree.")
  return draft, draft_tok


def _build_checkpoint(spec, target, ctx):
  if ctx.tokenizer is None:
    raise ValueError(f"draft {spec!r} is a checkpoint: pass the target's "
                     "tokenizer (tokenizer=...), with which its vocabulary "
                     "is checked and reconciled.")
  _transformer(target, spec)
  draft, draft_tok = _load_checkpoint(spec, ctx)
  try:
    vocab.check_same_tokenizer(ctx.tokenizer, draft_tok)
  except ValueError:
    # Another tokenizer: the draft reads the text in its own tokens and
    # proposes the tokens both vocabularies hold.
    draft = TokenIntersectionDraft.build(
        draft, draft_tok, ctx.tokenizer, target_vocab_size=target.vocab_size)
    return (draft, target), (
        f"a checkpoint of another tokenizer, through token-level "
        f"intersection ({draft.num_shared} shared tokens)")
  target, draft = vocab.reconcile(target, draft, ctx.tokenizer, draft_tok)
  return (draft, target), "a checkpoint"


_STRING = "string:"
_SLRS = "slrs:"


def _text_prefix(prefix):
  """The parse of `<prefix><draft>`: a model of another tokenizer whose
  text is read in the target's tokens."""
  def parse(spec):
    if not spec.startswith(prefix):
      return None
    inner = spec[len(prefix):]
    entry, args = _resolve(inner)
    if not (entry.zoo or entry.parse is _parse_checkpoint):
      raise ValueError(f"draft {spec!r}: {prefix}<draft> wraps a model of "
                       "another tokenizer, a checkpoint (DIR, hf:<repo_id>) "
                       f"or a zoo model (byte-level), not {inner!r}.")
    return prefix, inner, entry, args
  return parse


def _build_text(args, target, ctx):
  prefix, inner, entry, inner_args = args
  if ctx.tokenizer is None:
    raise ValueError(f"draft {prefix}{inner!r} cuts the draft's text into "
                     "the target's tokens: pass the target's tokenizer "
                     "(tokenizer=...).")
  if entry.zoo:
    draft, draft_tok, name = _zoo_draft(inner_args, ctx)
    if draft_tok is None:
      raise ValueError(f"draft {prefix}{inner!r}: an EAGLE head reads its "
                       "target's features and shares its tokenizer; use "
                       f"{inner!r} itself.")
    what = f"the zoo's {name}"
  else:
    draft, draft_tok = _load_checkpoint(inner, ctx)
    what = "a checkpoint"
  if prefix == _SLRS:
    # A byte-level draft reads a target token as its last 8 bytes, and
    # the trie's nodes take at most a quarter of its context.
    limit = getattr(draft, "max_positions", None)
    model = StringRejectionDraft.build(
        draft, draft_tok, ctx.tokenizer, target_vocab_size=target.vocab_size,
        max_per_token=8,
        max_nodes=128 if limit is None else min(128, limit // 4))
    return model, (f"{what}, proposing the target's tokens by the law of "
                   "its text's first token (string-level rejection "
                   "sampling)")
  model = StringLevelDraft.build(draft, draft_tok, ctx.tokenizer,
                                 target_vocab_size=target.vocab_size)
  return model, (f"{what}, its text cut into the target's tokens "
                 "(string-level exact match)")


_KINDS = (
    _Kind("self:N[+adapter]", _parse_self, lambda a: "self", _build_self,
          layers=lambda a, n: _blocks(f"self:{a[0]}", a[0], n, low=0)),
    _Kind("skip:I,J,...", _parse_skip, lambda a: "self", _build_skip,
          layers=_check_skip),
    _Kind("truncated:N", _parse_truncated,
          lambda a: "transformer" if a else "self", _build_truncated,
          layers=lambda a, n: _blocks(f"truncated:{a}", a, n, low=0)),
    _Kind("unigram | bigram", _parse_ngram, lambda a: a, _build_ngram),
    _Kind("prompt_lookup[:n]", _parse_prompt_lookup, lambda a: "prompt_lookup",
          _build_prompt_lookup),
    _Kind("random:<preset> | random:D,L", _parse_random,
          lambda a: "transformer", _build_random),
    _Kind("perturbed[:s]", _parse_perturbed, lambda a: "transformer",
          _build_perturbed),
    _Kind("<zoo name>", _parse_zoo, lambda a: a[0], _build_zoo, zoo=True),
    _Kind("DIR | hf:<repo_id>", _parse_checkpoint, lambda a: "transformer",
          _build_checkpoint),
    _Kind("string:<DIR | hf:<repo_id> | zoo name>", _text_prefix(_STRING),
          lambda a: a[2].kind(a[3]), _build_text),
    _Kind("slrs:<DIR | hf:<repo_id> | zoo name>", _text_prefix(_SLRS),
          lambda a: a[2].kind(a[3]), _build_text),
)

SYNTAX = tuple(k.syntax for k in _KINDS)


def _resolve(spec: str) -> tuple[_Kind, Any]:
  if not isinstance(spec, str) or not spec or spec != spec.strip():
    raise TypeError(f"a draft spec is a non-empty string without surrounding "
                    f"spaces ({' | '.join(SYNTAX)}), got {spec!r}.")
  for entry in _KINDS:
    args = entry.parse(spec)
    if args is not None:
      return entry, args
  raise ValueError(
      f"unknown draft {spec!r}: a draft is one of {' | '.join(SYNTAX)} (zoo "
      "names such as draft-0.1m or distilled-draft-0.1m@target-3m: "
      "specjax.harness.zoo.names()).")


def is_zoo_model(spec: str) -> bool:
  """Whether `spec` names a model the zoo trains (byte-level, on the
  built-in corpus), checking its syntax without loading anything."""
  return _resolve(spec)[0].zoo


def check_spec(spec: str, *, num_layers: int | None = None) -> str:
  """The kind (one of `KINDS`) `spec` resolves to, its syntax checked
  without loading anything, and with `num_layers` (the target's blocks)
  the blocks it names. Raises ValueError naming the forms for a spec that
  is none of them."""
  entry, args = _resolve(spec)
  if num_layers is not None and entry.layers is not None:
    entry.layers(args, _checks.check_int("num_layers", num_layers, low=1))
  return entry.kind(args)


# -------------------------------------------------------------------- zoo --


def _config_recipe(config, name: str):
  """The entry of `config.drafts` named `name`, or None."""
  if config is None:
    return None
  return next((d for d in config.drafts if d.name == name), None)


def _zoo(name, ctx, overrides, teacher_overrides):
  cache_dir = None if ctx.config is None else ctx.config.get("cache_dir")
  if not ctx.train and not os.path.isdir(zoo.entry_dir(
      name, cache_dir=cache_dir, overrides=overrides,
      teacher_overrides=teacher_overrides, corpus=ctx.corpus)):
    raise FileNotFoundError(
        f"the zoo has no {name!r} of this recipe and train=False: run the "
        "job that trains it first (python -m experiments.reproduce for the "
        "quick job's models).")
  return zoo.load(name, cache_dir=cache_dir, overrides=overrides,
                  teacher_overrides=teacher_overrides, corpus=ctx.corpus)


# ------------------------------------------------------------------ drafts --


def param_count(model) -> int:
  """Array entries a draft's pass reads: a view (`SelfDraft`) says; else
  every leaf of the pytree."""
  if hasattr(model, "param_count"):
    return int(model.param_count())
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(model)))


def _model_kinds(model) -> tuple[str, ...] | None:
  """The kinds a model's class admits; None where it does not say (a
  CausalLM of another class: any kind)."""
  if isinstance(model, NGramLM):
    return {1: ("unigram",), 2: ("bigram",)}.get(model.order)
  if isinstance(model, TransformerLM):  # trained or distilled: same class
    return ("transformer", "distilled")
  if isinstance(model, PromptLookupDraft):
    return ("prompt_lookup",)
  if isinstance(model, SelfDraft):
    return ("self",)
  if isinstance(model, EagleDraft):
    return ("eagle",)
  return None


def _check_kind(where: str, kind) -> str:
  if kind not in KINDS:
    raise ValueError(f"{where} must be one of {KINDS} (the kinds the "
                     f"figures place), got {kind!r}.")
  return kind


def wrap(name: str, kind: str, model, description: str = "",
         target=None) -> Draft:
  """A `Draft` of a model made elsewhere; its size is the number of array
  entries its pass reads (`param_count`).

  Raises (before counting) for a name that is not a non-empty string, a
  kind outside `KINDS`, a None model, or a kind the model's class
  contradicts (an order-2 `NGramLM` is a "bigram", a `TransformerLM` a
  "transformer" or "distilled", ...).
  """
  if not isinstance(name, str) or not name:
    raise TypeError(f"name must be a non-empty string, got {name!r}.")
  _check_kind("kind", kind)
  if model is None:
    raise TypeError(f"model of draft {name!r} is None: give the draft's "
                    "CausalLM.")
  allowed = _model_kinds(model)
  if allowed is not None and kind not in allowed:
    raise ValueError(f"kind {kind!r} of draft {name!r} contradicts its model, "
                     f"a {type(model).__name__} (kind {' or '.join(allowed)}"
                     "); give the model's kind.")
  return Draft(name=name, kind=kind, params=param_count(model), model=model,
               description=description, target=target)


def _recipe_arg(value):
  return value if value is None or value is _UNSET else dict(value)


def make_draft(spec: str, target, *, name: str | None = None,
               kind: str | None = None, config=None,
               overrides: Mapping[str, Any] | None | _Unset = _UNSET,
               teacher_overrides: Mapping[str, Any] | None | _Unset = _UNSET,
               tokenizer=None, prompt_ids=None, corpus=None, dtype=None,
               max_positions: int | None = None, seed: int = 0,
               train: bool = True) -> Draft:
  """The draft `spec` names (module docstring), for `target`.

  Args:
    spec: a draft spec, e.g. "self:2", "bigram", "distilled-draft-0.1m@
      target-3m", a checkpoint directory or "hf:<repo_id>".
    target: the target `CausalLM` the draft serves.
    name: the draft's display name (default: `spec`).
    kind: the kind the caller expects (one of `KINDS`): refused if the spec
      resolves to another (a config's `kind` field).
    config: a `configs/reproduce.py` ConfigDict: a zoo draft's recipe (its
      `config.drafts` entry of the same name), the zoo target that distilled
      drafts, EAGLE heads and exit adapters serve, and `cache_dir`.
    overrides, teacher_overrides: a zoo draft's recipe (see `zoo.load`;
      None is a value there). Not given: the config's entry of the same
      name; else, for a model trained for the config's target, that
      target's recipe as the teacher's; else the zoo's defaults.
    tokenizer: the target's tokenizer, for a checkpoint draft.
    prompt_ids: the prompts' token ids (one integer array per prompt, a
      [B, P] array padded with -1, or one prompt's ids): unigram and bigram
      count them instead of loading the zoo's corpus fit.
    corpus: the zoo's training corpus (default: the built-in one).
    dtype, max_positions: a checkpoint draft's (`hf.load`); `dtype` is
      checked for every spec, so a typo never passes unread.
    seed: for the random and perturbed drafts.
    train: False refuses to train a zoo model that is not cached.

  Returns:
    A `Draft`; its `target` is the one to decode with (a checkpoint draft
    with a padded vocabulary wraps both models to one vocabulary).
  """
  validation.check_model("target", target)
  if dtype is not None:
    dtype = transformer_lib.float_dtype_name("dtype", dtype)
  entry, args = _resolve(spec)
  resolved_kind = entry.kind(args)
  if kind is not None and _check_kind("kind", kind) != resolved_kind:
    raise ValueError(f"draft {spec!r} is a {resolved_kind} draft, not "
                     f"{kind!r}; give kind {resolved_kind!r}.")
  ctx = _Context(
      config=config,
      overrides=_recipe_arg(overrides),
      teacher_overrides=_recipe_arg(teacher_overrides),
      tokenizer=tokenizer, prompt_ids=prompt_ids, corpus=corpus, dtype=dtype,
      max_positions=max_positions,
      seed=_checks.check_int("seed", seed, low=0, high=_checks.MAX_SEED),
      train=_checks.check_bool("train", train))
  model, what = entry.build(args, target, ctx)
  if isinstance(model, tuple):  # a checkpoint: both models reconciled
    model, target = model
  return wrap(name or spec, resolved_kind, model, f"{spec}: {what}",
              target=target)


# ----------------------------------------------------------------- configs --

_CONFIG_FIELDS = ("name", "kind", "overrides", "teacher_overrides")


def check_config_drafts(drafts: Sequence[Any],
                        where: str = "config.drafts") -> None:
  """A config's drafts, checked before any model loads: a non-empty
  sequence of ConfigDicts with fields name, kind, overrides and
  teacher_overrides, unique names, each name a draft spec whose kind is
  the entry's `kind`."""
  if isinstance(drafts, (str, bytes, Mapping)) or not isinstance(
      drafts, Sequence):
    raise TypeError(f"{where} must be a sequence of the draft ConfigDicts of "
                    "configs/reproduce.py (name 'bigram', kind 'bigram', "
                    f"...), got {drafts!r}.")
  if not drafts:
    raise ValueError(f"{where} is empty: give at least one draft.")
  seen = set()
  for i, spec in enumerate(drafts):
    here = f"{where}[{i}]"
    if not all(hasattr(spec, f) for f in _CONFIG_FIELDS):
      raise TypeError(f"{here} must be a ConfigDict with fields "
                      f"{_CONFIG_FIELDS} (as configs/reproduce.py makes them), "
                      f"got {spec!r}.")
    if not isinstance(spec.name, str) or not spec.name:
      raise TypeError(f"{here}.name must be a non-empty string, got "
                      f"{spec.name!r}.")
    _check_kind(f"{here}.kind", spec.kind)
    try:
      resolved = check_spec(spec.name)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{here}.name: {e}") from None
    if resolved != spec.kind:
      raise ValueError(f"{here}.kind is {spec.kind!r}, but {spec.name!r} is a "
                       f"{resolved} draft; give kind {resolved!r}.")
    if spec.name in seen:
      raise ValueError(f"{where} (by name) repeats {spec.name!r}; give each "
                       "draft once.")
    seen.add(spec.name)


def _cast(model, dtypes):
  """A Transformer in `dtypes` (`TransformerLM.astype` kwargs); other
  models (n-gram, prompt lookup) as they are."""
  return model.astype(**dtypes) if dtypes and hasattr(model, "astype") else model


def load_target(config, *, corpus=None, dtypes: dict | None = None,
                train: bool = True) -> TransformerLM:
  """A config's zoo target (`config.target` with `config.target_overrides`),
  cast to `dtypes` (`{"dtype": ..., "param_dtype": ...}`; default: as
  trained); `train=False` refuses to train it."""
  ctx = _Context(config=config, overrides=_UNSET, teacher_overrides=_UNSET,
                 tokenizer=None, prompt_ids=None, corpus=corpus, dtype=None,
                 max_positions=None, seed=0,
                 train=_checks.check_bool("train", train))
  return _cast(_zoo(config.target, ctx, dict(config.target_overrides), None),
               dtypes)


def load_models(config, *, corpus=None, dtypes: dict | None = None,
                train: bool = True) -> tuple[TransformerLM, list[Draft]]:
  """`(target, [Draft])` as a config names them: the one loader of a
  config's models (the quick job's among them).

  The drafts' specs and kinds are checked before any model loads
  (`check_config_drafts`); each is then resolved by `make_draft` with its
  entry's recipe.
  """
  check_config_drafts(config.drafts)
  target = load_target(config, corpus=corpus, dtypes=dtypes, train=train)
  drafts = []
  for spec in config.drafts:
    draft = make_draft(spec.name, target, kind=spec.kind, config=config,
                       overrides=dict(spec.overrides),
                       teacher_overrides=dict(spec.teacher_overrides) or None,
                       corpus=corpus, train=train)
    drafts.append(dataclasses.replace(draft, model=_cast(draft.model, dtypes)))
  return target, drafts
