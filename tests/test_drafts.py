"""Tests for the non-neural drafts: NGramLM and PromptLookupDraft."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling
from specjax.models import ngram
from specjax.models import prompt_lookup
from specjax.models.protocol import CausalLM


@jax.jit
def _forward(model, tokens_BxT, cache):
  return model(tokens_BxT, cache)


# ---------------------------------------------------------------------- n-gram


def test_ngram_counts_exact():
  tokens = np.array([0, 1, 1, 2, 0, 1], np.uint16)
  np.testing.assert_array_equal(ngram.ngram_counts(tokens, 4, 1),
                                [2, 3, 1, 0])
  expected = np.zeros((4, 4), np.int64)
  for a, b in [(0, 1), (1, 1), (1, 2), (2, 0), (0, 1)]:
    expected[a, b] += 1
  np.testing.assert_array_equal(ngram.ngram_counts(tokens, 4, 2), expected)
  # Separate sequences: no pair joins the end of one to the start of the
  # next (the flat array would count (1, 2) once more).
  expected[1, 2] -= 1
  np.testing.assert_array_equal(
      ngram.ngram_counts([tokens[:3], tokens[3:]], 4, 2), expected)
  np.testing.assert_array_equal(
      ngram.ngram_counts([tokens[:3], tokens[3:]], 4, 1), [2, 3, 1, 0])
  with pytest.raises(ValueError, match="no sequence of 2 tokens"):
    ngram.ngram_counts([tokens[:1], tokens[1:2]], 4, 2)
  with pytest.raises(ValueError, match=r"tokens\[1\] must"):
    ngram.ngram_counts([tokens, np.ones((2, 2), np.int32)], 4, 2)


@pytest.mark.parametrize("order", [1, 2])
def test_ngram_smoothing_normalised(order):
  tokens = np.array([0, 1, 1, 2, 0, 1])
  k, vocab = 0.5, 4
  model = ngram.NGramLM.fit(tokens, vocab, order, smoothing=k)
  counts = ngram.ngram_counts(tokens, vocab, order)
  expected = (counts + k) / (counts.sum(-1, keepdims=True) + k * vocab)
  np.testing.assert_allclose(np.exp(model.log_probs), expected, rtol=1e-6)
  np.testing.assert_allclose(np.exp(model.log_probs).sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.isfinite(model.log_probs))
  if order == 2:  # context 3 never seen: uniform
    np.testing.assert_allclose(np.exp(model.log_probs[3]), 0.25, rtol=1e-6)


def test_ngram_forward_ragged_and_rollback():
  model = ngram.NGramLM.fit(np.array([0, 1, 1, 2, 0, 1]), 4, 2)
  assert isinstance(model, CausalLM) and not model.one_hot_q
  assert model.max_positions is None
  cache = model.init_cache(2, 8).replace(lengths=jnp.array([0, 3], jnp.int32))
  tokens = jnp.array([[0, 1, 2], [2, 2, 3]], jnp.int32)
  logits, new_cache = _forward(model, tokens, cache)
  assert logits.shape == (2, 3, 4) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, model.log_probs[tokens])
  np.testing.assert_array_equal(new_cache.lengths, [3, 6])
  rolled = new_cache.replace(lengths=jnp.array([1, 4], jnp.int32))
  logits2, _ = _forward(model, tokens[:, :1], rolled)
  np.testing.assert_allclose(logits2, logits[:, :1])
  unigram = ngram.NGramLM.fit(np.array([0, 1, 1]), 4, 1)
  logits, _ = _forward(unigram, tokens, unigram.init_cache(2, 8))
  np.testing.assert_allclose(logits, jnp.broadcast_to(unigram.log_probs,
                                                      (2, 3, 4)))


def test_ngram_errors():
  with pytest.raises(ValueError, match="order must be 1 .* or 2"):
    ngram.NGramLM.fit(np.array([0, 1]), 2, 3)
  # Outside jit, ids off the table read another row (7 and -1 with V = 4
  # gave token 3's), as TransformerLM.check_inputs refuses.
  lm = ngram.NGramLM.uniform(4)
  for bad in (7, -1):
    with pytest.raises(ValueError, match=f"= {bad} is outside"):
      lm(jnp.asarray([[bad]]), lm.init_cache(1, 4))
  with pytest.raises(ValueError, match="smoothing must be > 0"):
    ngram.NGramLM.fit(np.array([0, 1]), 2, 2, smoothing=0.0)
  # k V overflowed float64 (1e308), or an unseen token's k / (counts + k V)
  # underflowed to 0 (5e-324): log-probabilities of -inf, not an error.
  tokens = np.array([1, 2, 3, 1, 2, 3, 0])
  for k in (1e308, 5e-324):
    with pytest.raises(ValueError, match=re.escape(
        f"smoothing={k} overflows or underflows float64")):
      ngram.NGramLM.fit(tokens, 8, smoothing=k)
  # Just inside: near-uniform, and an unseen token's tiny mass, both finite.
  for k, order in ((1e300, 2), (1e-320, 1)):
    model = ngram.NGramLM.fit(tokens, 8, order, smoothing=k)
    assert np.isfinite(np.asarray(model.log_probs)).all()
  with pytest.raises(ValueError, match="tokens must lie in"):
    ngram.NGramLM.fit(np.array([0, 5]), 2, 2)
  with pytest.raises(TypeError, match="tokens must be an integer array"):
    ngram.NGramLM.fit(np.array([0.0, 1.0]), 2, 2)
  model = ngram.NGramLM.uniform(3)
  with pytest.raises(ValueError, match="batch size 1"):
    model(jnp.zeros((1, 2), jnp.int32), model.init_cache(2, 4))


# --------------------------------------------------------------- prompt lookup


def _reference(seq, min_n, max_n, max_len):
  """Brute-force proposals for each position of a written-from-0 sequence."""
  out = []
  for i, tok in enumerate(seq):
    proposal = None
    if i < max_len:
      for n in range(max_n, min_n - 1, -1):
        for j in range(i - 1, n - 2, -1):
          if seq[j - n + 1:j + 1] == seq[i - n + 1:i + 1]:
            proposal = seq[j + 1]
            break
        if proposal is not None:
          break
    out.append((proposal if proposal is not None else tok,
                proposal is not None))
  return out


def _argmax_and_onehot(logits):
  probs = sampling.probabilities(logits, sampling.SamplingConfig())
  return np.asarray(jnp.argmax(logits, -1)), np.asarray(jnp.max(probs, -1))


def test_prompt_lookup_proposes_known_continuation():
  a, b, c, d = 1, 2, 3, 4
  draft = prompt_lookup.PromptLookupDraft(vocab_size=6)
  assert isinstance(draft, CausalLM) and draft.one_hot_q
  logits, cache = _forward(draft, jnp.array([[a, b, c, d, a, b]]),
                           draft.init_cache(1, 16))
  best, top_prob = _argmax_and_onehot(logits)
  assert best[0, -1] == c
  np.testing.assert_array_equal(top_prob, 1.0)  # one-hot, no NaN
  assert np.all(np.isfinite(logits))
  np.testing.assert_array_equal(cache.lengths, [6])
  # Fed back one token at a time, it copies the rest of the continuation.
  logits, cache = _forward(draft, jnp.array([[c]]), cache)
  assert int(jnp.argmax(logits[0, 0])) == d


def test_prompt_lookup_prefers_longest_ngram():
  x, a, b, y = 1, 2, 3, 4
  seq = jnp.array([[x, a, b, y, b, a, b]])
  two = prompt_lookup.PromptLookupDraft(vocab_size=5, max_ngram=2)
  one = prompt_lookup.PromptLookupDraft(vocab_size=5, max_ngram=1)
  logits2, _ = _forward(two, seq, two.init_cache(1, 8))
  logits1, _ = _forward(one, seq, one.init_cache(1, 8))
  assert int(jnp.argmax(logits2[0, -1])) == y  # "a b" -> y
  assert int(jnp.argmax(logits1[0, -1])) == a  # most recent "b" -> a


@pytest.mark.parametrize("chunk_elements", [None, 144])
def test_prompt_lookup_matches_brute_force(monkeypatch, chunk_elements):
  if chunk_elements is not None:  # force lax.map: chunks of 4 of 14 positions
    monkeypatch.setattr(prompt_lookup, "_LOOKUP_ELEMENTS", chunk_elements)
  rng = np.random.default_rng(0)
  batch, length, max_len = 3, 14, 12
  seqs = rng.integers(0, 3, size=(batch, length))
  draft = prompt_lookup.PromptLookupDraft(vocab_size=3, max_ngram=3,
                                          min_ngram=2)
  # A fresh jit: the module-level one may hold a trace of the other path.
  forward = jax.jit(lambda m, t, c: m(t, c))
  logits, cache = forward(draft, jnp.asarray(seqs, jnp.int32),
                          draft.init_cache(batch, max_len))
  best = np.asarray(jnp.argmax(logits, -1))
  for row in range(batch):
    ref = _reference(seqs[row].tolist(), 2, 3, max_len)
    assert best[row].tolist() == [p for p, _ in ref], row
  # Writes past capacity dropped; lengths still advance by T.
  np.testing.assert_array_equal(cache.history, seqs[:, :max_len])
  np.testing.assert_array_equal(cache.lengths, [length] * batch)


def test_prompt_lookup_ragged_incremental_and_rollback():
  rng = np.random.default_rng(1)
  seqs = rng.integers(0, 4, size=(2, 10)).astype(np.int32)
  draft = prompt_lookup.PromptLookupDraft(vocab_size=5)
  full, _ = _forward(draft, jnp.asarray(seqs), draft.init_cache(2, 16))
  # Ragged: prefill 6 tokens per row, roll row 0 back to 3, then one step.
  _, cache = _forward(draft, jnp.asarray(seqs[:, :6]), draft.init_cache(2, 16))
  cache = cache.replace(lengths=jnp.array([3, 6], jnp.int32))
  step = jnp.asarray(seqs[[0, 1], [3, 6]])[:, None]
  logits, cache = _forward(draft, step, cache)
  np.testing.assert_allclose(logits[0, 0], full[0, 3])
  np.testing.assert_allclose(logits[1, 0], full[1, 6])
  # Draft a wrong token, roll back, write the true one: same as fresh.
  _, drafted = _forward(draft, jnp.array([[4], [4]]), cache)
  rolled = drafted.replace(lengths=cache.lengths)
  step = jnp.asarray(seqs[[0, 1], [4, 7]])[:, None]
  logits, _ = _forward(draft, step, rolled)
  np.testing.assert_allclose(logits[0, 0], full[0, 4])
  np.testing.assert_allclose(logits[1, 0], full[1, 7])


def test_prompt_lookup_fallback():
  train = np.array([0, 1, 2, 0, 1, 2, 3])
  bigram = ngram.NGramLM.fit(train, 5, 2)
  draft = prompt_lookup.PromptLookupDraft(vocab_size=5, fallback=bigram)
  assert isinstance(draft, CausalLM) and not draft.one_hot_q
  tokens = jnp.array([[4, 3, 4, 2]], jnp.int32)
  logits, cache = _forward(draft, tokens, draft.init_cache(1, 8))
  # Positions 0, 1, 3 have no earlier match: the bigram's distribution.
  for t in (0, 1, 3):
    np.testing.assert_allclose(logits[0, t], bigram.log_probs[tokens[0, t]])
  assert int(jnp.argmax(logits[0, 2])) == 3 and logits[0, 2, 0] == -1e9
  np.testing.assert_array_equal(cache.fallback_cache.lengths, [4])
  # Rolling back our cache rolls the fallback's back too.
  logits, cache = _forward(draft, jnp.array([[1]]),
                           cache.replace(lengths=jnp.array([2], jnp.int32)))
  np.testing.assert_array_equal(cache.fallback_cache.lengths, [3])


def test_prompt_lookup_refuses_another_drafts_cache():
  """A cache without the fallback's cache failed as "'NoneType' object has
  no attribute 'replace'"; one with a fallback cache given to a draft
  without a fallback was read as is."""
  with_fallback = prompt_lookup.PromptLookupDraft(
      vocab_size=4, fallback=ngram.NGramLM.uniform(4))
  plain = prompt_lookup.PromptLookupDraft(vocab_size=4)
  tokens = jnp.zeros((1, 2), jnp.int32)
  with pytest.raises(ValueError, match="holds no fallback cache"):
    with_fallback(tokens, plain.init_cache(1, 8))
  with pytest.raises(ValueError, match="holds a fallback cache"):
    plain(tokens, with_fallback.init_cache(1, 8))


def test_prompt_lookup_errors():
  with pytest.raises(ValueError, match="max_ngram must be >= 2"):
    prompt_lookup.PromptLookupDraft(vocab_size=5, min_ngram=2, max_ngram=1)
  # Unrolled per n: max_ngram=1000 compiled for over ten minutes.
  cap = prompt_lookup.MAX_NGRAM
  for n in (cap + 1, 1000, 10**6):
    with pytest.raises(ValueError, match=f"max_ngram must be <= MAX_NGRAM="
                       f"{cap}, got {n}"):
      prompt_lookup.PromptLookupDraft(vocab_size=5, max_ngram=n)
  assert prompt_lookup.PromptLookupDraft(vocab_size=5,
                                         max_ngram=cap).max_ngram == cap
  with pytest.raises(TypeError, match="fallback must be None or a CausalLM"):
    prompt_lookup.PromptLookupDraft(vocab_size=5, fallback="bigram")
  with pytest.raises(ValueError, match="fallback has vocab_size 3"):
    prompt_lookup.PromptLookupDraft(vocab_size=5,
                                    fallback=ngram.NGramLM.uniform(3))
  draft = prompt_lookup.PromptLookupDraft(vocab_size=5)
  with pytest.raises(ValueError, match="tokens must have rank 2"):
    draft(jnp.zeros((3,), jnp.int32), draft.init_cache(1, 4))
  with pytest.raises(ValueError, match="batch size 1"):
    draft(jnp.zeros((1, 2), jnp.int32), draft.init_cache(2, 4))
