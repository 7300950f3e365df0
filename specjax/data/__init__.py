"""Corpora, the byte tokenizer, and deterministic batching."""

from specjax.data.batching import batch_at
from specjax.data.batching import batches
from specjax.data.batching import prompts
from specjax.data.corpus import Corpus
from specjax.data.corpus import CorpusFile
from specjax.data.corpus import from_flag
from specjax.data.corpus import split_of
from specjax.data.corpus import stdlib_corpus
from specjax.data.corpus import text_corpus
from specjax.data.corpus import text_prompts
from specjax.data.tokenizer import BOS_ID
from specjax.data.tokenizer import BYTE_VOCAB_SIZE
from specjax.data.tokenizer import ByteTokenizer
from specjax.data.tokenizer import EOS_ID
from specjax.data.tokenizer import PAD_ID
from specjax.data.hf_tokenizer import HFTokenizer
from specjax.data.tokenizer_protocol import Tokenizer
from specjax.data.tokenizer_protocol import encode_batch
