"""Regular expressions and JSON schemas to `Constraint`s, with outlines-core.

outlines-core (Rust, the engine behind Outlines) compiles a regular
expression to a byte-level DFA and indexes a vocabulary against it; a JSON
schema becomes a regular expression first (`build_regex_from_schema`). It
is the smallest of the well-kept choices (xgrammar and llguidance also
parse context-free grammars, which a finite automaton cannot hold), and it
is an optional extra: `pip install specjax[constrained]`.

specjax takes two things from it: the byte DFA (an index over the 256
single bytes) and the allowed tokens of the real vocabulary (an index over
it), which `automaton.from_byte_dfa` checks against its own walk of the DFA.
Compiled constraints are cached per (pattern, vocabulary).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Sequence

import numpy as np

from specjax.constraint import automaton
from specjax.data import hf_tokenizer
from specjax.data import tokenizer as byte_tokenizer

_INSTALL = ("constrained decoding needs outlines-core: pip install "
            "'specjax[constrained]' (or pip install outlines-core).")


def _outlines():
  try:
    import outlines_core  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(_INSTALL) from None
  return outlines_core


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
  """GPT-2's byte-level alphabet, inverted: the printable character each
  byte is written as in a byte-level BPE vocabulary, back to the byte."""
  printable = (list(range(ord("!"), ord("~") + 1))
               + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


def _decoder_kinds(spec: Any) -> set[str]:
  """The `type`s of a tokenizer.json decoder, through Sequences."""
  if not isinstance(spec, dict):
    return set()
  kinds = {spec.get("type")}
  for inner in spec.get("decoders") or ():
    kinds |= _decoder_kinds(inner)
  return kinds


def token_bytes(tokenizer: Any) -> list[bytes | None]:
  """The bytes each id of `tokenizer` stands for; None for special ids.

  `ByteTokenizer`: ids 0..255 are their bytes. A list of bytes or None
  is taken as it is. `HFTokenizer`: byte-level
  BPE vocabularies (GPT-2, Llama 3, Qwen) map through GPT-2's byte
  alphabet; SentencePiece-style ones (Llama 2, Mistral, Gemma) read "▁" as
  a space and "<0xNN>" as byte NN; the tokenizer's special (added) tokens
  are no text.
  """
  if isinstance(tokenizer, byte_tokenizer.ByteTokenizer):
    return ([bytes([b]) for b in range(256)]
            + [None] * (tokenizer.vocab_size - 256))
  if isinstance(tokenizer, (list, tuple)):
    bad = [i for i, b in enumerate(tokenizer)
           if b is not None and not isinstance(b, bytes)]
    if bad:
      raise TypeError(f"tokenizer[{bad[0]}] must be bytes or None, got "
                      f"{type(tokenizer[bad[0]]).__name__}.")
    return list(tokenizer)
  if not isinstance(tokenizer, hf_tokenizer.HFTokenizer):
    raise TypeError("tokenizer must be a specjax ByteTokenizer or "
                    "HFTokenizer, or a list of each id's bytes (None for "
                    f"special ids); got {type(tokenizer).__name__}.")
  tok = tokenizer.tokenizer
  spec = json.loads(tok.to_str())
  kinds = _decoder_kinds(spec.get("decoder"))
  special = {t["id"] for t in spec.get("added_tokens") or ()
             if t.get("special")}
  byte_level = "ByteLevel" in kinds
  decoder = _byte_decoder()
  out: list[bytes | None] = []
  for i in range(tokenizer.vocab_size):
    piece = tok.id_to_token(i)
    if piece is None or i in special:
      out.append(None)
    elif byte_level:
      try:
        out.append(bytes(decoder[c] for c in piece))
      except KeyError:  # an added, non-special token written as plain text
        out.append(piece.encode("utf-8"))
    elif (len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
          and "ByteFallback" in kinds):
      out.append(bytes([int(piece[3:5], 16)]))
    else:
      out.append(piece.replace("\u2581", " ").encode("utf-8"))
  return out


def _fingerprint(tokens: Sequence[bytes | None]) -> str:
  digest = hashlib.sha256()
  for b in tokens:
    digest.update(b"\xff" if b is None else len(b).to_bytes(2, "little") + b)
  return digest.hexdigest()


# Compiled per (pattern, vocabulary fingerprint); the vocabulary's bytes ride
# along in a side table so the cache key stays a short string.
_VOCABS: dict[str, tuple[bytes | None, ...]] = {}


@functools.lru_cache(maxsize=32)
def _compile(pattern: str, vocab_key: str) -> automaton.Constraint:
  core = _outlines()
  tokens = _VOCABS[vocab_key]
  try:
    dfa = core.Index(pattern, core.Vocabulary(
        256, {bytes([b]): [b] for b in range(256)}))
  except Exception as e:  # the Rust library raises bare Exceptions
    raise ValueError(f"outlines-core could not compile the pattern "
                     f"{pattern[:80]!r}: {e}") from None
  transitions = dfa.get_transitions()
  states = sorted(transitions)
  index = {s: i for i, s in enumerate(states)}
  next_Sx256 = np.full((len(states), 256), -1, np.int64)
  for s, edges in transitions.items():
    for b, t in edges.items():
      if b < 256:
        next_Sx256[index[s], b] = index[t]
  final_S = np.zeros(len(states), bool)
  for s in dfa.get_final_states():
    final_S[index[s]] = True
  # The vocabulary's own index: outlines-core's allowed tokens, which
  # from_byte_dfa checks against its walk (one id per distinct text; the
  # EOS slot is an id past the vocabulary).
  text = {}
  for i, b in enumerate(tokens):
    if b:
      text.setdefault(b, []).append(i)
  vocab_index = core.Index(pattern, core.Vocabulary(len(tokens), text))
  allowed_SxV = np.zeros((len(states), len(tokens)), bool)
  for s, edges in vocab_index.get_transitions().items():
    if s in index:
      ids = [t for t in edges if t < len(tokens)]
      allowed_SxV[index[s], ids] = True
  return automaton.from_byte_dfa(
      next_Sx256, final_S, index[dfa.get_initial_state()], list(tokens),
      allowed_SxV=allowed_SxV, pattern=pattern)


def regex(pattern: str, tokenizer: Any) -> automaton.Constraint:
  """The constraint "the generated text matches `pattern` in full".

  Args:
    pattern: a regular expression (outlines-core's syntax: Rust `regex`,
      no look-around or back-references), matched against the whole
      generated text as bytes of UTF-8.
    tokenizer: the model's `ByteTokenizer` or `HFTokenizer`, or each id's
      bytes (`token_bytes`).

  Returns:
    A cached `Constraint` for `generate` / `speculative_generate`'s
    `constraint=`.
  """
  if not isinstance(pattern, str) or not pattern:
    raise TypeError(f"pattern must be a non-empty str, got {pattern!r}.")
  tokens = tuple(token_bytes(tokenizer))
  key = _fingerprint(tokens)
  _VOCABS.setdefault(key, tokens)
  return _compile(pattern, key)


def json_schema(schema: Any, tokenizer: Any, *,
                whitespace: str | None = None) -> automaton.Constraint:
  """The constraint "the generated text is a JSON document valid under
  `schema`", as far as a regular language can say it.

  Args:
    schema: a JSON schema, as a dict or a JSON string.
    tokenizer: as for `regex`.
    whitespace: the regular expression allowed between JSON tokens; None is
      outlines-core's default (at most one space), which also bounds the
      output's length.

  outlines-core enforces types, required and optional properties, enums,
  constants, string lengths and patterns, array lengths, nesting (up to
  depth 3 for recursive schemas); it does not enforce numeric bounds
  (`minimum`, `maximum`, `multipleOf`), which no regular language can in
  general.
  """
  if isinstance(schema, dict):
    schema = json.dumps(schema)
  if not isinstance(schema, str):
    raise TypeError("schema must be a dict or a JSON string, got "
                    f"{type(schema).__name__}.")
  try:
    json.loads(schema)
  except json.JSONDecodeError as e:
    raise ValueError(f"schema is not valid JSON: {e}") from None
  core = _outlines()
  try:
    pattern = core.json_schema.build_regex_from_schema(schema, whitespace)
  except Exception as e:  # the Rust library raises bare Exceptions
    raise ValueError(f"outlines-core could not turn the schema into a "
                     f"regular expression: {e}") from None
  return regex(pattern, tokenizer)
