"""A draft of another tokenizer that proposes text (string-level exact
match): the cut into target tokens, exactness of the real loop on the
cross-tokenizer lab, greedy equality on a Hugging Face pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
import specjax as sj
from specjax.data.tokenizer_protocol import encode_batch
from specjax.harness import drafts
from specjax.harness import textgen
from specjax.models import hf
from specjax.models import string_level
from specjax.models.string_level import EOS_SYMBOL
from specjax.models.string_level import StringLevelDraft

from test_token_intersection import _lab_pair  # tests/ is on sys.path
from test_token_intersection import _Tok
from test_token_intersection import DRAFT_TOKENS
from test_token_intersection import EOS
from test_token_intersection import TARGET_TOKENS
from test_verifiers import _run_loop
from test_verifiers import ragged_lab_loop


def _longest_match(symbols, vocab):
  """The reference cut: (symbols the longest token the buffer starts with
  covers, or None; whether the buffer settles it)."""
  longest, best = max(map(len, vocab)), None
  for n in range(1, len(symbols) + 1):
    head = bytes(s for s in symbols[:n] if s != EOS_SYMBOL)
    if EOS_SYMBOL in symbols[:n] or not any(t.startswith(head)
                                            for t in vocab):
      return best, True  # left the vocabulary
    if head in vocab:
      best = n
      if not any(len(t) > n and t.startswith(head) for t in vocab):
        return best, True  # nothing extends it
    if n == longest:
      return best, True
  return best, False


def test_the_walk_is_greedy_longest_match_over_the_target_vocabulary():
  rng = np.random.default_rng(0)
  alphabet = b"abc"
  vocab = sorted({bytes(int(b) for b in rng.choice(list(alphabet), n))
                  for n in rng.integers(1, 5, 40)} | {b"a", b"b", b"c"})
  _, _, draft, _ = _lab_pair()
  wrapped = StringLevelDraft.build(draft, _Tok(DRAFT_TOKENS), list(vocab))
  size = wrapped.buffer_size
  # "d" is no token's: a walk that meets it has left the vocabulary.
  cases = [[int(b) for b in rng.choice(list(b"abcd"), n, p=[.3, .3, .3, .1])]
           for n in rng.integers(0, 7, 300)]
  cases += [[97, EOS_SYMBOL], [EOS_SYMBOL]]
  buffer = np.full((len(cases), size), -1, np.int32)
  for i, c in enumerate(cases):
    buffer[i, :len(c)] = c
  token, length, done = jax.jit(wrapped._walk)(
      jnp.asarray(buffer), jnp.asarray([len(c) for c in cases]))
  for i, c in enumerate(cases):
    if c == [EOS_SYMBOL]:
      continue  # the target list has no EOS: any fixed token
    best, settled = _longest_match(c, set(vocab))
    assert bool(done[i]) == settled, c
    if settled and best is not None:
      assert vocab[int(token[i])] == bytes(c[:best]), c
      assert int(length[i]) == best


def test_build_refuses_bad_arguments():
  _, _, draft, _ = _lab_pair()
  with pytest.raises(ValueError, match="draft_temperature must be >= 0"):
    StringLevelDraft.build(draft, _Tok(DRAFT_TOKENS), _Tok(TARGET_TOKENS),
                           draft_temperature=-1.0)
  with pytest.raises(ValueError, match="no token with text"):
    StringLevelDraft.build(draft, _Tok(DRAFT_TOKENS), [None, None])
  with pytest.raises(ValueError, match="bytes no draft token does"):
    StringLevelDraft.build(draft, _Tok([b"a", b"b", None]),
                           _Tok(TARGET_TOKENS))
  with pytest.raises(TypeError, match="must be a CausalLM"):
    StringLevelDraft.build("draft", _Tok(DRAFT_TOKENS), _Tok(TARGET_TOKENS))


def test_proposals_are_the_target_tokens_of_the_draft_text():
  """The draft's text after "ab bc" (its tokens a b b c), cut into the
  target's tokens: each proposal's bytes continue the text."""
  _, _, draft, _ = _lab_pair()
  wrapped = StringLevelDraft.build(draft, _Tok(DRAFT_TOKENS),
                                   _Tok(TARGET_TOKENS), draft_temperature=0.0)
  logits, cache = wrapped(jnp.array([[3, 4]]), wrapped.init_cache(1, 16))
  assert int(cache.inner.lengths[0]) >= 4  # read a b b c, drafted on
  text = b""
  for _ in range(6):
    token = int(jnp.argmax(logits[0, -1]))
    assert float(logits[0, -1, token]) == 0.0
    assert (np.delete(np.asarray(logits[0, -1]), token) < -1e29).all()
    if token == EOS:
      break
    text += TARGET_TOKENS[token]
    logits, cache = wrapped(jnp.array([[token]]), cache)
  # The same text is the draft's own greedy continuation.
  own, _ = draft(jnp.array([[0, 1, 1, 2]]), draft.init_cache(1, 16))
  first = DRAFT_TOKENS[int(jnp.argmax(own[0, -1]))] or b""
  assert text.startswith(first) or first == b""


def _string_loop(**kwargs):
  pair, target, draft, _ = _lab_pair()
  wrapped = StringLevelDraft.build(draft, _Tok(DRAFT_TOKENS),
                                   _Tok(TARGET_TOKENS), **kwargs)
  return ragged_lab_loop(pair, target, wrapped, [
      np.array([2]), np.array([1, 3]), np.array([3, 0, 4]),
      np.array([0, 2, 1, 4])])


@pytest.fixture(scope="module")
def string_loop():
  """A draft that samples its text: its stream, not the verifier's
  uniforms, drives the proposals."""
  return _string_loop(draft_temperature=1.0)


@pytest.mark.big_batch
@pytest.mark.parametrize("spec, sampling", [
    # The fast tier's cross-tokenizer loops are TLI's and SLRS's; the
    # one-hot law SLEM relies on is the chain verifiers' own.
    pytest.param("token", None, marks=pytest.mark.full),
    pytest.param("block", None, marks=pytest.mark.full),
    pytest.param("token", sj.SamplingConfig(temperature=0.7, top_k=3,
                                            top_p=0.9),
                 marks=pytest.mark.full)])
def test_real_loop_with_a_string_level_draft_is_exact(string_loop, spec,
                                                      sampling):
  """The first 6 tokens of 10^5 ragged rows, EOS included, follow the
  target's law: the draft's text, cut into the target's tokens, is judged
  as a point mass."""
  result, out = _run_loop(string_loop, spec, 2, EOS, sampling)
  assert result.passed, f"{spec}: {result}"
  assert out.summary()["alpha_hat"] > 0.1  # multi-byte proposals are kept


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_with_the_default_greedy_text_is_exact():
  result, out = _run_loop(_string_loop(), "token", 2, EOS)
  assert result.passed, str(result)
  assert out.summary()["alpha_hat"] > 0.1


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_check_rejects_a_control_with_that_draft(string_loop):
  """The naive exact match, a rejected proposal answered by a fresh draw
  from p (which may draw the proposal again), is rejected."""
  result, _ = _run_loop(string_loop, "wrong_fallback", 2, EOS)
  assert not result.passed, str(result)


@pytest.mark.parametrize("spec", [
    "token", pytest.param("block", marks=pytest.mark.full)])
def test_greedy_output_is_the_target_own_on_a_hugging_face_pair(spec):
  """Qwen2 and GPT-2 tokenizers (the committed tiny checkpoints): greedy
  speculation with the GPT-2-tokenizer draft's text is the target's greedy
  `generate`, token for token."""
  data = REPO / "tests" / "data" / "hf"
  target, target_tok = hf.load(data / "qwen2")
  draft, draft_tok = hf.load(data / "gpt2")
  wrapped = StringLevelDraft.build(
      draft, draft_tok, target_tok, target_vocab_size=target.vocab_size,
      draft_temperature=0.0)
  prompts, lengths = encode_batch(target_tok, ["the quick brown fox",
                                               "def main():", "x"])
  kwargs = dict(max_new_tokens=24, sampling=sj.GREEDY,
                eos_id=target_tok.eos_ids or None)
  base = sj.generate(target, prompts, lengths, jax.random.key(0), **kwargs)
  out = sj.speculative_generate(target, wrapped, prompts, lengths,
                                jax.random.key(1), gamma=3, verifier=spec,
                                **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens),
                                np.asarray(base.tokens))


@pytest.mark.full
def test_the_registry_wraps_a_draft_of_another_tokenizer_as_text():
  """`--draft=string:DIR` (text in, text out through experiments.generate):
  greedy text equals the target's own."""
  data = REPO / "tests" / "data" / "hf"
  target, tok = hf.load(data / "qwen2")
  draft = drafts.make_draft(f"string:{data / 'llama3_tied'}", target,
                            tokenizer=tok)
  assert "string-level exact match" in draft.description
  assert isinstance(draft.model, StringLevelDraft)
  result = textgen.run(draft.target, draft.model, tok, ["the quick brown"],
                       gamma=3, max_new_tokens=16, compare=True)
  assert result.texts == result.baseline_texts


