"""Named, trained models on demand: `specjax.harness.zoo.load(name)`.

Nothing is downloaded. A model missing from the cache directory is trained
from its recipe on the built-in corpus (the interpreter's standard library),
and later calls load it. Names:

  <size>                 a Transformer of `specjax.train.recipes.SIZES`
                         (target-3m, draft-0.1m, ...) trained on the corpus.
  unigram, bigram        count models fit on the corpus' training split.
  distilled-<draft>@<target>
                         the <draft> size trained to match <target>'s
                         next-token distributions (forward KL, DistillSpec),
                         on corpus text (see `specjax.train.distill`).
  exit-adapter-<k>@<target>
                         an `ExitAdapter` for `SelfDraft(target, layers=k,
                         adapter=...)`, distilled from <target>'s full depth
                         (forward KL) with the target frozen (see
                         `specjax.train.exit_adapter`). `load` returns the
                         adapter, not a model; the target comes from
                         `load(<target>, overrides=teacher_overrides)`.
  eagle-head@<target>    an EAGLE feature-level head for <target>
                         (`specjax.EagleDraft`; `load` returns the draft,
                         holding the target), distilled on the target's
                         features and next-token distributions
                         (`specjax.train.eagle`).

  bpe<V>                 a byte-level BPE of V ids (the EOS included, V in
                         [259, 65536]) trained on the corpus' training files
                         (`specjax.data.bpe.train_bpe`); `load` and
                         `tokenizer` return it (an `HFTokenizer`).
  bpe<V>-<size>          the <size> Transformer over bpe<V>'s ids: the same
                         architecture and recipe, its embedding and head
                         V rows, trained on the corpus encoded with bpe<V>
                         (`Corpus.tokenized`); e.g. bpe1024-target-3m.
  distilled-bpe<V>-<draft>@bpe<V>-<target>
                         as distilled-<draft>@<target>, over bpe<V>'s ids
                         (a student and its teacher share one vocabulary).

A BPE name reads as "<tokenizer>-<model>": the prefix names the vocabulary,
the rest the model it holds, so every byte-level name has its BPE twin and
`names()` lists them for V = 1024 (`BPE_VOCABS`): 1024 ids keep the head of
draft-0.1m (D = 48) at 49k parameters, under half the draft, and the
target-3m's at 262k (8%), while the BPE writes the stdlib in 2.6 bytes per
token. `tokenizer(name)` gives the tokenizer of any name (the
`ByteTokenizer` for byte-level models), and `load_with_tokenizer(name)`
the pair `(model, tokenizer)`, the tokenizer read from the model's own
entry, where it is stored (tokenizer.json). BPE models train without
held-out bits per byte (`eval_every` is 0: the trainer's measure counts
byte ids).

`overrides` change a recipe (e.g. `{"num_steps": 300}` for a quick run).

Integrity. An entry is stored under `<name>-<key>`, where the key is a
sha256 over everything that determines the model (`recipe()`): the zoo's
format version, the model config, the training config (minus fields that do
not touch the weights: progress bars, logging, evaluation, checkpoint
cadence), the corpus' content fingerprint, the objective, and for a distilled
draft the teacher's own full key (so `teacher_overrides=None`, "the teacher
uses `overrides`", and `{}`, "the teacher's default recipe", are different
teachers; for an exit adapter None means the target's default recipe, since
the adapter's training config has other fields). A changed recipe, corpus or
teacher is a new entry, never the old model under the same name. A BPE
model's recipe also holds its tokenizer (name, vocab_size and the sha256 of
its content, `HFTokenizer.fingerprint`), so a changed tokenizer is a new
entry too; a tokenizer's own recipe holds the corpus, V and the `tokenizers`
library's version (its trainer). Each entry
records its recipe in `zoo.json`; one whose record differs from the request
is refused with the differing fields named (`ZooError`), never returned.

Entries are written atomically: training runs in `<entry>.partial` (resumed
there after a crash) and the finished directory is renamed into place, so a
reader never sees half an entry. A file lock (`fcntl.flock` on
`<cache>/.locks/<entry>.lock`) makes concurrent processes asking for the same
model train it once: the others wait, then load it.

The cache lives in `~/.cache/specjax`, or `$SPECJAX_CACHE`, or `cache_dir=`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from typing import Any

import numpy as np

from specjax import data
from specjax.data import bpe as bpe_lib
from specjax.cache_dir import CACHE_ENV  # pylint: disable=unused-import
from specjax.cache_dir import resolve_cache_dir
from specjax.models import eagle as eagle_models
from specjax.models.exit_adapter import ExitAdapterConfig
from specjax.models.ngram import NGramLM
from specjax.train import checkpoint as checkpoint_lib
from specjax.train import distill
from specjax.train import eagle as eagle_train
from specjax.train import exit_adapter as exit_adapter_lib
from specjax.train import losses
from specjax.train import optim
from specjax.train import recipes
from specjax.train import trainer

NGRAMS = {"unigram": 1, "bigram": 2}
# The BPE vocabularies `names()` lists (any V in [259, 2**16] loads).
BPE_VOCABS = (1024,)
_BPE = "bpe"
# The trainer checks a model's head holds the byte tokenizer's 259 ids;
# corpus tokens are uint16.
_BPE_MIN, _BPE_MAX = data.BYTE_VOCAB_SIZE, 2**16
TOKENIZER_DIR = "tokenizer"
_DISTILLED = "distilled-"
_EXIT_ADAPTER = "exit-adapter-"
_EAGLE = "eagle-head@"

# Bump when the stored layout or the meaning of a recipe changes: every key
# changes with it, so old entries are never mistaken for new ones.
FORMAT = "specjax.harness.zoo/2"
RECORD_FILE = "zoo.json"
# Training-config fields that do not change the trained weights (display,
# logging, held-out evaluation, checkpoint cadence; resume is bitwise).
_NOT_IN_KEY = ("progress", "log_every", "eval_every", "eval_batches",
               "eval_batch_size", "eval_seed", "checkpoint_every",
               "max_to_keep")
# The objective each kind trains with (part of the recipe).
_OBJECTIVES = {"transformer": "next_token", "distilled": "forward_kl",
               "ngram": "counts", "exit_adapter": "forward_kl",
               "bpe": "bpe merges (specjax.data.bpe.train_bpe)",
               "eagle": (f"eagle_features x {eagle_train.FEATURE_WEIGHT:g}"
                         f" + forward_kl x {eagle_train.KL_WEIGHT:g}; inputs "
                         f"{eagle_train.INPUTS}")}


class ZooError(ValueError):
  """A cached entry does not match what was asked for; the message says why."""


def names() -> list[str]:
  """Every name `load` accepts (distilled pairs are listed for drafts < targets)."""
  sizes = [s for s in recipes.SIZES if s != "tiny"]
  drafts = [s for s in sizes if s.startswith("draft-")]
  targets = [s for s in sizes if s.startswith("target-")]
  bpe = [f"{_BPE}{v}" for v in BPE_VOCABS]
  return (sorted(NGRAMS) + sizes
          + [f"{_DISTILLED}{d}@{t}" for d in drafts for t in targets]
          + bpe + [f"{b}-{s}" for b in bpe for s in sizes]
          + [f"{_DISTILLED}{b}-{d}@{b}-{t}" for b in bpe for d in drafts
             for t in targets]
          + [f"{_EXIT_ADAPTER}{k}@{t}" for t in targets
             for k in range(1, recipes.SIZES[t]["num_layers"])]
          + [f"{_EAGLE}{t}" for t in targets])


def _bpe_vocab(name: str) -> int | None:
  """V of "bpe<V>" (one spelling, V in range), else None."""
  digits = name[len(_BPE):]
  if (name.startswith(_BPE) and digits.isdecimal() and digits == str(
      int(digits)) and _BPE_MIN <= int(digits) <= _BPE_MAX):
    return int(digits)
  return None


def split_size(size: str) -> tuple[int | None, str]:
  """(V, base size) of a model size: (None, size) for a byte-level one,
  (V, base) for "bpe<V>-<base>"; raises for an unknown size."""
  if size in recipes.SIZES:
    return None, size
  prefix, _, base = size.partition("-")
  vocab = _bpe_vocab(prefix)
  if vocab is None or base not in recipes.SIZES:
    raise ValueError(f"Unknown model size {size!r}: a size of "
                     f"{sorted(recipes.SIZES)}, or bpe<V>-<size> with V in "
                     f"[{_BPE_MIN}, {_BPE_MAX}].")
  return vocab, base


def _is_size(size: str) -> bool:
  try:
    split_size(size)
  except ValueError:
    return False
  return True


def parse_name(name: str) -> tuple[str, str, str | None]:
  """(kind, size, teacher) for a model name; raises for an unknown one.

  Kinds: "ngram", "bpe" (a tokenizer; size is its name), "transformer",
  "distilled", "exit_adapter", "eagle". A size may be "bpe<V>-<size>"
  (`split_size`)."""
  if not isinstance(name, str):
    raise TypeError(f"name must be a string, got {type(name).__name__}.")
  if name in NGRAMS:
    return "ngram", name, None
  if _bpe_vocab(name) is not None:
    return "bpe", name, None
  if _is_size(name):
    return "transformer", name, None
  if name.startswith(_EAGLE) and name[len(_EAGLE):] in recipes.SIZES:
    return "eagle", "eagle-head", name[len(_EAGLE):]
  if name.startswith(_DISTILLED) and "@" in name:
    student, teacher = name[len(_DISTILLED):].split("@", 1)
    if _is_size(student) and _is_size(teacher):
      if split_size(student)[0] != split_size(teacher)[0]:
        raise ValueError(
            f"{name!r}: a distilled draft learns its teacher's next-token "
            "distributions, so both need one vocabulary; give both sizes "
            "the same bpe<V>- prefix, or neither.")
      return "distilled", student, teacher
  if name.startswith(_EXIT_ADAPTER) and "@" in name:
    k, teacher = name[len(_EXIT_ADAPTER):].split("@", 1)
    # One spelling per k ("01" would be a second cache entry of the same).
    if (k.isdecimal() and k == str(int(k)) and teacher in recipes.SIZES
        and 0 < int(k) < recipes.SIZES[teacher]["num_layers"]):
      return "exit_adapter", k, teacher
  raise ValueError(f"Unknown zoo model {name!r}. Known names: "
                   f"{', '.join(names())} (and 'tiny').")


def _teacher_overrides(overrides, teacher_overrides):
  return overrides if teacher_overrides is None else teacher_overrides


def _check_overrides(overrides, teacher_overrides) -> None:
  for arg, value in (("overrides", overrides),
                     ("teacher_overrides", teacher_overrides)):
    if value is not None and not hasattr(value, "items"):  # a mapping
      raise TypeError(f"{arg} must be a dict of training-config fields (e.g. "
                      f"{{'num_steps': 300}}) or None, got "
                      f"{type(value).__name__}.")


def _config(size: str, overrides: dict[str, Any] | None,
            kind: str = "transformer", teacher: str = "",
            teacher_overrides: dict[str, Any] | None = None):
  """The recipe of `size` with dotted `overrides` ("optim.lr": 1e-3) applied.

  For an exit adapter, `size` is its k (`recipes.exit_adapter_config`). For
  the EAGLE head (kind "eagle"), the head of the `teacher` Transformer that
  `teacher_overrides` (None: `overrides`) describe.
  """
  if kind == "eagle":
    teacher_config = _config(teacher, _teacher_overrides(overrides,
                                                         teacher_overrides))
    config = eagle_train.train_config(
        trainer.model_config_from(teacher_config))
  elif kind == "exit_adapter":
    config = recipes.exit_adapter_config(int(size))
  else:
    vocab, base = split_size(size)
    config = recipes.train_config(base)
    if vocab is not None:
      config.model_name = size
      config.model.vocab_size = vocab
  config.progress = True
  for key, value in (overrides or {}).items():
    if not isinstance(key, str):
      raise TypeError(f"overrides: keys are dotted field names such as "
                      f"'optim.lr', got {key!r}.")
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      # A leaf on the way ("optim.lr.x") ends the walk, like a missing part.
      node = node.get(part) if hasattr(node, "get") else None
      if node is None:
        break
    if not hasattr(node, "get") or leaf not in node:
      raise ValueError(f"overrides: {key!r} is not a field of the {size} "
                       "training config.")
    if hasattr(node[leaf], "items"):
      # {"model": {"d_model": 48}} would replace the whole block, which
      # would then fail for its missing fields.
      raise ValueError(f"overrides: {key!r} is a block of fields; override "
                       f"one field with a dotted key, e.g. "
                       f"{{'{key}.{next(iter(node[leaf]))}': ...}}.")
    try:
      node[leaf] = value
    except (TypeError, ValueError) as e:  # ml_collections' type check
      raise TypeError(f"overrides: {key!r} = {value!r} does not fit the "
                      f"field, whose recipe value is {node[leaf]!r} "
                      f"({type(node[leaf]).__name__}).") from e
  if kind == "exit_adapter" and config.model.layers != int(size):
    raise ValueError(f"overrides: the name sets the kept blocks "
                     f"(exit-adapter-{size}@...); model.layers may not be "
                     f"overridden (got {config.model.layers!r}).")
  if kind in ("transformer", "distilled") and split_size(size)[0]:
    vocab = split_size(size)[0]
    if config.model.vocab_size != vocab:
      raise ValueError(f"overrides: the name sets the vocabulary ({size}: "
                       f"{vocab} ids); model.vocab_size may not be "
                       f"overridden (got {config.model.vocab_size!r}).")
    # Held-out bits per byte counts byte ids (< 256) as the text's bytes,
    # which BPE ids are not (the key ignores eval_every: same entry).
    config.eval_every = 0
  if kind == "eagle":
    # A head maps features, not tokens, to logits: no held-out evaluation
    # while training, whatever a draft budget shared with it says (the key
    # ignores eval_every, so the entry is the same).
    config.eval_every = 0
  # Bad values (num_steps=-5, optim.lr=-1, a seq_len past the model's
  # positions) are refused here, before a recipe key, a lock or a
  # "training ..." line exists: `trainer.train` would refuse them later.
  trainer.check_config(config)
  optim.make_optimizer(config.optim, config.num_steps)
  if kind in ("transformer", "distilled"):  # config.model is a Transformer
    model_config = trainer.model_config_from(config)
    trainer.check_seq_len(config.seq_len, model_config)
    losses.check_vocab_size(
        model_config.vocab_size, "overrides: model.vocab_size",
        f"the zoo trains on the byte corpus; use {data.BYTE_VOCAB_SIZE}.")
  if kind == "eagle":
    # A model.* override meant for the teacher (overrides serve both when
    # teacher_overrides is None) would reshape the head too, which train_head
    # would refuse only after the teacher had trained.
    head = trainer.model_config_from(config)
    want = eagle_models.head_config(
        trainer.model_config_from(teacher_config), mlp_dim=head.mlp_dim)
    if head != want:
      raise ValueError(
          "overrides: the head's config follows its teacher (one block of "
          "its width and flavour; model.mlp_dim alone is the head's own): "
          + "; ".join(checkpoint_lib.config_diff(
              dataclasses.asdict(head), dataclasses.asdict(want)))
          + ". Give the teacher's model.* fields as teacher_overrides.")
  return config


def _digest(obj: Any) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _corpus_identity(corpus: data.Corpus) -> dict:
  """The parts of a corpus fingerprint that determine the text (not its path)."""
  fp = corpus.fingerprint()
  return {k: fp[k] for k in ("sha256", "bytes", "heldout_fraction",
                             "tokenizer")}


def _check_corpus(corpus) -> None:
  if corpus is not None and not isinstance(corpus, data.Corpus):
    raise TypeError("corpus must be a specjax.data.Corpus (e.g. "
                    "data.text_corpus(path)) or None for the built-in one, "
                    f"got {type(corpus).__name__}.")
  if corpus is not None and corpus.tokenizer is not None:
    raise ValueError("corpus must be the text (its byte tokens), not "
                     f"corpus.tokenized(...) ({corpus.tokenizer.name}): a BPE "
                     "name encodes it with the zoo's own bpe<V>.")


def recipe(name: str, *, overrides: dict[str, Any] | None = None,
           teacher_overrides: dict[str, Any] | None = None,
           corpus: data.Corpus | None = None, cache_dir: str | None = None,
           verbose: bool = False) -> dict:
  """The JSON-ready recipe that determines the model `load` returns.

  Keys: format, name, kind, objective, corpus (content identity), and for
  Transformers model_config and train_config; for distilled drafts also
  teacher (the teacher's full recipe); for BPE models tokenizer (name,
  vocab_size, sha256 of its content), the corpus identity naming it too;
  for a tokenizer vocab_size and library. `key(recipe)` names the cache
  entry. Reading the default corpus costs about a second (its content is
  hashed); a BPE model's recipe reads its tokenizer from `cache_dir`,
  training it there first when missing (seconds; `verbose` says so).
  """
  kind, size, teacher_name = parse_name(name)
  _check_overrides(overrides, teacher_overrides)
  _check_corpus(corpus)
  corpus = _default_corpus(kind, size, overrides) if corpus is None else corpus
  out = {"format": FORMAT, "name": name, "kind": kind,
         "objective": _OBJECTIVES[kind], "corpus": _corpus_identity(corpus)}
  if kind == "bpe":
    if overrides or teacher_overrides:
      raise ValueError(f"overrides do not apply to the tokenizer {name!r} "
                       f"(got {overrides or teacher_overrides}); its recipe "
                       "is its corpus and vocabulary size.")
    import tokenizers  # pylint: disable=g-import-not-at-top
    out.update(vocab_size=_bpe_vocab(name),
               library=f"tokenizers {tokenizers.__version__}")
    return out
  if kind in ("transformer", "distilled") and split_size(size)[0]:
    tok = _bpe_of(size, cache_dir, corpus, verbose)
    out["corpus"] = _corpus_identity(corpus.tokenized(tok))
    out["tokenizer"] = {"name": tok.name, "vocab_size": tok.vocab_size,
                        "sha256": tok.fingerprint()}
  if kind == "ngram":
    if overrides:
      raise ValueError(f"overrides do not apply to the count model {name!r} "
                       f"(got {overrides}); it has no training recipe.")
    out.update(order=NGRAMS[name], vocab_size=data.BYTE_VOCAB_SIZE)
    return out
  config = _config(size, overrides, kind, teacher_name, teacher_overrides)
  train_config = json.loads(config.to_json_best_effort())
  for field in _NOT_IN_KEY:
    train_config.pop(field, None)
  out["train_config"] = train_config
  if kind == "exit_adapter":
    teacher_overrides = teacher_overrides or {}
    out["teacher"] = recipe(teacher_name, corpus=corpus,
                            overrides=teacher_overrides)
    target_config = trainer.model_config_from(_config(teacher_name,
                                                      teacher_overrides))
    # As JSON (the record's form): the config's tuples are lists there.
    out["model_config"] = json.loads(json.dumps(
        checkpoint_lib.model_config_dict(ExitAdapterConfig(
            target=target_config, layers=tuple(range(int(size))),
            mlp_dim=config.model.mlp_dim))))
    _check_teacher_window(name, config, out["teacher"])
    return out
  out["model_config"] = checkpoint_lib.model_config_dict(
      trainer.model_config_from(config))
  if kind in ("distilled", "eagle"):
    out["teacher"] = recipe(
        teacher_name, corpus=corpus,
        overrides=_teacher_overrides(overrides, teacher_overrides),
        cache_dir=cache_dir, verbose=verbose)
    _check_teacher_window(name, config, out["teacher"])
  elif teacher_overrides is not None:
    raise ValueError(f"teacher_overrides apply to distilled and eagle-head "
                     f"names only, not {name!r}.")
  return out


def _bpe_of(size: str, cache_dir, corpus, verbose):
  """The zoo's bpe<V> (trained on `corpus`) of a "bpe<V>-<base>" size;
  `verbose` says so only when it trains (every recipe reads it)."""
  name = f"{_BPE}{split_size(size)[0]}"
  cache_dir = resolve_cache_dir(cache_dir)
  there = os.path.isdir(_entry_path(cache_dir, name,
                                    recipe(name, corpus=corpus)))
  return load(name, cache_dir=cache_dir, corpus=corpus,
              verbose=verbose and not there)


def _check_teacher_window(name: str, config, teacher: dict) -> None:
  """The teacher scores every training window: a seq_len past its
  max_positions would fail at the first step, after the teacher trained."""
  positions = teacher["model_config"].get("max_positions")
  if positions is not None and config.seq_len > positions:
    raise ValueError(
        f"{name}: seq_len {config.seq_len} (overrides) is longer than the "
        f"teacher's max_positions {positions} (teacher_overrides): the "
        "teacher scores every training window. Set overrides' seq_len to at "
        f"most {positions}, or the teacher's model.max_positions higher.")


def key(recipe_: dict) -> str:
  """The cache key of a recipe: 16 hex digits of its sha256."""
  return _digest(recipe_)[:16]


def entry_dir(name: str, *, cache_dir: str | None = None,
              overrides: dict[str, Any] | None = None,
              teacher_overrides: dict[str, Any] | None = None,
              corpus: data.Corpus | None = None) -> str:
  """Where `load` keeps (or would keep) this model: `<cache>/<name>-<key>`.
  (A BPE model's key holds its tokenizer's content, which is trained into
  the cache first if missing.)"""
  cache_dir = resolve_cache_dir(cache_dir)
  return _entry_path(cache_dir, name, recipe(
      name, overrides=overrides, teacher_overrides=teacher_overrides,
      corpus=corpus, cache_dir=cache_dir))


def _entry_path(root: str, name: str, recipe_: dict) -> str:
  return os.path.join(root, f"{name.replace('@', '_from_')}-{key(recipe_)}")


def _default_corpus(kind: str, size: str, overrides) -> data.Corpus:
  if kind in ("ngram", "bpe"):
    return data.stdlib_corpus()
  if kind == "eagle":
    # The head's schedule is a draft recipe's; so is its corpus field.
    return trainer.load_corpus(_config(eagle_train.RECIPE_OF, overrides))
  return trainer.load_corpus(_config(size, overrides, kind))


def _recipe_diff(stored: Any, requested: Any, prefix: str = "") -> list[str]:
  """`path: stored vs requested` for every differing leaf of two recipes."""
  if isinstance(stored, dict) and isinstance(requested, dict):
    lines = []
    for k in sorted(set(stored) | set(requested)):
      lines += _recipe_diff(stored.get(k, "<absent>"),
                            requested.get(k, "<absent>"), f"{prefix}{k}.")
    return lines
  if stored != requested:
    return [f"{prefix[:-1]}: {stored!r} stored vs {requested!r} requested"]
  return []


def _check_record(directory: str, recipe_: dict) -> None:
  """Refuses an entry whose recorded recipe is not the requested one."""
  path = os.path.join(directory, RECORD_FILE)
  try:
    with open(path) as fh:
      stored = json.load(fh)["recipe"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ZooError(f"The zoo entry {directory!r} has no readable recipe record "
                   f"({path}: {e}). Delete the directory to retrain it.") from e
  diff = _recipe_diff(stored, recipe_)
  if diff:
    raise ZooError(
        f"The zoo entry {directory!r} was made by a different recipe than the "
        "one requested, so it is not returned:\n  " + "\n  ".join(diff[:20])
        + "\nDelete the directory to retrain it, or request the recipe it "
        "records.")


def _write_record(directory: str, recipe_: dict, extra: dict) -> None:
  tmp = os.path.join(directory, RECORD_FILE + ".tmp")
  with open(tmp, "w") as fh:
    json.dump({"recipe": recipe_, "key": key(recipe_), **extra}, fh, indent=1,
              sort_keys=True)
  os.replace(tmp, os.path.join(directory, RECORD_FILE))


@contextlib.contextmanager
def _locked(root: str, entry: str, verbose: bool):
  """Holds an exclusive lock on `entry` (blocking; says so when it waits)."""
  lock_dir = os.path.join(root, ".locks")
  os.makedirs(lock_dir, exist_ok=True)
  with open(os.path.join(lock_dir, os.path.basename(entry) + ".lock"),
            "a") as fh:
    try:
      fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      _say(verbose, f"waiting for another process to finish "
           f"{os.path.basename(entry)} (lock {fh.name})")
      fcntl.flock(fh, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(fh, fcntl.LOCK_UN)


def _publish(partial: str, directory: str) -> None:
  """Renames a finished `partial` directory into place (atomic on POSIX)."""
  if os.path.isdir(directory):  # a leftover from a crash after a rename
    shutil.rmtree(partial)
    return
  os.rename(partial, directory)


def _say(verbose: bool, message: str) -> None:
  if verbose:
    print(f"[specjax.harness.zoo] {message}", flush=True)


def _expected_minutes(config, size: str) -> float:
  tokens = config.num_steps * config.batch_size * config.seq_len
  return tokens / recipes.TRAIN_TOKENS_PER_S.get(size, 1000) / 60


def load(name: str, *, cache_dir: str | None = None,
         overrides: dict[str, Any] | None = None,
         teacher_overrides: dict[str, Any] | None = None,
         corpus: data.Corpus | None = None, verbose: bool = True):
  """A trained model by name, training (or resuming) it when it is missing.

  Args:
    name: see the module docstring; `names()` lists them.
    cache_dir: where models live (default: see `resolve_cache_dir()`).
    overrides: dotted training-config fields to change, e.g.
      `{"num_steps": 300, "batch_size": 16}` (Transformers and distilled).
    teacher_overrides: for distilled names, the overrides of the teacher
      (so it is the very target the draft will serve); None (default): the
      teacher uses `overrides`; `{}`: the teacher's default recipe.
    corpus: the corpus to train on; default the recipe's (the stdlib).
    verbose: print what is loaded or trained, and the expected time.

  Returns:
    A `TransformerLM` or an `NGramLM` (both `CausalLM` pytrees), for an
    exit-adapter name an `ExitAdapter`, for a bpe<V> name its `HFTokenizer`,
    made by exactly the requested recipe (see the module docstring).

  Raises:
    ZooError: the entry's recorded recipe differs from the request.
  """
  return _load(name, cache_dir, overrides, teacher_overrides, corpus,
               verbose)[0]


def tokenizer(name: str, *, cache_dir: str | None = None,
              overrides: dict[str, Any] | None = None,
              corpus: data.Corpus | None = None, verbose: bool = True):
  """The tokenizer of a zoo name: for bpe<V> and bpe<V>-... names the zoo's
  bpe<V> (an `HFTokenizer`, trained on `corpus`, default the recipe's, into
  the cache when missing), for every other name the `ByteTokenizer`."""
  kind, size, _ = parse_name(name)
  _check_overrides(overrides, None)
  _check_corpus(corpus)
  if kind == "bpe":
    return load(name, cache_dir=cache_dir, corpus=corpus, verbose=verbose)
  if kind in ("transformer", "distilled") and split_size(size)[0]:
    corpus = (_default_corpus(kind, size, overrides) if corpus is None
              else corpus)
    return _bpe_of(size, resolve_cache_dir(cache_dir), corpus, verbose)
  return data.ByteTokenizer()


def load_with_tokenizer(name: str, *, cache_dir: str | None = None,
                        overrides: dict[str, Any] | None = None,
                        teacher_overrides: dict[str, Any] | None = None,
                        corpus: data.Corpus | None = None,
                        verbose: bool = True):
  """`(load(name, ...), its tokenizer)`: a BPE model's tokenizer is read from
  the model's own entry (checked against its recipe's fingerprint), any
  other model's is the `ByteTokenizer`. Not for a bpe<V> name (`tokenizer`
  is)."""
  kind, _, _ = parse_name(name)
  if kind == "bpe":
    raise ValueError(f"{name!r} is a tokenizer; load it with "
                     "zoo.tokenizer(name) or zoo.load(name).")
  model, directory, recipe_ = _load(name, cache_dir, overrides,
                                    teacher_overrides, corpus, verbose)
  if "tokenizer" not in recipe_:
    return model, data.ByteTokenizer()
  try:
    tok = bpe_lib.load(os.path.join(directory, TOKENIZER_DIR),
                       name=recipe_["tokenizer"]["name"])
  except (OSError, ValueError) as e:
    raise ZooError(f"The zoo entry {directory!r} has no readable tokenizer "
                   f"({e}). Delete the directory to retrain it.") from e
  if tok.fingerprint() != recipe_["tokenizer"]["sha256"]:
    raise ZooError(f"The zoo entry {directory!r} holds a tokenizer other than "
                   "the one its recipe records. Delete the directory to "
                   "retrain it.")
  return model, tok


def _load(name, cache_dir, overrides, teacher_overrides, corpus, verbose):
  """`load`, also returning the entry's directory and recipe."""
  kind, size, teacher_name = parse_name(name)
  _check_overrides(overrides, teacher_overrides)
  _check_corpus(corpus)
  cache_dir_ = resolve_cache_dir(cache_dir)
  corpus = _default_corpus(kind, size, overrides) if corpus is None else corpus
  recipe_ = recipe(name, overrides=overrides,
                   teacher_overrides=teacher_overrides, corpus=corpus,
                   cache_dir=cache_dir_, verbose=verbose)
  directory = _entry_path(cache_dir_, name, recipe_)
  if os.path.exists(directory) and not os.path.isdir(directory):
    # Else found only when the trained entry is moved there, after training.
    raise ZooError(f"The zoo entry {directory!r} is a file, not an entry. "
                   "Delete it to train the entry there.")
  if not os.path.isdir(directory):
    with _locked(cache_dir_, directory, verbose):
      # Another process may have finished it while we waited for the lock.
      if not os.path.isdir(directory):
        _build(name, kind, size, teacher_name, recipe_, directory, cache_dir_,
               overrides, teacher_overrides, corpus, verbose)
  _check_record(directory, recipe_)
  try:
    return _read(name, kind, teacher_name, directory, cache_dir_, overrides,
                 teacher_overrides, corpus, verbose), directory, recipe_
  except (FileNotFoundError, checkpoint_lib.CheckpointError) as e:
    # A file of the entry went missing or is damaged: its own error would
    # say to train first, or name checkpoint internals.
    raise ZooError(f"The zoo entry {directory!r} cannot be read "
                   f"({type(e).__name__}: {checkpoint_lib.first_line(e)}). "
                   "Delete the directory to retrain it.") from e


