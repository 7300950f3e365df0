"""Tests for specjax.data: tokenizer, corpus split and fingerprint, batching."""

import os

import numpy as np
import pytest

from specjax.data import batching
from specjax.data import bpe
from specjax.data import corpus as corpus_lib
from specjax.data import tokenizer as tokenizer_lib
from specjax.data import encode_batch

TOK = tokenizer_lib.ByteTokenizer()


def _write(root, rel, text):
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as fh:
    fh.write(text if isinstance(text, bytes) else text.encode())
  return path


# ------------------------------------------------------------------ tokenizer


def test_token_ids_are_fixed():
  assert (TOK.vocab_size, TOK.bos_id, TOK.eos_id, TOK.pad_id) == (
      259, 256, 257, 258)
  with pytest.raises(ValueError, match="fixed"):
    tokenizer_lib.ByteTokenizer(vocab_size=300)


def test_tokenizer_round_trip():
  text = "def f(x):\n  return 'héllo ✓'\n"
  ids = TOK.encode(text, add_bos=True, add_eos=True)
  assert ids.dtype == np.int32
  assert ids[0] == 256 and ids[-1] == 257
  assert len(ids) == len(text.encode()) + 2
  assert TOK.decode(ids) == text
  raw = b"\xff\xfe not utf-8 \x00"
  assert TOK.decode_bytes(TOK.encode(raw)) == raw
  assert "\ufffd" in TOK.decode(TOK.encode(raw))  # replaced, never raises
  assert TOK.decode([256, 104, 258, 105, 257]) == "hi"  # specials skipped


def test_tokenizer_errors():
  with pytest.raises(ValueError, match="ids must lie in"):
    TOK.decode([1, 259])
  with pytest.raises(TypeError, match="text must be"):
    TOK.encode(3)
  # A file name that is not UTF-8, as os.fsdecode gives it: a raw
  # UnicodeEncodeError before; its bytes encode.
  name = os.fsdecode(b"\xff.txt")
  with pytest.raises(ValueError, match="lone surrogate.*os.fsencode"):
    TOK.encode(name)
  assert TOK.decode_bytes(TOK.encode(os.fsencode(name))) == b"\xff.txt"
  # "no" is truthy: it added BOS.
  with pytest.raises(TypeError, match="add_bos must be a bool"):
    TOK.encode("x", add_bos="no")
  assert TOK.decode([]) == "" and TOK.decode_bytes(np.array([])) == b""
  with pytest.raises(TypeError, match="pad_id must be a Python int"):
    encode_batch(TOK, ["ab", "c"], pad_id=1.5)  # was truncated to 1


# --------------------------------------------------------------------- corpus


def test_split_is_stable_disjoint_and_local(tmp_path):
  # Pinned values: changing the hash scheme would silently move files
  # between train and held-out in every existing experiment.
  assert corpus_lib.split_of("copyreg.py", 0.05) == "heldout"
  assert corpus_lib.split_of("os.py", 0.05) == "train"
  assert corpus_lib.split_of("json/decoder.py", 0.23) == "train"  # u=0.2312
  assert corpus_lib.split_of("json/decoder.py", 0.24) == "heldout"
  rels = [f"pkg{i}/mod{i}.py" for i in range(60)]
  for rel in rels:
    _write(tmp_path, rel, f"x = {rel!r}\n")
  c = corpus_lib.text_corpus(str(tmp_path), heldout_fraction=0.3)
  train = {f.rel_path for f in c.split_files("train")}
  held = {f.rel_path for f in c.split_files("heldout")}
  assert train.isdisjoint(held) and train | held == set(rels)
  assert 5 < len(held) < 35
  # Adding files never moves existing ones.
  _write(tmp_path, "extra/new.py", "y = 1\n")
  c2 = corpus_lib.text_corpus(str(tmp_path), heldout_fraction=0.3)
  assert {f.rel_path for f in c2.split_files("heldout")} - {"extra/new.py"} \
      == held


def test_tokens_frame_documents(tmp_path):
  _write(tmp_path, "a.txt", "ab")
  _write(tmp_path, "b.txt", "c")
  c = corpus_lib.text_corpus(str(tmp_path), heldout_fraction=0.0)
  np.testing.assert_array_equal(c.tokens("train"),
                                [256, 97, 98, 257, 256, 99, 257])
  assert c.tokens("train").dtype == np.uint16
  with pytest.raises(ValueError, match="heldout split .* is empty"):
    c.tokens("heldout")
  with pytest.raises(ValueError, match="split must be one of"):
    c.tokens("test")