def test_the_registry_refuses_string_of_a_draft_without_text():
  target, tok = hf.load(REPO / "tests" / "data" / "hf" / "qwen2")
  with pytest.raises(ValueError, match="wraps a model of another tokenizer"):
    drafts.make_draft("string:self:1", target, tokenizer=tok)
  with pytest.raises(ValueError, match="pass the target's tokenizer"):
    drafts.make_draft("string:" + str(REPO / "tests" / "data" / "hf" / "gpt2"),
                      target)


@pytest.mark.full
def test_a_token_other_than_the_proposal_is_read_row_by_row():
  """A row fed another token than its proposal (a constraint may overrule
  one) reads it; a row fed its own proposal in the same call consumes it,
  exactly as a call where every row does."""
  _, _, draft, _ = _lab_pair()
  wrapped = StringLevelDraft.build(draft, _Tok(DRAFT_TOKENS),
                                   _Tok(TARGET_TOKENS), draft_temperature=0.0)
  logits, cache = wrapped(jnp.array([[3, 4], [3, 4]]),
                          wrapped.init_cache(2, 16))
  own = jnp.argmax(logits[:, -1], -1)
  other = (own[1] + 1) % 5  # a text token that is not row 1's proposal
  _, mixed = wrapped(jnp.stack([own[0], other])[:, None], cache)
  _, consumed = wrapped(own[:, None], cache)
  _, fresh = wrapped(jnp.array([[3, 4, int(other)]]),
                     wrapped.init_cache(1, 16))
  # (draws_B counts on: the row's stream is not restarted by a read.)
  for name in ("lengths", "proposal_B", "buffer_BxK", "buffer_len_B"):
    np.testing.assert_array_equal(np.asarray(getattr(mixed, name))[0],
                                  np.asarray(getattr(consumed, name))[0])
    np.testing.assert_array_equal(np.asarray(getattr(mixed, name))[1],
                                  np.asarray(getattr(fresh, name))[0])
  np.testing.assert_array_equal(np.asarray(mixed.draft_len_BxS[0]),
                                np.asarray(consumed.draft_len_BxS[0]))
  np.testing.assert_array_equal(np.asarray(mixed.draft_len_BxS[1]),
                                np.asarray(fresh.draft_len_BxS[0]))
  np.testing.assert_array_equal(np.asarray(mixed.inner.lengths),
                                [int(consumed.inner.lengths[0]),
                                 int(fresh.inner.lengths[0])])


def test_longest_match_agreement_counts_the_tokenizer_own_cuts():
  class Tok(list):
    def encode(self, text):  # "ab" as a, b: not the longest match
      return [0 if c == "a" else 1 if c == "b" else 2 for c in text]
  tok = Tok([b"a", b"b", b"c", b"ab"])
  # "abc": longest match cuts ab, c; the tokenizer a, b, c: c alone agrees.
  assert string_level.longest_match_agreement(["abc"], tok) == 1 / 3
  assert string_level.longest_match_agreement(["cc"], tok) == 1.0
  with pytest.raises(ValueError, match="no token with text"):
    string_level.longest_match_agreement([""], tok)
