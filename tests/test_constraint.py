"""Constrained decoding: the device automaton, exactness on the lab, the
text path's validity, and the entry points' checks."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
import specjax as sj
from specjax import constraint as C
from specjax import lab
from specjax import testing
from specjax.data import bpe
from specjax.data import corpus as corpus_lib
from specjax.data import tokenizer as byte_tokenizer
from specjax.data.hf_tokenizer import HFTokenizer
from specjax.data.tokenizer_protocol import encode_batch
from specjax.harness import drafts
from specjax.harness import textgen
from specjax.lab import constrained as lab_c
from specjax.lab import models as lab_models
from specjax.models import hf
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models.self_draft import SelfDraft

from test_verifiers import ragged_lab_loop  # tests/ is on sys.path

EOS = 3  # the lab language's token without text
TOP_K_P = sj.SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)


# ----------------------------------------------------- the device tables

def test_tables_follow_the_automaton_they_were_built_from():
  language = lab_c.lab_language()
  c = lab_c.to_constraint(language)
  for s in language.edges:
    for eos in (None, EOS):
      ok = np.asarray(C.allowed(c, jnp.asarray(s), 4, () if eos is None
                                else (eos,)))
      if language.stops(s):  # never read for a decision: every token
        assert ok[:3].all()
      else:
        np.testing.assert_array_equal(ok, language.allowed(s, eos))
    for token, t in language.edges[s].items():
      assert int(C.advance(c, jnp.asarray(s), jnp.asarray(token))) == t
    # EOS and ids past the vocabulary leave the state as it is.
    assert int(C.advance(c, jnp.asarray(s), jnp.asarray(EOS))) == s
  assert np.asarray(c.stop_S).tolist()[:4] == [False, False, False, True]
  # A head wider than the tokenizer: its padding ids are never allowed.
  assert not np.asarray(C.allowed(c, jnp.asarray(0), 9))[4:].any()


def test_regex_tables_agree_with_outlines_core_on_a_multibyte_vocabulary():
  """Tokens of one to four bytes: `from_byte_dfa` walks the byte DFA and
  checks each reachable state's allowed tokens against outlines-core's
  index of the same vocabulary (it raises on any difference)."""
  rng = np.random.default_rng(0)
  alphabet = b'{}":, abtrufelsn0123456789'
  tokens = [bytes([b]) for b in range(256)] + list({
      bytes(rng.choice(list(alphabet), size=n))
      for n in rng.integers(2, 5, 400)})
  schema = {"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6},
      "ok": {"type": "boolean"}}, "required": ["name", "ok"]}
  c = C.json_schema(schema, tokens + [None])
  assert c.vocab_size == len(tokens) + 1
  memory = c.memory()
  assert memory["masks"] < memory["states"]  # rows shared between states
  # Walking a valid document token by token ends in a final state.
  text = b'{"name":"ab","ok":true}'
  ids = {t: i for i, t in enumerate(tokens)}
  s = c.initial
  for b in text:
    s = C.advance(c, s, jnp.asarray(ids[bytes([b])]))
  assert bool(c.final_S[s]) and bool(c.stop_S[s])


def test_compiled_constraints_are_cached_and_bad_patterns_are_refused():
  tok = byte_tokenizer.ByteTokenizer()
  assert C.regex("[ab]+c", tok) is C.regex("[ab]+c", tok)
  with pytest.raises(ValueError, match="could not compile"):
    C.regex("(ab", tok)
  with pytest.raises(ValueError, match="only the empty string"):
    C.regex("()", tok)
  with pytest.raises(ValueError, match="not valid JSON"):
    C.json_schema("{nope", tok)
  with pytest.raises(TypeError, match="ByteTokenizer or HFTokenizer"):
    C.regex("a", object())


def test_entry_points_check_the_constraint_before_tracing():
  pair = lab.make_markov_pair(1.5, 0.5, 0, vocab_size=4)
  target, draft = lab_models.markov_lms(pair)
  prompts, lengths = np.zeros((1, 2), np.int32), [2]
  key = jax.random.key(0)
  with pytest.raises(TypeError, match="needs the tokenizer"):
    sj.generate(target, prompts, lengths, key, max_new_tokens=3,
                constraint="[ab]+")
  wide = C.regex("[ab]+", byte_tokenizer.ByteTokenizer())
  with pytest.raises(ValueError, match="compiled for 259 token ids"):
    sj.speculative_generate(target, draft, prompts, lengths, key, gamma=2,
                            max_new_tokens=3, constraint=wide)
  c = lab_c.to_constraint(lab_c.lab_language())
  with pytest.raises(ValueError, match="draft-length rule"):
    sj.speculative_generate(target, draft, prompts, lengths, key,
                            gamma=sj.Confidence(threshold=0.5, gamma_max=2),
                            max_new_tokens=3, constraint=c)
  with pytest.raises(ValueError, match="control must be"):
    c.with_control("wrong")


# ------------------------------------------------ exactness on the lab

@pytest.fixture(scope="module")
def lab_setup():
  pair = lab.make_markov_pair(1.5, 0.5, 0, vocab_size=4)
  target, draft = lab_models.markov_lms(pair)
  language = lab_c.lab_language()
  # Ragged prompts: 3 groups of lengths 1..3 ending in a, b and c.
  _, _, _, prompts, lengths, which, contexts, _ = ragged_lab_loop(
      pair, target, draft,
      [np.array([0]), np.array([2, 1]), np.array([1, 0, 2])])
  return (pair, target, draft, language, prompts, lengths, which, contexts)


def _check(setup, out, k, sampling):
  """Each prompt group's rows against the constrained law of k tokens:
  the whole sequences, and every position and adjacent pair (where a
  subtle bias hides in a law spread over many outcomes)."""
  pair, _, _, language, _, _, which, contexts = setup
  radix = pair.vocab_size + 1
  base = radix ** np.arange(k - 1, -1, -1)
  digits = (np.arange(radix ** k)[:, None] // base) % radix
  tokens = np.asarray(out.tokens)
  results = []
  for g, ctx in enumerate(contexts):
    law = lab_c.constrained_law(pair, k, ctx, language, EOS, sampling)
    rows = tokens[which == g]
    results.append(testing.check_distribution(rows @ base, law))
    for i in range(k - 1):
      pair_law = np.bincount(digits[:, i] * radix + digits[:, i + 1],
                             weights=law, minlength=radix ** 2)
      results.append(testing.check_distribution(
          rows[:, i] * radix + rows[:, i + 1], pair_law))
  return results


def _run(setup, spec, sampling=None, control=None, k=6):
  pair, target, draft, language, prompts, lengths, *_ = setup
  c = lab_c.to_constraint(language).with_control(control)
  kwargs = dict(max_new_tokens=k, eos_id=EOS, pad_id=pair.vocab_size,
                sampling=sampling or sj.SamplingConfig(), constraint=c)
  if spec is None:
    return sj.generate(target, prompts, lengths, jax.random.key(1), **kwargs)
  gamma = None if spec.startswith("tree") else 2
  return sj.speculative_generate(target, draft, prompts, lengths,
                                 jax.random.key(1), gamma=gamma,
                                 verifier=spec, **kwargs)


@pytest.mark.big_batch
@pytest.mark.parametrize("spec, sampling", [
    ("token", None), pytest.param(None, None, marks=pytest.mark.full),
    pytest.param("block", None, marks=pytest.mark.full),
    pytest.param("tree:2,1", None, marks=pytest.mark.full),
    pytest.param("token", TOP_K_P, marks=pytest.mark.full),
    pytest.param("block", TOP_K_P, marks=pytest.mark.full),
    pytest.param("tree-wor:2,1", TOP_K_P, marks=pytest.mark.full),
    pytest.param(None, TOP_K_P, marks=pytest.mark.full)])
def test_constrained_loop_samples_the_constrained_target(lab_setup, spec,
                                                        sampling):
  """10^5 ragged rows of the real loop on the lab's chains: the first 6
  tokens follow the constrained target's law (EOS only at final states, a
  stop state ending the row), and every row is in the language."""
  out = _run(lab_setup, spec, sampling)
  for result in _check(lab_setup, out, 6, sampling):
    assert result.passed, f"{spec}: {result}"
  lengths = np.asarray(out.lengths)
  tokens = np.asarray(out.tokens)
  texts = ["".join("abc"[t] for t in row[:n] if t < 3)
           for row, n in zip(tokens, lengths)]
  ended = lengths < 6
  # A row that ended did so at EOS after a final state or at the stop state.
  assert all(re.fullmatch("(a|bc)*ca?", t) for t, e in zip(texts, ended) if e)
  assert all(re.match("(a|bc)*(b|ca?)?$", t) for t in texts)
  assert ended.sum() > 1000
  if spec is not None:
    # The mask raises acceptance: most rows' drafts were judged and kept.
    assert out.summary()["tokens_per_target_call"] > 1.5


@pytest.mark.big_batch
@pytest.mark.parametrize("spec, control", [
    ("token", "draft_unmasked"),
    pytest.param("token", "advance_rejected", marks=pytest.mark.full),
    pytest.param("tree:2,1", "draft_unmasked", marks=pytest.mark.full),
    pytest.param("tree:2,1", "advance_rejected", marks=pytest.mark.full)])
def test_constrained_loop_rejects_the_controls(lab_setup, spec, control):
  """Drafts drawn from the unmasked law but judged as masked, or the
  automaton advanced over rejected drafts: the same check rejects both."""
  out = _run(lab_setup, spec, control=control)
  assert not all(r.passed for r in _check(lab_setup, out, 6, None)), control


# --------------------------------------------- greedy and the text path

def _toy_pair():
  target = testing.toy_transformer(259, seed=0, embed_scale=2.0,
                                   max_positions=256)
  draft = testing.toy_transformer(259, seed=1, embed_scale=2.0,
                                  max_positions=256)
  return target, draft


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]}},
    "required": ["name", "ok", "color"]}


@pytest.mark.parametrize("verifier", ["token", "block", "tree:2,2,1"])
def test_greedy_constrained_speculation_equals_constrained_generate(verifier):
  tok = byte_tokenizer.ByteTokenizer()
  target, draft = _toy_pair()
  c = C.json_schema(SCHEMA, tok)
  prompts, lengths = encode_batch(tok, ["Here is the record: ", "{"])
  greedy = sj.SamplingConfig(temperature=0.0)
  base = sj.generate(target, prompts, lengths, jax.random.key(0),
                     max_new_tokens=48, sampling=greedy, eos_id=tok.eos_id,
                     constraint=c)
  spec = sj.speculative_generate(
      target, draft, prompts, lengths, jax.random.key(1),
      gamma=None if verifier.startswith("tree") else 3, verifier=verifier,
      max_new_tokens=48, sampling=greedy, eos_id=tok.eos_id, constraint=c)
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                np.asarray(base.tokens))


def _small_drafts():
  """(target, {kind: draft}) over 16 ids: every way a draft proposes (its
  own cache, the target's cache, the target's features, one-hot q)."""
  target = testing.toy_transformer(16, 0, embed_scale=1.0, d_model=32,
                                   num_layers=2, num_heads=4,
                                   max_positions=64)
  corpus = np.random.default_rng(1).integers(0, 15, size=3000)
  return target, {
      "self-shared": SelfDraft(target, layers=1, share_cache=True),
      "eagle": sj.EagleDraft.create(target, 0),
      "prompt-lookup": PromptLookupDraft(16, max_ngram=3),
      "bigram": NGramLM.fit(corpus, 16, order=2)}


@pytest.mark.parametrize("kind, verifier", [
    ("self-shared", "tree:2,1"),
    pytest.param("eagle", "token", marks=pytest.mark.full),
    pytest.param("prompt-lookup", "token", marks=pytest.mark.full),
    pytest.param("self-shared", "block", marks=pytest.mark.full),
    pytest.param("eagle", "tree-wor:2,2", marks=pytest.mark.full),
    pytest.param("bigram", "tree:3,1", marks=pytest.mark.full)])
def test_greedy_constrained_speculation_for_every_draft_kind(kind, verifier):
  """A regex over 15 one-letter ids (id 15: EOS): each kind of draft masks
  where it proposes, and greedy output is greedy constrained `generate`'s."""
  target, kinds = _small_drafts()
  c = C.regex("(ab|c[d-g])+h(ij|k)?", [bytes([ord("a") + i]) for i in
                                        range(15)] + [None])
  rng = np.random.default_rng(3)
  prompts = rng.integers(0, 15, size=(6, 8)).astype(np.int32)
  lengths = np.array([8, 1, 3, 5, 2, 7], np.int32)
  kwargs = dict(max_new_tokens=20, sampling=sj.GREEDY, eos_id=15,
                constraint=c)
  base = sj.generate(target, prompts, lengths, jax.random.key(0), **kwargs)
  spec = sj.speculative_generate(
      target, kinds[kind], prompts, lengths, jax.random.key(1),
      gamma=None if verifier.startswith("tree") else 3, verifier=verifier,
      **kwargs)
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(spec.lengths),
                                np.asarray(base.lengths))
  texts = ["".join(chr(ord("a") + t) for t in row[:n] if t < 15)
           for row, n in zip(np.asarray(base.tokens),
                             np.asarray(base.lengths))]
  # Every row is a prefix of a text in the language (the budget may cut).
  assert all(re.fullmatch("(ab|c[d-g])*(a|c)?|(ab|c[d-g])+h(i|ij|k)?", t)
             for t in texts), texts