def _read(name, kind, teacher_name, directory, cache_dir_, overrides,
          teacher_overrides, corpus, verbose):
  """The model of a finished entry (its record already checked)."""
  if kind == "ngram":
    return _read_ngram(name, directory, verbose)
  if kind == "bpe":
    tok = bpe_lib.load(directory, name=name)
    _say(verbose, f"loaded {name} from {directory}")
    return tok
  if kind == "exit_adapter":
    target = _exit_adapter_target(teacher_name, cache_dir_, teacher_overrides,
                                  corpus, verbose)
    adapter, _ = exit_adapter_lib.load_exit_adapter(directory, target)
    _say(verbose, f"loaded {name} ({adapter.param_count():,} parameters) "
         f"from {directory}")
    return adapter
  if kind == "eagle":
    target = load(teacher_name, cache_dir=cache_dir_,
                  overrides=_teacher_overrides(overrides, teacher_overrides),
                  corpus=corpus, verbose=verbose)
    model, _ = eagle_train.load_head(directory, target)
    _say(verbose, f"loaded {name} ({model.param_count():,} parameters of "
         f"its own) from {directory}")
    return model
  model, _ = checkpoint_lib.load_model(directory)
  _say(verbose, f"loaded {name} ({model.param_count():,} parameters) from "
       f"{directory}")
  return model


