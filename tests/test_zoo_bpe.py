"""The zoo's BPE tokenizers and the models over them (tiny recipes, seconds)."""

import os

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import data
from specjax.data import bpe
from specjax import models
from specjax.harness import zoo

pytest.importorskip("tokenizers")

# A few steps of small batches: the entries need only exist.
FAST = {"num_steps": 20, "optim.warmup_steps": 2, "batch_size": 4,
        "seq_len": 32, "checkpoint_every": 0, "progress": False}
TEXT = 'def f(x):\n    return {"a": x + 1}  # ok\n'


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  for i, path in enumerate(data.stdlib_corpus().files[:24]):
    with open(path.path, "rb") as src, open(root / f"f{i}.py", "wb") as dst:
      dst.write(src.read()[:8_000])
  return data.text_corpus(str(root), heldout_fraction=0.25)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("zoo"))


def test_tokenized_corpus_is_the_text_in_bpe_ids(corpus, cache):
  tok = zoo.tokenizer("bpe300", cache_dir=cache, corpus=corpus,
                      verbose=False)
  tokens = corpus.tokenized(tok)
  ids = tokens.tokens("heldout").astype(np.int32)
  assert ids.max() < 300 and ids[-1] == tok.eos_id
  first = corpus.split_files("heldout")[0]
  with open(first.path, "rb") as fh:
    text = fh.read().decode("utf-8", errors="replace")
  end = int(np.flatnonzero(ids == tok.eos_id)[0])
  assert tok.decode(ids[:end]) == text
  # The fingerprint names the tokenizer's content; the text's hash is kept.
  fp, raw = tokens.fingerprint(), corpus.fingerprint()
  assert fp["tokenizer"] == f"bpe300:{tok.fingerprint()[:16]}"
  assert raw["tokenizer"] == "byte259" and fp["sha256"] == raw["sha256"]


def test_bpe_model_trains_loads_back_with_its_tokenizer(corpus, cache, capsys):
  kw = dict(cache_dir=cache, corpus=corpus, overrides=FAST, verbose=False)
  model, tok = zoo.load_with_tokenizer("bpe300-tiny", **kw)
  assert isinstance(model, sj.TransformerLM) and model.vocab_size == 300
  assert tok.vocab_size == 300 and tok.name == "bpe300"
  assert tok.decode(tok.encode(TEXT)) == TEXT
  assert len(tok.encode(TEXT)) < len(TEXT.encode())  # merges are used
  # The tokenizer the entry stores is the zoo's bpe300, fingerprint and all.
  assert tok.fingerprint() == zoo.tokenizer("bpe300-tiny", **kw).fingerprint()
  entry = zoo.entry_dir("bpe300-tiny", cache_dir=cache, corpus=corpus,
                        overrides=FAST)
  assert os.path.isfile(os.path.join(entry, zoo.TOKENIZER_DIR,
                                     "tokenizer.json"))
  capsys.readouterr()
  again, _ = zoo.load_with_tokenizer("bpe300-tiny", **{**kw, "verbose": True})
  assert "loaded bpe300-tiny" in capsys.readouterr().out  # not retrained
  for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # An entry that lost its tokenizer is refused, not returned without it.
  stored = os.path.join(entry, zoo.TOKENIZER_DIR)
  os.rename(stored, stored + ".away")
  try:
    with pytest.raises(zoo.ZooError, match="no readable tokenizer"):
      zoo.load_with_tokenizer("bpe300-tiny", **kw)
  finally:
    os.rename(stored + ".away", stored)
  # A byte-level model's tokenizer is the byte tokenizer.
  assert isinstance(zoo.tokenizer("tiny"), data.ByteTokenizer)


def test_distilled_bpe_draft_shares_its_teachers_vocabulary(corpus, cache):
  draft = zoo.load("distilled-bpe300-tiny@bpe300-tiny", cache_dir=cache,
                   corpus=corpus, overrides=FAST, verbose=False)
  assert draft.vocab_size == 300
  with pytest.raises(ValueError, match="one vocabulary"):
    zoo.parse_name("distilled-bpe300-tiny@tiny")
  assert "distilled-bpe1024-draft-0.1m@bpe1024-target-3m" in zoo.names()
  assert "bpe1024-target-3m" in zoo.names()


def test_key_covers_the_tokenizer(corpus, cache):
  kw = dict(cache_dir=cache, corpus=corpus, overrides=FAST)
  r300, r320 = (zoo.recipe(f"bpe{v}-tiny", **kw) for v in (300, 320))
  assert zoo.key(r300) != zoo.key(r320)
  assert r300["tokenizer"]["vocab_size"] == 300
  assert r300["tokenizer"]["sha256"] == zoo.tokenizer(
      "bpe300", cache_dir=cache, corpus=corpus, verbose=False).fingerprint()
  # Same vocabulary size, other merges (another corpus): another entry.
  other = data.text_corpus(corpus.files[0].path.rsplit("/", 1)[0],
                           heldout_fraction=0.5)
  assert zoo.key(zoo.recipe("bpe300-tiny", cache_dir=cache, corpus=other,
                            overrides=FAST)) != zoo.key(r300)
  # The byte-level entry of the same size keeps its key's form.
  assert "tokenizer" not in zoo.recipe("tiny", corpus=corpus, overrides=FAST)