@pytest.mark.full  # 1,000 speculative rows each: about 10 s
@pytest.mark.parametrize("kind", ["regex", "json"])
def test_every_sampled_generation_is_valid(kind):
  """1,000 sampled rows of speculative decoding on byte-level Transformers:
  every row matches the regex, or parses as JSON valid under the schema."""
  jsonschema = pytest.importorskip("jsonschema")
  tok = byte_tokenizer.ByteTokenizer()
  target, draft = _toy_pair()
  pattern = r"(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})? (USD|EUR)"
  c = (C.regex(pattern, tok) if kind == "regex"
       else C.json_schema(SCHEMA, tok))
  prompts, lengths = encode_batch(tok, ["Price: "] * 1000)
  out = sj.speculative_generate(
      target, draft, prompts, lengths, jax.random.key(2), gamma=3,
      max_new_tokens=128, eos_id=tok.eos_id, constraint=c)
  for row, n in zip(np.asarray(out.tokens), np.asarray(out.lengths)):
    assert n < 128, "the budget cut a row"
    text = bytes(int(t) for t in row[:n] if t < 256).decode("utf-8")
    if kind == "regex":
      assert re.fullmatch(pattern, text), text
    else:
      jsonschema.validate(json.loads(text), SCHEMA)


# ------------------------------------------------------ Hugging Face text

