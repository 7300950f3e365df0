"""The bytes each token id of a tokenizer stands for.

`token_bytes(tokenizer)` reads a `ByteTokenizer`, an `HFTokenizer` (byte-level
BPE or SentencePiece-style pieces) or a list of bytes, and gives each id's
bytes (None for special ids). Constrained decoding indexes a vocabulary with
it, and a draft of another tokenizer maps its tokens onto the target's.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from specjax.data import hf_tokenizer
from specjax.data import tokenizer as byte_tokenizer


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