def test_bad_bpe_requests_are_refused(corpus, cache):
  for bad in ("bpe100-tiny", "bpe0300-tiny", "bpe300-nosuch", "bpe70000"):
    with pytest.raises(ValueError, match="Unknown"):
      zoo.parse_name(bad)
  with pytest.raises(ValueError, match="model.vocab_size"):
    zoo.recipe("bpe300-tiny", cache_dir=cache, corpus=corpus,
               overrides={**FAST, "model.vocab_size": 512})
  tok = zoo.tokenizer("bpe300", cache_dir=cache, corpus=corpus, verbose=False)
  with pytest.raises(ValueError, match="tokenized"):
    zoo.recipe("bpe300-tiny", cache_dir=cache,
               corpus=corpus.tokenized(tok), overrides=FAST)
  with pytest.raises(ValueError, match="overrides do not apply"):
    zoo.recipe("bpe300", corpus=corpus, overrides={"num_steps": 3})
  with pytest.raises(ValueError, match="is a tokenizer"):
    zoo.load_with_tokenizer("bpe300", cache_dir=cache, corpus=corpus)
  with pytest.raises(TypeError, match="HFTokenizer"):
    corpus.tokenized(data.ByteTokenizer())


def test_bpe_save_load_keeps_the_fingerprint(corpus, tmp_path):
  tok = bpe.train_bpe(corpus, 280)
  bpe.save(tok, str(tmp_path))
  back = bpe.load(str(tmp_path))
  assert back.fingerprint() == tok.fingerprint() and back.name == "bpe280"
  assert back.eos_ids == tok.eos_ids
  assert bpe.train_bpe(corpus, 281).fingerprint() != tok.fingerprint()



def test_text_prompts_are_the_same_text_for_every_tokenizer(corpus, cache):
  texts = data.text_prompts(corpus, 6, 40, seed=1)
  assert texts == data.text_prompts(corpus, 6, 40, seed=1)
  assert all(len(t.encode()) == 40 for t in texts)
  heldout = b"".join(open(f.path, "rb").read()
                     for f in corpus.split_files("heldout"))
  assert all(t.encode() in heldout for t in texts)
  tok = zoo.tokenizer("bpe300", cache_dir=cache, corpus=corpus,
                      verbose=False)
  # A tokenized corpus gives the same text.
  assert data.text_prompts(corpus.tokenized(tok), 6, 40, seed=1) == texts
  prompts, lengths = data.encode_batch(tok, texts)
  assert [tok.decode(p[:n]) for p, n in zip(prompts, lengths)] == texts
  with pytest.raises(ValueError, match="shorter prompts"):
    data.text_prompts(corpus, 2, 9_000)  # the files hold 8,000 bytes


@pytest.mark.full  # trains two tiny zoo models
def test_the_registry_reads_a_bpe_zoo_draft_with_its_tokenizer(
    corpus, cache, monkeypatch):
  """A BPE zoo draft for a byte-level target: token-level intersection
  with the target's tokenizer, refused without one, and `string:` cuts its
  text read with its own BPE (not the byte tokenizer)."""
  from specjax import cache_dir  # pylint: disable=import-outside-toplevel
  from specjax.harness import drafts  # pylint: disable=import-outside-toplevel
  from specjax.harness import textgen  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(cache_dir.CACHE_ENV, cache)
  target = zoo.load("tiny", corpus=corpus, overrides=FAST, verbose=False)
  kw = dict(corpus=corpus, overrides=FAST)
  made = drafts.make_draft("bpe300-tiny", target,
                           tokenizer=data.ByteTokenizer(), **kw)
  assert isinstance(made.model, models.TokenIntersectionDraft)
  assert "token-level intersection" in made.description
  with pytest.raises(ValueError, match="another tokenizer"):
    drafts.make_draft("bpe300-tiny", target, **kw)
  made = drafts.make_draft("string:bpe300-tiny", target,
                           tokenizer=data.ByteTokenizer(), **kw)
  assert isinstance(made.model, models.StringLevelDraft)
  # The byte target's own zoo drafts are not wrapped.
  same = drafts.make_draft("tiny", target, tokenizer=data.ByteTokenizer(),
                           **kw)
  assert isinstance(same.model, sj.TransformerLM)
  # A zoo target comes with its own tokenizer.
  monkeypatch.setattr(zoo, "load_with_tokenizer",
                      lambda name: (name, "its tokenizer"))
  assert textgen.load_target("zoo:bpe300-tiny") == ("bpe300-tiny",
                                                    "its tokenizer")


@pytest.mark.full  # trains two tiny zoo models
def test_slrs_of_a_byte_zoo_draft_gives_the_bpe_target_own_greedy_text(
    corpus, cache, monkeypatch):
  """`slrs:<byte zoo model>` for a BPE zoo target (the embedded pair's
  kind, tiny recipes): text in, text out, the target's own greedy text."""
  from specjax import cache_dir  # pylint: disable=import-outside-toplevel
  from specjax.harness import drafts  # pylint: disable=import-outside-toplevel
  from specjax.harness import textgen  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(cache_dir.CACHE_ENV, cache)
  kw = dict(corpus=corpus, overrides=FAST)
  target, tok = zoo.load_with_tokenizer("bpe300-tiny", cache_dir=cache,
                                        verbose=False, **kw)
  # Room for the trie's nodes beside the text in the draft's context.
  made = drafts.make_draft("slrs:tiny", target, tokenizer=tok,
                           corpus=corpus, overrides={
                               **FAST, "model.max_positions": 512})
  assert isinstance(made.model, models.StringRejectionDraft)
  assert "string-level rejection sampling" in made.description
  result = textgen.run(made.target, made.model, tok, [TEXT[:24], "import"],
                       gamma=3, max_new_tokens=16, compare=True)
  assert result.texts == result.baseline_texts