def test_fingerprint(tmp_path):
  _write(tmp_path, "a.txt", "hello")
  _write(tmp_path, "sub/b.txt", "world!")
  fp = corpus_lib.text_corpus(str(tmp_path)).fingerprint()
  assert fp["files"] == 2 and fp["bytes"] == 11
  assert fp["train_files"] + fp["heldout_files"] == 2
  assert fp["train_bytes"] + fp["heldout_bytes"] == 11
  assert fp["interpreter"].split()[1].count(".") == 2
  assert len(fp["sha256"]) == 64 and fp["tokenizer"] == "byte259"
  assert corpus_lib.text_corpus(str(tmp_path)).fingerprint() == fp
  _write(tmp_path, "a.txt", "hellO")
  assert corpus_lib.text_corpus(
      str(tmp_path)).fingerprint()["sha256"] != fp["sha256"]


def test_stdlib_corpus_layout(tmp_path):
  for rel in ["os.py", "json/decoder.py", "test/test_os.py",
              "site-packages/numpy/core.py", "dist-packages/x.py",
              "__pycache__/os.py", "README.txt"]:
    _write(tmp_path, rel, "pass\n")
  c = corpus_lib.stdlib_corpus(root=str(tmp_path))
  assert [f.rel_path for f in c.files] == [
      "json/decoder.py", "os.py", "test/test_os.py"]
  c = corpus_lib.stdlib_corpus(root=str(tmp_path), include_tests=False)
  assert [f.rel_path for f in c.files] == ["json/decoder.py", "os.py"]
  assert c.fingerprint()["source"] == "stdlib"


def test_real_stdlib_subset():
  c = corpus_lib.stdlib_corpus(max_bytes=200_000)
  fp = c.fingerprint()
  assert 0 < fp["bytes"] <= 200_000 and fp["files"] > 5
  assert all("site-packages" not in f.path for f in c.files)
  assert corpus_lib.stdlib_corpus(max_bytes=200_000).fingerprint() == fp


