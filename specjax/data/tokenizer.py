"""A byte-level tokenizer: every byte is a token, plus three specials.

Token ids (fixed; checkpoints and results depend on them):

| id      | meaning                                   |
| ------- | ----------------------------------------- |
| 0..255  | the byte with that value                  |
| 256     | BOS: beginning of a document              |
| 257     | EOS: end of a document (generation stops) |
| 258     | PAD: padding; never appears in a corpus   |

`vocab_size` is 259. Any text in any encoding round-trips exactly at the byte
level (`encode` of bytes, then `decode_bytes`); `decode` to `str` reads the
bytes as UTF-8 with `errors="replace"`, so it never raises.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from specjax import _checks

BYTE_VOCAB_SIZE = 259
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """Bytes 0..255 are ids 0..255; BOS=256, EOS=257, PAD=258; vocab 259.

  Frozen and hashable, so it can be a static field of a config.
  """

  vocab_size: int = BYTE_VOCAB_SIZE
  bos_id: int = BOS_ID
  eos_id: int = EOS_ID
  pad_id: int = PAD_ID

  def __post_init__(self):
    # The ids are part of the checkpoint format; a different value would
    # silently misread every trained model, so they are not configurable.
    if (self.vocab_size, self.bos_id, self.eos_id, self.pad_id) != (
        BYTE_VOCAB_SIZE, BOS_ID, EOS_ID, PAD_ID):
      raise ValueError("ByteTokenizer's ids are fixed (vocab_size=259, BOS=256,"
                       " EOS=257, PAD=258); construct it as ByteTokenizer().")

  @property
  def eos_ids(self) -> tuple[int, ...]:
    """Every id that ends a generation (the `Tokenizer` protocol)."""
    return (self.eos_id,)

  @property
  def name(self) -> str:
    """A short identifier recorded in checkpoint and results metadata."""
    return "byte259"

  def encode(self, text: str | bytes, *, add_bos: bool = False,
             add_eos: bool = False) -> np.ndarray:
    """Encodes `text` (str as UTF-8, or raw bytes) to int32 ids `[N]`.

    Returns `[BOS]? + bytes + [EOS]?`; never contains PAD.
    """
    if isinstance(text, str):
      try:
        data = text.encode("utf-8")
      except UnicodeEncodeError as e:  # a lone surrogate has no UTF-8 bytes
        raise ValueError(
            f"text holds {text[e.start:e.end]!r} at {e.start}, a lone "
            "surrogate with no UTF-8 encoding (e.g. from os.fsdecode of a "
            "name that is not UTF-8); pass the bytes instead (os.fsencode("
            "text)).") from None
    elif isinstance(text, (bytes, bytearray, memoryview)):
      data = bytes(text)
    else:
      raise TypeError(f"text must be str or bytes, got {type(text).__name__}.")
    add_bos = _checks.check_bool("add_bos", add_bos)
    add_eos = _checks.check_bool("add_eos", add_eos)
    body_N = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    parts = []
    if add_bos:
      parts.append(np.array([BOS_ID], np.int32))
    parts.append(body_N)
    if add_eos:
      parts.append(np.array([EOS_ID], np.int32))
    return np.concatenate(parts) if len(parts) > 1 else body_N

  def decode_bytes(self, ids: Any) -> bytes:
    """The bytes of `ids` (any integer array-like), specials skipped.

    Raises on ids outside [0, 259): those come from a model with a different
    vocabulary, and dropping them silently would hide the mismatch.
    """
    ids_N = np.asarray(ids)
    if ids_N.size == 0:  # [] is float64 to numpy: nothing to decode
      return b""
    ids_N = _checks.check_array("ids", ids_N, kind="i").reshape(-1)
    if ids_N.size and (ids_N.min() < 0 or ids_N.max() >= BYTE_VOCAB_SIZE):
      bad = ids_N[(ids_N < 0) | (ids_N >= BYTE_VOCAB_SIZE)][0]
      raise ValueError(f"ids must lie in [0, {BYTE_VOCAB_SIZE}) for the byte "
                       f"tokenizer, got {int(bad)}. Was the model trained with "
                       "a different vocabulary?")
    return ids_N[ids_N < 256].astype(np.uint8).tobytes()

  def decode(self, ids: Any) -> str:
    """Decodes `ids` to text (UTF-8, `errors="replace"`), specials skipped."""
    return self.decode_bytes(ids).decode("utf-8", errors="replace")
