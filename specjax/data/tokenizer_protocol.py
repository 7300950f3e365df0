"""What a tokenizer offers the rest of specjax, and batch encoding of prompts.

`ByteTokenizer` (tokenizer.py) and `HFTokenizer` (hf_tokenizer.py) both
satisfy `Tokenizer`; `encode_batch` turns texts into the right-padded
`[B, P]` prompts plus lengths that `generate` / `speculative_generate` take.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from specjax import _checks


@runtime_checkable
class Tokenizer(Protocol):
  """Text <-> token ids.

  Attributes:
    name: short identifier for metadata.
    vocab_size: number of ids the tokenizer can produce (a model's head may
      be larger: padding rows).
    bos_id, pad_id: ids, or None when the tokenizer has none.
    eos_id: the first EOS id, or None.
    eos_ids: every id that ends a generation (Llama 3 has several); pass it
      as the decode loop's `eos_id`.
  """

  name: str
  vocab_size: int
  bos_id: int | None
  eos_id: int | None
  eos_ids: tuple[int, ...]
  pad_id: int | None

  def encode(self, text: str, *, add_bos: bool = False,
             add_eos: bool = False) -> np.ndarray:
    """int32 ids `[N]` of `text`, optionally framed by BOS / EOS."""

  def decode(self, ids: Any) -> str:
    """Text of `ids`, special tokens skipped."""


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str], *,
                 add_bos: bool = False, pad_id: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded prompts for the decode loop.

  Args:
    tokenizer: any `Tokenizer`.
    texts: B strings, each encoding to at least one token.
    add_bos: prepend the tokenizer's BOS id to each row.
    pad_id: fill value past each row's length; None means the tokenizer's
      pad_id, or 0 (the loop masks padding by lengths, so any id works).

  Returns:
    `(prompts_BxP int32, lengths_B int32)` with P the longest row.
  """
  if isinstance(texts, (str, bytes)) or not len(texts):
    raise ValueError("texts must be a non-empty sequence of strings (for one "
                     "prompt pass [text]).")
  rows = [np.asarray(tokenizer.encode(t, add_bos=add_bos), np.int32)
          for t in texts]
  empty = [i for i, r in enumerate(rows) if r.size == 0]
  if empty:
    raise ValueError(f"texts[{empty[0]}] encodes to no tokens; the decode "
                     "loop needs at least one prompt token per row (use "
                     "add_bos=True or a non-empty prompt).")
  if pad_id is None:
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
  # int32 prompts: 1.5 would be truncated, 2**31 wrapped.
  pad_id = _checks.check_int("pad_id", pad_id, low=-2**31, high=2**31 - 1)
  lengths_B = np.array([r.size for r in rows], np.int32)
  prompts_BxP = np.full((len(rows), int(lengths_B.max())), pad_id, np.int32)
  for i, r in enumerate(rows):
    prompts_BxP[i, :r.size] = r
  return prompts_BxP, lengths_B
