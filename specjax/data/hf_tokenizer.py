"""A Hugging Face tokenizer (tokenizer.json, the `tokenizers` library).

No transformers needed: the fast tokenizer's tokenizer.json holds the whole
pipeline (normalizer, pre-tokenizer, model, post-processor, decoder). The
special ids come from tokenizer_config.json (bos/eos/pad token strings) and
the checkpoint's generation_config.json / config.json (EOS ids, which may be
several, as in Llama 3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import warnings
from typing import Any

import numpy as np

from specjax import _checks


def _token_str(entry: Any) -> str | None:
  if isinstance(entry, dict):  # {"content": "<s>", ...}
    return entry.get("content")
  return entry


def read_json(directory: pathlib.Path, name: str) -> dict[str, Any] | None:
  """The JSON object in `directory/name`, None if there is no such file;
  ValueError naming the file if it is not valid JSON or not an object."""
  file = directory / name
  if not file.is_file():
    return None
  try:
    out = json.loads(file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{file} is not valid JSON: {e}") from None
  if not isinstance(out, dict):
    raise ValueError(f"{file} must hold a JSON object, got "
                     f"{type(out).__name__}.")
  return out


def _ids(value: Any, where: str, vocab: int) -> tuple[int, ...]:
  """A config's id or list of ids, checked: `where` names the file and key."""
  if value is None:
    return ()
  values = value if isinstance(value, list) else [value]
  for v in values:
    if isinstance(v, bool) or not isinstance(v, int):
      raise ValueError(f"{where} must be a token id or a list of them, got "
                       f"{value!r}.")
    if not 0 <= v < vocab:
      raise ValueError(f"{where} = {v} is outside the tokenizer's {vocab} "
                       "ids.")
  return tuple(values)


def _eos_ids(value: Any, where: str, vocab: int) -> tuple[int, ...]:
  """`_ids` of an eos_token_id, leniently, as transformers loads it: an id
  past the tokenizer's vocabulary can never be generated, so it is dropped
  with a warning instead of refusing the checkpoint (a GPT-2 config saved
  beside a small tokenizer keeps GPT2Config's default 50256)."""
  if value is None:
    return ()
  values = value if isinstance(value, list) else [value]
  never = [v for v in values if isinstance(v, int)
           and not isinstance(v, bool) and v >= vocab]
  if never:
    warnings.warn(
        f"{where} = {value!r}: dropped {never}, past the tokenizer's {vocab} "
        "ids, which no generation can emit"
        + ("" if len(never) < len(values) else
           "; rows stop only at max_new_tokens") + ".",
        UserWarning, stacklevel=4)
    values = [v for v in values if v not in never]
  return _ids(values or None, where, vocab)