HF = REPO / "tests" / "data" / "hf"


@pytest.mark.full
def test_text_path_on_a_byte_level_bpe_checkpoint():
  """textgen.run (what experiments.generate calls) with a regex on the
  tiny GPT-2 checkpoint: every row ends in the language."""
  target, tok = hf.load(HF / "gpt2")
  draft = drafts.make_draft("self:1", target, tokenizer=tok).model
  pattern = "(yes|no|maybe), [0-9]{1,3} times"
  result = textgen.run(target, draft, tok, ["the record", "x"], gamma=3,
                       max_new_tokens=32, sampling=sj.SamplingConfig(),
                       constraint=C.regex(pattern, tok))
  assert result.complete == [True, True]
  assert all(re.fullmatch(pattern, t) for t in result.texts), result.texts


def test_byte_level_bpe_pieces_read_as_their_bytes():
  tok = bpe.train_bpe(corpus_lib.stdlib_corpus(max_bytes=200_000), 400)
  pieces = C.token_bytes(tok)
  text = "def f(x):\n    return 'héllo'\t# ∑\n"
  assert b"".join(pieces[i] for i in tok.encode(text)) == text.encode()
  assert pieces[tok.eos_id] is None


def test_sentencepiece_pieces_read_as_their_bytes():
  """A Metaspace + ByteFallback vocabulary (Llama 2, Mistral): "▁" is a
  space, "<0x41>" the byte 0x41, special tokens no text."""
  tokenizers = pytest.importorskip("tokenizers")
  vocab = {"<unk>": 0, "</s>": 1, "<0x41>": 2, "\u2581a": 3, "b": 4}
  tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>"))
  tk.add_special_tokens(["</s>"])
  tk.decoder = tokenizers.decoders.Sequence([
      tokenizers.decoders.Replace("\u2581", " "),
      tokenizers.decoders.ByteFallback(), tokenizers.decoders.Fuse()])
  tok = HFTokenizer(tokenizer=tk, eos_ids=(1,))
  assert C.token_bytes(tok) == [b"<unk>", None, b"A", b" a", b"b"]


@pytest.mark.full
def test_generate_command_takes_a_json_schema(tmp_path):
  schema = tmp_path / "schema.json"
  schema.write_text(json.dumps({"type": "object", "properties": {
      "ok": {"type": "boolean"}, "color": SCHEMA["properties"]["color"]},
                                 "required": ["ok", "color"]}))
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.generate",
       f"--target={HF / 'qwen2'}", f"--draft={HF / 'qwen2_draft'}",
       "--prompt=a record:", "--prompt={", "--gamma=3",
       "--max_new_tokens=64", "--temperature=1.0", f"--json_schema={schema}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "in the language: 2 of 2 rows" in out.stdout, out.stdout
