"""A byte-level draft proposing another tokenizer's tokens by their exact
law (string-level rejection sampling, `StringRejectionDraft`): the law is
the cut's, the real loop is exact, greedy output is the target's own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
import specjax as sj
from specjax import lab
from specjax import testing
from specjax.data import tokenizer as byte_tokenizer
from specjax.data.tokenizer_protocol import encode_batch
from specjax.harness import drafts
from specjax.lab import models as lab_models
from specjax.models import hf
from specjax.models import StringRejectionDraft
from specjax.models.string_rejection import WHITESPACE

from test_token_intersection import _Tok  # tests/ is on sys.path
from test_token_intersection import DRAFT_TOKENS
from test_token_intersection import EOS
from test_token_intersection import TARGET_TOKENS
from test_verifiers import _run_loop
from test_verifiers import ragged_lab_loop

# A byte-level draft over the lab's alphabet {a, b, c}, EOS at 3.
BYTE_TOKENS = [b"a", b"b", b"c", None]


class _ByteTok(list):
  eos_id = 3
  eos_ids = (3,)
  bos_id = None


def _lab_draft():
  _, draft = lab_models.markov_lms(lab.make_markov_pair(1.5, 0.5, 1,
                                                        vocab_size=4))
  return draft


def _reference_law(next_law, target_bytes, eos_id, draft_eos, split):
  """psi by recursion over every text prefix that begins a target token:
  `next_law(text) -> {byte or None (EOS): probability}`."""
  tokens = {b: t for t, b in reversed(list(enumerate(target_bytes))) if b}
  internal = {b[:k] for b in tokens for k in range(len(b))}
  psi = np.zeros(len(target_bytes))

  def cut(s, next_ws):
    best = fallback = None
    for n in range(1, len(s) + 1):
      if s[:n] in tokens:
        fallback = tokens[s[:n]]
        after = (s[n] in WHITESPACE) if n < len(s) else next_ws
        if not (split and s[n - 1] in WHITESPACE and after is False):
          best = tokens[s[:n]]
    return fallback if best is None else best

  def walk(s, mass):
    for b, p in next_law(s).items():
      if b is None:
        if s:
          psi[cut(s, True)] += mass * p
        elif eos_id is not None and draft_eos is not None:
          psi[eos_id] += mass * p
      elif s + bytes([b]) in internal or s + bytes([b]) in tokens:
        if s + bytes([b]) in internal:
          walk(s + bytes([b]), mass * p)
        else:
          psi[cut(s + bytes([b]), None)] += mass * p
      elif s:
        psi[cut(s, b in WHITESPACE)] += mass * p

  walk(b"", 1.0)
  return psi / psi.sum()


def test_the_law_is_the_cut_law_of_the_lab_draft_text():
  """On the lab (target tokens a b c ab bc, a bigram byte draft): psi is
  the law of the longest target token the draft's text begins with, for
  the whole trie and for none of it (then the cut stops at one byte)."""
  draft = _lab_draft()
  probs = np.exp(np.asarray(draft.log_probs, np.float64))
  for max_nodes, depth in ((8, 2), (0, 1)):
    wrapped = StringRejectionDraft.build(draft, _ByteTok(BYTE_TOKENS),
                                         _Tok(TARGET_TOKENS),
                                         max_nodes=max_nodes)
    logits, _ = wrapped(jnp.array([[1, 3]]), wrapped.init_cache(1, 8))
    psi = np.asarray(jax.nn.softmax(logits[0, -1]), np.float64)

    def next_law(s, depth=depth):
      if len(s) >= depth:  # a node not scored: the walk looks no further
        return {}
      last = 1 if not s else s[-1] - ord("a")  # the text after "...bc"
      return {(None if i == 3 else ord("a") + i): probs[last, i]
              for i in range(4)}

    ref = _reference_law(
        lambda s: next_law(s) or {None: 1.0}, TARGET_TOKENS, EOS, 3, False)
    np.testing.assert_allclose(psi, ref, atol=1e-6)
    assert abs(psi.sum() - 1) < 1e-6


@pytest.mark.full  # a compile per trie node for the reference
@pytest.mark.parametrize("split", [False, True])
def test_the_law_of_a_transformer_draft_is_scored_in_one_tree_pass(split):
  """A real byte-level Transformer: the tree pass over the trie gives each
  node the draft's causal law, so psi equals the recursion over the
  draft's own forwards, with the whitespace-run rule and without."""
  draft = testing.toy_transformer(259, seed=3, max_positions=64,
                                   embed_scale=4.0)
  target_bytes = [b"a", b"b", b" ", b"  ", b"   ", b" a", b"ab", b"aba",
                  b"ba", b"\n", b"\n ", None]
  tok = byte_tokenizer.ByteTokenizer()
  wrapped = StringRejectionDraft.build(draft, tok, _TargetTok(target_bytes),
                                       split_whitespace=split)
  assert wrapped.num_nodes == 6  # a, b, " ", "  ", ab, \n: all of them
  context = [ord(c) for c in "ab a"]
  target_ids = jnp.array([[6, 2, 0]])  # "ab", " ", "a"
  logits, _ = wrapped(target_ids, wrapped.init_cache(1, 8))
  psi = np.asarray(jax.nn.softmax(logits[0, -1]), np.float64)

  def next_law(s):
    out = draft.logits(jnp.array([context + list(s)]))[0, -1]
    p = np.asarray(jax.nn.softmax(out), np.float64)
    law = {b: p[b] for b in range(256)}
    law[None] = p[tok.eos_id]
    return law

  ref = _reference_law(next_law, target_bytes, 11, tok.eos_id, split)
  np.testing.assert_allclose(psi, ref, atol=2e-6)