@dataclasses.dataclass(frozen=True, eq=False)
class HFTokenizer:
  """A `tokenizers.Tokenizer` with its special ids; satisfies `Tokenizer`.

  Build with `HFTokenizer.from_dir(checkpoint_dir)`.

  Attributes:
    tokenizer: the `tokenizers.Tokenizer`.
    bos_id, pad_id: ids or None.
    eos_ids: every id that ends a generation, in the checkpoint's order.
    name: the directory name, for metadata.
  """
  tokenizer: Any
  bos_id: int | None = None
  eos_ids: tuple[int, ...] = ()
  pad_id: int | None = None
  name: str = "hf"

  @classmethod
  def from_dir(cls, directory: str | pathlib.Path) -> HFTokenizer:
    """Reads tokenizer.json (+ tokenizer_config.json, generation_config.json,
    config.json for the special ids) from a checkpoint directory."""
    import tokenizers  # pylint: disable=g-import-not-at-top
    if not isinstance(directory, (str, os.PathLike)):
      raise TypeError("directory must be a checkpoint directory (str or "
                      f"os.PathLike), got {type(directory).__name__}.")
    directory = pathlib.Path(directory)
    file = directory / "tokenizer.json"
    if not file.is_file():
      raise FileNotFoundError(f"{directory} has no tokenizer.json (only fast "
                              "tokenizers are supported).")
    try:
      tok = tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust library raises a bare Exception
      raise ValueError(f"{file} could not be read by the tokenizers library "
                       f"({e}).") from None

    tok_cfg = read_json(directory, "tokenizer_config.json") or {}
    configs = {name: read_json(directory, name) or {}
               for name in ("generation_config.json", "config.json")}
    vocab = tok.get_vocab_size(with_added_tokens=True)

    def ids(key):
      """The first of the configs (generation's, then the model's) that sets
      `key`, checked and named by file."""
      check = _eos_ids if key == "eos_token_id" else _ids
      for name, source in configs.items():
        found = check(source.get(key), f"{directory / name}: {key}", vocab)
        if found:
          return found
      return ()

    def special(name):
      raw = tok_cfg.get(f"{name}_token")
      token = _token_str(raw)
      if token is not None and not isinstance(token, str):
        raise ValueError(f"{directory / 'tokenizer_config.json'}: "
                         f"{name}_token must be a token string (or "
                         f"{{'content': ...}}), got {raw!r}.")
      if token is not None and tok.token_to_id(token) is not None:
        return tok.token_to_id(token)
      found = ids(f"{name}_token_id")
      if not found and token is not None and name == "eos":
        # Generations would never stop: say so rather than run without EOS.
        raise ValueError(f"{directory / 'tokenizer_config.json'}: eos_token "
                         f"{token!r} is not in tokenizer.json's vocabulary "
                         "and no config sets eos_token_id.")
      return found[0] if found else None

    if (directory / "generation_config.json").is_file():
      # transformers' generate stops on this file's ids alone once it
      # exists (none: it never stops early); config.json's and the
      # tokenizer's stand in only for a missing file.
      eos_ids = _eos_ids(
          configs["generation_config.json"].get("eos_token_id"),
          f"{directory / 'generation_config.json'}: eos_token_id", vocab)
    else:
      eos_ids = ids("eos_token_id")
      if not eos_ids and special("eos") is not None:
        eos_ids = (special("eos"),)
    return cls(tokenizer=tok, bos_id=special("bos"), eos_ids=eos_ids,
               pad_id=special("pad"), name=directory.name)

  @property
  def eos_id(self) -> int | None:
    return self.eos_ids[0] if self.eos_ids else None

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included (a model head may be larger)."""
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  def fingerprint(self) -> str:
    """sha256 hex of the whole pipeline (tokenizer.json) and the special
    ids: equal fingerprints encode and decode every text alike."""
    spec = {"tokenizer": json.loads(self.tokenizer.to_str()),
            "bos_id": self.bos_id, "eos_ids": list(self.eos_ids),
            "pad_id": self.pad_id}
    return hashlib.sha256(
        json.dumps(spec, sort_keys=True).encode()).hexdigest()

  def id_to_token(self, i: int) -> str | None:
    return self.tokenizer.id_to_token(int(i))

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False,
             add_special_tokens: bool = False) -> np.ndarray:
    """int32 ids `[N]` of `text`.

    `add_special_tokens=True` applies tokenizer.json's post-processor, as
    transformers' `tokenizer(text)` does by default (e.g. Llama's BOS);
    `add_bos` / `add_eos` prepend / append the ids explicitly.
    """
    if not isinstance(text, str):
      raise TypeError(f"text must be str, got {type(text).__name__}.")
    add_bos = _checks.check_bool("add_bos", add_bos)
    add_eos = _checks.check_bool("add_eos", add_eos)
    add_special_tokens = _checks.check_bool("add_special_tokens",
                                            add_special_tokens)
    try:
      ids = self.tokenizer.encode(text,
                                  add_special_tokens=add_special_tokens).ids
    except Exception as e:  # the Rust library raises a bare Exception
      # e.g. a WordLevel model without an unknown token, on an unseen word.
      raise ValueError(f"tokenizer {self.name!r} cannot encode {text[:40]!r} "
                       f"({e}); does its tokenizer.json define an unknown "
                       "token?") from None
    if add_bos:
      if self.bos_id is None:
        raise ValueError("add_bos=True but this tokenizer has no BOS token.")
      ids = [self.bos_id] + ids
    if add_eos:
      if self.eos_id is None:
        raise ValueError("add_eos=True but this tokenizer has no EOS token.")
      ids = ids + [self.eos_id]
    return np.asarray(ids, np.int32)

  def decode(self, ids: Any, *, skip_special_tokens: bool = True) -> str:
    """Text of `ids` (any integer array-like); special tokens skipped.

    Ids past the tokenizer (padding rows of a larger model head) decode to
    nothing, as in transformers; `specjax.models.vocab.reconcile` gives them
    zero probability so a generation never emits them.
    """
    ids_N = np.asarray(ids)
    if ids_N.size == 0:
      return ""
    ids_N = _checks.check_array("ids", ids_N, kind="i").reshape(-1)
    if ids_N.min() < 0:
      raise ValueError(f"ids must be >= 0, got {int(ids_N.min())}.")
    # Dropped here: past u32 the Rust library raises an OverflowError.
    ids_N = ids_N[ids_N < self.vocab_size]
    return self.tokenizer.decode([int(i) for i in ids_N],
                                 skip_special_tokens=skip_special_tokens)
