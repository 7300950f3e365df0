"""A draft of another tokenizer through token-level intersection (TLI):
the mapping, exactness of the real loop on a cross-tokenizer lab, greedy
equality on a Hugging Face pair of different tokenizers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
import specjax as sj
from specjax import lab
from specjax.data.tokenizer_protocol import encode_batch
from specjax.harness import drafts
from specjax.harness import textgen
from specjax.lab import models as lab_models
from specjax.models import hf
from specjax.models.token_intersection import TokenIntersectionDraft

from test_verifiers import _run_loop  # tests/ is on sys.path
from test_verifiers import ragged_lab_loop

# Two segmentations of strings over {a, b, c}: the target merges ab and bc,
# the draft ca and bb; each has its EOS (id 5, no text).
TARGET_TOKENS = [b"a", b"b", b"c", b"ab", b"bc", None]
DRAFT_TOKENS = [b"a", b"b", b"c", b"ca", b"bb", None]
EOS = 5


class _Tok(list):
  """A list of token bytes with the EOS the mapping pairs."""
  eos_id = EOS
  eos_ids = (EOS,)
  bos_id = None


def _lab_pair():
  pair = lab.make_markov_pair(1.5, 0.5, 0, vocab_size=6)
  target, _ = lab_models.markov_lms(pair)
  # The draft's own chain over its own ids: another seed's.
  _, draft = lab_models.markov_lms(lab.make_markov_pair(1.5, 0.5, 1,
                                                        vocab_size=6))
  wrapped = TokenIntersectionDraft.build(draft, _Tok(DRAFT_TOKENS),
                                         _Tok(TARGET_TOKENS), min_shared=4)
  return pair, target, draft, wrapped


def test_the_mapping_reads_target_text_in_the_draft_vocabulary():
  _, _, draft, wrapped = _lab_pair()
  assert wrapped.num_shared == 4  # a, b, c and EOS
  np.testing.assert_array_equal(np.asarray(wrapped.from_draft_V),
                                [0, 1, 2, -1, -1, 5])
  # The target's "ab bc a" is the draft's "a b b c a".
  target_ids = jnp.array([[3, 4, 0]])
  logits, cache = wrapped(target_ids, wrapped.init_cache(1, 8))
  own, _ = draft(jnp.array([[0, 1, 1, 2, 0]]), draft.init_cache(1, 8))
  for t, d in ((0, 1), (1, 3), (2, 4)):  # each token's last draft token
    np.testing.assert_allclose(np.asarray(logits[0, t, :3]),
                               np.asarray(own[0, d, :3]), rtol=1e-6)
  assert (np.asarray(logits[0, :, 3:5]) < -1e29).all()  # not shared
  assert int(cache.lengths[0]) == 3 and int(cache.inner.lengths[0]) == 5
  # Rolled back to one target token, the next call reads from draft
  # position 2 (after "a b").
  _, cache = wrapped(jnp.array([[2]]), cache.replace(lengths=jnp.array([1])))
  assert int(cache.inner.lengths[0]) == 3


def test_build_refuses_vocabularies_that_share_too_little():
  _, _, draft, _ = _lab_pair()
  with pytest.raises(ValueError, match="share 4 tokens.*min_shared=64"):
    TokenIntersectionDraft.build(draft, _Tok(DRAFT_TOKENS),
                                 _Tok(TARGET_TOKENS))
  with pytest.raises(ValueError, match="bytes no draft token does"):
    TokenIntersectionDraft.build(draft, _Tok([b"a", b"b", None]),
                                 _Tok(TARGET_TOKENS), min_shared=1)
  with pytest.raises(TypeError, match="must be a CausalLM"):
    TokenIntersectionDraft.build("draft", _Tok(DRAFT_TOKENS),
                                 _Tok(TARGET_TOKENS))


@pytest.fixture(scope="module")
def cross_loop():
  """test_verifiers' lab loop with a draft of another tokenizer: ragged
  prompts over the target's text ids, 10^5 rows."""
  pair, target, _, wrapped = _lab_pair()
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
def test_real_loop_with_a_draft_of_another_tokenizer_is_exact(
    cross_loop, spec, sampling):
  """The first 6 tokens of 10^5 ragged rows, EOS included, follow the
  target's law: the draft reads the text in its own tokens and proposes
  only the shared ones."""
  result, out = _run_loop(cross_loop, spec, 2, EOS, sampling)
  assert result.passed, f"{spec}: {result}"
  assert out.summary()["alpha_hat"] > 0.1  # shared proposals are kept