class _TargetTok(list):
  eos_id = 11
  eos_ids = (11,)
  bos_id = None


def test_build_refuses_bad_arguments():
  draft = _lab_draft()
  with pytest.raises(ValueError, match="needs a byte-level draft"):
    StringRejectionDraft.build(draft, [b"a", b"b", b"c", b"ca"],
                               _Tok(TARGET_TOKENS))
  with pytest.raises(ValueError, match="max_nodes"):
    StringRejectionDraft.build(draft, _ByteTok(BYTE_TOKENS),
                               _Tok(TARGET_TOKENS), max_nodes=-1)
  with pytest.raises(TypeError, match="split_whitespace"):
    StringRejectionDraft.build(draft, _ByteTok(BYTE_TOKENS),
                               _Tok(TARGET_TOKENS), split_whitespace="yes")
  lookup = sj.PromptLookupDraft(4, max_ngram=2)
  with pytest.raises(TypeError, match="needs a tree_decode"):
    StringRejectionDraft.build(lookup, _ByteTok(BYTE_TOKENS),
                               _Tok(TARGET_TOKENS))


@pytest.fixture(scope="module")
def rejection_loop():
  """test_verifiers' lab loop: 10^5 ragged rows over the target's ids,
  the bigram byte draft proposing by psi."""
  pair = lab.make_markov_pair(1.5, 0.5, 0, vocab_size=6)
  target, _ = lab_models.markov_lms(pair)
  wrapped = StringRejectionDraft.build(_lab_draft(), _ByteTok(BYTE_TOKENS),
                                       _Tok(TARGET_TOKENS))
  return ragged_lab_loop(pair, target, wrapped, [
      np.array([2]), np.array([1, 3]), np.array([3, 0, 4]),
      np.array([0, 2, 1, 4])])


@pytest.mark.big_batch
@pytest.mark.parametrize("spec, sampling", [
    ("token", None),
    pytest.param("block", None, marks=pytest.mark.full),
    pytest.param("token", sj.SamplingConfig(temperature=0.7, top_k=3,
                                            top_p=0.9),
                 marks=pytest.mark.full)])
def test_real_loop_with_string_level_rejection_is_exact(rejection_loop, spec,
                                                        sampling):
  """The first 6 tokens of 10^5 ragged rows, EOS included, follow the
  target's law: each proposal is drawn from psi and judged against it."""
  result, out = _run_loop(rejection_loop, spec, 2, EOS, sampling)
  assert result.passed, f"{spec}: {result}"
  assert out.summary()["alpha_hat"] > 0.1


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_check_rejects_a_control_with_that_draft(rejection_loop):
  result, _ = _run_loop(rejection_loop, "wrong_fallback", 2, EOS)
  assert not result.passed, str(result)


@pytest.mark.parametrize("spec", [
    "token", pytest.param("block", marks=pytest.mark.full)])
def test_greedy_output_is_the_target_own_on_a_hugging_face_target(spec):
  """A Qwen2-tokenizer checkpoint (committed tiny) with a byte-level
  Transformer draft: greedy speculation is the target's greedy `generate`,
  token for token."""
  target, target_tok = hf.load(REPO / "tests" / "data" / "hf" / "qwen2")
  draft = testing.toy_transformer(259, seed=1, max_positions=512)
  wrapped = StringRejectionDraft.build(
      draft, byte_tokenizer.ByteTokenizer(), target_tok,
      target_vocab_size=target.vocab_size, max_nodes=32)
  prompts, lengths = encode_batch(target_tok, ["the quick brown fox",
                                               "def main():", "x"])
  kwargs = dict(max_new_tokens=16, sampling=sj.GREEDY,
                eos_id=target_tok.eos_ids or None)
  base = sj.generate(target, prompts, lengths, jax.random.key(0), **kwargs)
  out = sj.speculative_generate(target, wrapped, prompts, lengths,
                                jax.random.key(1), gamma=3, verifier=spec,
                                **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens),
                                np.asarray(base.tokens))


def test_the_registry_refuses_slrs_of_a_draft_with_multi_byte_tokens():
  data = REPO / "tests" / "data" / "hf"
  target, tok = hf.load(data / "qwen2")
  with pytest.raises(ValueError, match="needs a byte-level draft"):
    drafts.make_draft(f"slrs:{data / 'gpt2'}", target, tokenizer=tok)
