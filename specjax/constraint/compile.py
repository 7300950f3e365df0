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
from specjax.data.token_bytes import token_bytes

_INSTALL = ("constrained decoding needs outlines-core: pip install "
            "'specjax[constrained]' (or pip install outlines-core).")


def _outlines():
  try:
    import outlines_core  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(_INSTALL) from None
  return outlines_core


class _Vocabulary:
  """Each id's bytes, hashed by their fingerprint: the compile cache's key
  (one per vocabulary, whatever tokenizer object it came from)."""

  def __init__(self, tokens: Sequence[bytes | None]):
    self.tokens = tuple(tokens)
    digest = hashlib.sha256()
    for b in self.tokens:
      digest.update(b"\xff" if b is None
                    else len(b).to_bytes(2, "little") + b)
    self.key = digest.hexdigest()

  def __hash__(self):
    return hash(self.key)

  def __eq__(self, other):
    return isinstance(other, _Vocabulary) and other.key == self.key


@functools.lru_cache(maxsize=32)
def _compile(pattern: str, vocabulary: _Vocabulary) -> automaton.Constraint:
  core = _outlines()
  tokens = vocabulary.tokens
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
  # from_byte_dfa checks against its walk (ids of one text share an entry;
  # its EOS slot, an id past the vocabulary, is left out).
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
  return _compile(pattern, _Vocabulary(token_bytes(tokenizer)))


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