def test_corpus_errors(tmp_path):
  with pytest.raises(ValueError, match="paths is empty"):
    corpus_lib.text_corpus([])
  with pytest.raises(ValueError, match="matches no files"):
    corpus_lib.text_corpus(str(tmp_path / "*.txt"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    corpus_lib.text_corpus(str(tmp_path / "missing.txt"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="matches no files"):
    corpus_lib.text_corpus(str(empty))
  with pytest.raises(ValueError, match="No \\*.py files"):
    corpus_lib.stdlib_corpus(root=str(empty))
  with pytest.raises(TypeError, match="include_tests must be a bool"):
    corpus_lib.stdlib_corpus(root=str(empty), include_tests="False")
  with pytest.raises(ValueError, match="heldout_fraction"):
    corpus_lib.text_corpus(_write(tmp_path, "a.txt", "x"),
                           heldout_fraction=1.0)
  # Same relative path from two places: the split key would be ambiguous.
  _write(tmp_path, "d1/x.txt", "1")
  _write(tmp_path, "d2/x.txt", "2")
  with pytest.raises(ValueError, match="share the relative path"):
    corpus_lib.text_corpus([str(tmp_path / "d1"), str(tmp_path / "d2")])
  # A file that disappears (or cannot be read) is named with the fix.
  gone = _write(tmp_path, "gone/g.txt", "bye")
  c = corpus_lib.text_corpus(gone)
  os.remove(gone)
  with pytest.raises(OSError, match="Cannot read corpus file .*g.txt"):
    c.fingerprint()


def test_globs_and_flag(tmp_path):
  _write(tmp_path, "a/x.txt", "1")
  _write(tmp_path, "a/b/y.txt", "2")
  _write(tmp_path, "a/z.md", "3")
  c = corpus_lib.text_corpus(str(tmp_path / "a" / "**" / "*.txt"))
  assert [f.rel_path for f in c.files] == ["b/y.txt", "x.txt"]
  c = corpus_lib.from_flag(f"{tmp_path / 'a' / 'z.md'},{tmp_path / 'a/x.txt'}")
  assert [f.rel_path for f in c.files] == ["x.txt", "z.md"]
  c = corpus_lib.text_corpus(str(tmp_path / "a"), suffixes=[".md"])
  assert [f.rel_path for f in c.files] == ["z.md"]
  # One suffix as a bare string (tuple(".md") would keep any name ending
  # in ".", "m" or "d").
  _write(tmp_path, "a/notes.mmd", "4")
  c = corpus_lib.text_corpus(str(tmp_path / "a"), suffixes=".md")
  assert [f.rel_path for f in c.files] == ["z.md"]
  with pytest.raises(TypeError, match="paths must be a path"):
    corpus_lib.text_corpus(5)
  assert corpus_lib.from_flag("stdlib", max_bytes=50_000).source == "stdlib"


# ------------------------------------------------------------------- batching


def test_batches_are_pure_functions_of_seed_and_step():
  tokens = np.arange(1000, dtype=np.uint16)
  b3 = batching.batch_at(tokens, 4, 16, seed=7, step=3)
  assert b3.shape == (4, 17) and b3.dtype == np.int32
  # Windows are contiguous slices of the token array.
  np.testing.assert_array_equal(np.diff(b3, axis=1), 1)
  np.testing.assert_array_equal(
      b3, batching.batch_at(tokens, 4, 16, seed=7, step=3))
  it = batching.batches(tokens, 4, 16, seed=7)
  run = [next(it) for _ in range(5)]
  resumed = batching.batches(tokens, 4, 16, seed=7, start_step=3)
  np.testing.assert_array_equal(next(resumed), run[3])
  np.testing.assert_array_equal(next(resumed), run[4])
  assert not np.array_equal(run[0], run[1])
  assert not np.array_equal(
      b3, batching.batch_at(tokens, 4, 16, seed=8, step=3))


def test_prompts():
  tokens = np.arange(500, dtype=np.int64)
  p = batching.prompts(tokens, 8, 10, seed=0)
  assert p.shape == (8, 10) and p.dtype == np.int32
  assert len(set(p[:, 0].tolist())) == 8  # distinct windows
  np.testing.assert_array_equal(p, batching.prompts(tokens, 8, 10, seed=0))
  # Enough windows needed only with replacement when the array is short.
  assert batching.prompts(np.arange(3), 5, 2, seed=1).shape == (5, 2)


def test_batching_errors():
  with pytest.raises(ValueError, match="fewer than one training window"):
    batching.batch_at(np.arange(10), 2, 10, 0, 0)
  with pytest.raises(ValueError, match="seed must be >= 0"):
    batching.batches(np.arange(100), 2, 10, -1)
  with pytest.raises(TypeError, match="tokens must be an integer array"):
    batching.prompts(np.zeros(100, np.float32), 2, 10, 0)
  with pytest.raises(ValueError, match="tokens must have rank 1"):
    batching.prompts(np.zeros((2, 100), np.int32), 2, 10, 0)
  # Ids the int32 batches would wrap (2**40 -> 0, 2**32 - 1 -> -1), or no
  # token at all: refused, naming the first.
  for tokens in (np.full(10, 2**40, np.int64), np.full(10, 2**32 - 1,
                                                        np.uint32),
                 -np.arange(1, 11)):
    with pytest.raises(ValueError, match=r"tokens\[\d\] = -?\d+ is not a token"):
      batching.batch_at(tokens, 1, 4, 0, 0)
    with pytest.raises(ValueError, match="must lie in"):
      batching.prompts(tokens, 2, 4, 0)


def test_max_bytes_subset_keeps_the_heldout_fraction():
  corpus = corpus_lib.stdlib_corpus(max_bytes=2_000_000)
  train, heldout = corpus.split_files("train"), corpus.split_files("heldout")
  # ~5% held out, as for the full library (not the held-out files first).
  assert len(heldout) < 0.2 * (len(train) + len(heldout))
  assert corpus.tokens("train").size > 1_000_000


def test_train_bpe_round_trips_text_and_ends_with_its_eos():
  corpus = corpus_lib.stdlib_corpus(max_bytes=200_000)
  tok = bpe.train_bpe(corpus, 400)
  assert tok.vocab_size == 400 and tok.eos_ids == (399,)
  text = "def main():\n    return 'héllo'  # ünïcode\n"
  ids = tok.encode(text)
  assert tok.decode(ids) == text and len(ids) < len(text.encode())
  assert bpe.train_bpe(corpus, 400).encode(text).tolist() == ids.tolist()
  with pytest.raises(ValueError, match="vocab_size must be >= 257"):
    bpe.train_bpe(corpus, 100)