@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    # The fast tier checks the tree's mechanics below (a level, the move).
    pytest.param("tree:2,1", marks=pytest.mark.full),
    pytest.param("traversal:parents=-1,-1,0,0,1", marks=pytest.mark.full),
    pytest.param("greedy-draft:2,2", marks=pytest.mark.full)])
def test_real_loop_with_a_tree_of_another_tokenizer_is_exact(cross_loop,
                                                             spec):
  """Trees of shared tokens: each node is one draft token, scored below
  the root as the draft's own tree; the first 2 (depth + 1) tokens of 10^5
  ragged rows follow the target's law."""
  depth = sj.get_verifier(spec).depth
  result, out = _run_loop(cross_loop, spec, depth, EOS)
  assert result.passed, f"{spec}: {result}"
  assert out.summary()["alpha_hat"] > 0.1


def test_a_tree_level_is_the_draft_own_tree_below_the_root():
  """The kept path moves into place: after a tree round the next read
  starts where the kept nodes' draft tokens end."""
  _, _, draft, wrapped = _lab_pair()
  # The target's "ab" "bc" read as the draft's "a b b c"; the root is "bc".
  _, cache = wrapped(jnp.array([[3, 4]]), wrapped.init_cache(1, 16))
  cache = cache.replace(lengths=jnp.array([1]))
  depth, ancestor = np.array([0, 1, 1, 2]), np.array(
      [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)
  logits, cache = wrapped.tree_decode(jnp.array([[0, 2]]), cache, depth,
                                      ancestor, nodes=(1, 2))
  own, _ = draft(jnp.array([[0, 1, 1, 2, 0]]), draft.init_cache(1, 8))
  np.testing.assert_allclose(np.asarray(logits[0, 0, :3]),
                             np.asarray(own[0, 4, :3]), rtol=1e-6)
  assert int(cache.lengths[0]) == 1 and int(cache.inner.lengths[0]) == 4
  # Keep node 1 ("a", target slot 2): the target's third token ends at
  # draft position 5.
  cache = cache.move(jnp.array([[2]]), jnp.array([[2]]))
  assert int(cache.draft_len_BxS[0, 3]) == 5
  with pytest.raises(ValueError, match="below its root"):
    wrapped.tree_decode(jnp.array([[3, 0, 2]]), cache, depth, ancestor)


@pytest.mark.big_batch
def test_real_loop_check_rejects_a_control_with_that_draft(cross_loop):
  result, _ = _run_loop(cross_loop, "wrong_fallback", 2, EOS)
  assert not result.passed, str(result)


def test_greedy_output_is_the_target_own_on_a_hugging_face_pair():
  """Qwen2 and GPT-2 tokenizers (the committed tiny checkpoints): greedy
  speculation with the GPT-2-tokenizer draft is the target's greedy
  `generate`, token for token."""
  data = REPO / "tests" / "data" / "hf"
  target, target_tok = hf.load(data / "qwen2")
  draft, draft_tok = hf.load(data / "gpt2")
  wrapped = TokenIntersectionDraft.build(
      draft, draft_tok, target_tok, target_vocab_size=target.vocab_size)
  prompts, lengths = encode_batch(target_tok, ["the quick brown fox",
                                               "def main():", "x"])
  kwargs = dict(max_new_tokens=24, sampling=sj.GREEDY,
                eos_id=target_tok.eos_ids or None)
  base = sj.generate(target, prompts, lengths, jax.random.key(0), **kwargs)
  spec = sj.speculative_generate(target, wrapped, prompts, lengths,
                                 jax.random.key(1), gamma=3, **kwargs)
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                np.asarray(base.tokens))


def test_the_registry_reads_a_checkpoint_of_another_tokenizer_through_tli():
  """`--draft=DIR` of another tokenizer (text in, text out through
  experiments.generate): greedy text equals the target's own."""
  data = REPO / "tests" / "data" / "hf"
  target, tok = hf.load(data / "qwen2")
  draft = drafts.make_draft(str(data / "llama3_tied"), target, tokenizer=tok)
  assert "token-level intersection" in draft.description
  result = textgen.run(draft.target, draft.model, tok, ["the quick brown"],
                       gamma=3, max_new_tokens=16, compare=True)
  assert result.texts == result.baseline_texts