def _build(name, kind, size, teacher_name, recipe_, directory, cache_dir_,
           overrides, teacher_overrides, corpus, verbose) -> None:
  """Trains (or fits) an entry in `<directory>.partial`, then publishes it.

  Called with the entry's lock held. A `.partial` directory left by a crash
  is resumed (the trainer checks it holds the same model).
  """
  partial = directory + ".partial"
  if kind in ("ngram", "bpe"):
    if os.path.isdir(partial):
      shutil.rmtree(partial)
    if kind == "ngram":
      _fit_ngram(name, partial, corpus, verbose)
    else:
      _say(verbose, f"training {name} on the {corpus.source} corpus' "
           f"training split (seconds) into {directory}")
      bpe_lib.save(bpe_lib.train_bpe(corpus, _bpe_vocab(name)), partial)
    _write_record(partial, recipe_, {"zoo_name": name})
    _publish(partial, directory)
    return
  config = _config(size, overrides, kind, teacher_name, teacher_overrides)
  extra = {"zoo_name": name, "overrides": overrides or {}, "zoo_key":
           key(recipe_)}
  if kind == "exit_adapter":
    _build_exit_adapter(name, size, teacher_name, config, recipe_, directory,
                        cache_dir_, teacher_overrides, corpus, verbose, extra)
    return
  minutes = _expected_minutes(config, split_size(size)[1])
  loss_fn, aux, what = losses.next_token_loss, None, "training"
  train_corpus = corpus
  if "tokenizer" in recipe_:
    tok = _bpe_of(size, cache_dir_, corpus, verbose)
    train_corpus = corpus.tokenized(tok)
    # The entry holds its tokenizer: `load_with_tokenizer` reads it there.
    bpe_lib.save(tok, os.path.join(partial, TOKENIZER_DIR))
  if kind == "distilled":
    aux = load(teacher_name, cache_dir=cache_dir_,
               overrides=(overrides if teacher_overrides is None
                          else teacher_overrides),
               corpus=corpus, verbose=verbose)
    # Forward KL: trained from scratch, TV's piecewise-linear loss gives the
    # student too weak a signal in a short run.
    loss_fn = distill.distillation_loss("forward_kl")
    what = f"distilling from {teacher_name}"
    extra["teacher"] = teacher_name
    extra["teacher_key"] = key(recipe_["teacher"])
    minutes *= 1.5  # the teacher's forward pass rides along
  if kind == "eagle":
    target = load(teacher_name, cache_dir=cache_dir_,
                  overrides=_teacher_overrides(overrides, teacher_overrides),
                  corpus=corpus, verbose=verbose)
    extra["teacher"] = teacher_name
    extra["teacher_key"] = key(recipe_["teacher"])
    # About the teacher's own training rate: its forward pass dominates.
    minutes = _expected_minutes(config, teacher_name)
    _say(verbose, f"training {name} ({config.num_steps} steps of "
         f"{config.batch_size}x{config.seq_len} tokens) into {directory}; "
         f"expect about {minutes:.1f} min on 2 CPU cores")
    start = time.time()
    draft, _ = eagle_train.train_head(target, config, partial, corpus=corpus,
                                      extra_metadata=extra)
    _write_record(partial, recipe_, {"zoo_name": name})
    _publish(partial, directory)
    _say(verbose, f"{name}: {draft.param_count():,} parameters of its own, "
         f"trained in {(time.time() - start) / 60:.1f} min")
    return
  _say(verbose, f"{what} {name} ({config.num_steps} steps of "
       f"{config.batch_size}x{config.seq_len} tokens) into {directory}; "
       f"expect about {minutes:.1f} min on 2 CPU cores")
  start = time.time()
  model, metrics = trainer.train(config, partial, loss_fn=loss_fn, aux=aux,
                                 corpus=train_corpus, extra_metadata=extra)
  _write_record(partial, recipe_, {"zoo_name": name})
  _publish(partial, directory)
  bpb = metrics["eval_bpb"]
  bpb_text = f", held-out bits/byte {bpb[max(bpb)]:.3f}" if bpb else ""
  _say(verbose, f"{name}: {model.param_count():,} parameters{bpb_text}, "
       f"trained in {(time.time() - start) / 60:.1f} min")


