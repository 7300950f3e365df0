"""A byte-level BPE tokenizer trained on a corpus, as GPT-2's was.

`train_bpe(corpus, vocab_size)` trains one with the `tokenizers` library
(the `hf` extra) on a corpus's training files: GPT-2's pre-tokenizer and
byte alphabet, so every text encodes, and one special token, the EOS
`<|endoftext|>`, at the last id. It returns an `HFTokenizer`, the same
object a Hugging Face checkpoint's tokenizer loads as.

`save(tokenizer, directory)` writes it as a checkpoint directory holds one
(tokenizer.json, and tokenizer_config.json naming the EOS), and
`load(directory)` reads it back, fingerprint unchanged.
"""

from __future__ import annotations

import json
import os

from specjax import _checks
from specjax.data import corpus as corpus_lib
from specjax.data import hf_tokenizer

EOS_TOKEN = "<|endoftext|>"


def train_bpe(corpus: corpus_lib.Corpus, vocab_size: int
              ) -> hf_tokenizer.HFTokenizer:
  """A byte-level BPE of `vocab_size` ids (the EOS included) trained on
  `corpus`'s "train" files; deterministic for a given corpus and size."""
  if not isinstance(corpus, corpus_lib.Corpus):
    raise TypeError("corpus must be a specjax.data.corpus.Corpus (e.g. "
                    f"stdlib_corpus()), got {type(corpus).__name__}.")
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("train_bpe needs the tokenizers library: pip install "
                      "'specjax[hf]'.") from None
  alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
  vocab_size = _checks.check_int("vocab_size", vocab_size,
                                 low=len(alphabet) + 1)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size - 1, initial_alphabet=alphabet,
      show_progress=False)

  def texts():
    for f in corpus.split_files("train"):
      with open(f.path, "rb") as fh:
        yield fh.read().decode("utf-8", errors="replace")

  tok.train_from_iterator(texts(), trainer)
  tok.add_special_tokens([EOS_TOKEN])
  eos = tok.token_to_id(EOS_TOKEN)
  return hf_tokenizer.HFTokenizer(tokenizer=tok, eos_ids=(eos,),
                                  name=f"bpe{tok.get_vocab_size()}")


def save(tokenizer: hf_tokenizer.HFTokenizer, directory: str) -> None:
  """Writes `tokenizer` (one of `train_bpe`'s) into `directory` (created):
  tokenizer.json and a tokenizer_config.json naming its EOS token."""
  if not isinstance(tokenizer, hf_tokenizer.HFTokenizer):
    raise TypeError("tokenizer must be an HFTokenizer (train_bpe's), got "
                    f"{type(tokenizer).__name__}.")
  if len(tokenizer.eos_ids) != 1 or tokenizer.bos_id is not None or (
      tokenizer.pad_id is not None):
    raise ValueError("save writes train_bpe's tokenizers (one EOS, no BOS or "
                     f"PAD); got eos_ids={tokenizer.eos_ids}, bos_id="
                     f"{tokenizer.bos_id}, pad_id={tokenizer.pad_id}.")
  os.makedirs(directory, exist_ok=True)
  tokenizer.tokenizer.save(os.path.join(directory, "tokenizer.json"))
  eos = tokenizer.tokenizer.id_to_token(tokenizer.eos_ids[0])
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as fh:
    json.dump({"eos_token": eos}, fh)


def load(directory: str, name: str | None = None
         ) -> hf_tokenizer.HFTokenizer:
  """The tokenizer `save` wrote into `directory`; `name` (default
  "bpe<V>") is recorded in metadata."""
  tok = hf_tokenizer.HFTokenizer.from_dir(directory)
  return hf_tokenizer.HFTokenizer(
      tokenizer=tok.tokenizer, bos_id=tok.bos_id, eos_ids=tok.eos_ids,
      pad_id=tok.pad_id, name=name or f"bpe{tok.vocab_size}")