def _exit_adapter_target(teacher_name, cache_dir_, teacher_overrides, corpus,
                         verbose):
  return load(teacher_name, cache_dir=cache_dir_,
              overrides=teacher_overrides or {}, corpus=corpus,
              verbose=verbose)


def _build_exit_adapter(name, size, teacher_name, config, recipe_, directory,
                        cache_dir_, teacher_overrides, corpus, verbose,
                        extra) -> None:
  """`_build` for an exit adapter: the target frozen, the adapter trained."""
  partial = directory + ".partial"
  target = _exit_adapter_target(teacher_name, cache_dir_, teacher_overrides,
                                corpus, verbose)
  extra.update(teacher=teacher_name, teacher_key=key(recipe_["teacher"]))
  # Teacher and student trunk forward, adapter and head backward: about
  # the target's own training throughput.
  tokens = config.num_steps * config.batch_size * config.seq_len
  minutes = tokens / recipes.TRAIN_TOKENS_PER_S.get(teacher_name, 1000) / 60
  _say(verbose, f"training {name} ({config.num_steps} steps of "
       f"{config.batch_size}x{config.seq_len} tokens, {teacher_name} frozen) "
       f"into {directory}; expect about {minutes:.1f} min on 2 CPU cores")
  start = time.time()
  _, metrics = exit_adapter_lib.train_exit_adapter(
      target, int(size), partial, config=config, corpus=corpus,
      extra_metadata=extra)  # the adapter's mlp_dim is config.model's
  _write_record(partial, recipe_, {
      "zoo_name": name, "heldout_tv": metrics["heldout_tv"],
      "heldout_tv_untrained": metrics["heldout_tv_untrained"]})
  _publish(partial, directory)
  _say(verbose, f"{name}: held-out TV(p, q) "
       f"{metrics['heldout_tv_untrained']:.3f} untrained -> "
       f"{metrics['heldout_tv']:.3f}, trained in "
       f"{(time.time() - start) / 60:.1f} min")


def _read_ngram(name: str, directory: str, verbose: bool) -> NGramLM:
  path = os.path.join(directory, "log_probs.npz")
  with np.load(path) as stored:
    model = NGramLM(log_probs=stored["log_probs"],
                    vocab_size=int(stored["vocab_size"]),
                    order=int(stored["order"]))
  _say(verbose, f"loaded {name} from {path}")
  return model


def _fit_ngram(name: str, directory: str, corpus, verbose: bool) -> None:
  _say(verbose, f"fitting {name} on the {corpus.source} corpus' training "
       f"split (seconds) into {directory.removesuffix('.partial')}")
  model = NGramLM.fit(corpus.tokens("train").astype(np.int32),
                      data.BYTE_VOCAB_SIZE, order=NGRAMS[name])
  os.makedirs(directory, exist_ok=True)
  np.savez(os.path.join(directory, "log_probs.npz"),
           log_probs=np.asarray(model.log_probs),
           vocab_size=model.vocab_size, order=model.order)
