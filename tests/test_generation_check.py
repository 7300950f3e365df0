"""The whole-generation checks of `specjax.testing`: `generation_ids`,
`generation_law`, `check_generation` and the `toy_transformer` they run on.

The law must match one computed by hand (a bigram with a written-out table,
with EOS and top-k) and one computed through another forward pass (a
Transformer's full-sequence `logits`); exact samples (`specjax.generate`)
must pass the check, and the same samples against another law, or with one
row made impossible, must fail it; bad arguments are refused, naming the
argument, before the model runs.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import sampling as sampling_lib
from specjax import testing
from specjax.models.ngram import NGramLM

# A bigram over V = 3 ids: row a is P(next | current = a). Id 2 is the EOS.
TABLE = np.array([[0.5, 0.3, 0.2],
                  [0.1, 0.6, 0.3],
                  [0.25, 0.25, 0.5]])
EOS = 2


def _bigram():
  return NGramLM(log_probs=jnp.asarray(np.log(TABLE), jnp.float32),
                 vocab_size=3, order=2)


def test_ids_cut_after_the_first_eos_and_flag_ids_off_the_vocabulary():
  tokens = np.array([[1, 2, 0],    # 1 * 25 + 2 * 5 + 0
                     [1, 3, 0],    # EOS at 1: (1, 3, pad)
                     [1, 3, 2],    # differs only past its EOS: the same
                     [3, 9, -7],   # anything past the EOS
                     [5, 0, 0],    # 5 is no token of V = 4
                     [1, -1, 3]])  # nor is -1, before the EOS
  ids = testing.generation_ids(tokens, 4, eos_id=3)
  assert ids.dtype == np.int64
  np.testing.assert_array_equal(ids, [35, 44, 44, 99, -1, -1])
  # Without an EOS: radix V, every position read.
  np.testing.assert_array_equal(
      testing.generation_ids(tokens[:3], 4), [1 * 16 + 2 * 4, 1 * 16 + 3 * 4,
                                              1 * 16 + 3 * 4 + 2])
  np.testing.assert_array_equal(testing.generation_ids(tokens[3:], 4),
                                [-1, -1, -1])


@pytest.mark.parametrize("sampling", [
    None, sj.SamplingConfig(temperature=1.0, top_k=2)])
def test_law_matches_a_hand_computed_bigram_law(sampling):
  """K = 3 tokens after prompt (0, 1): P(x1 | 1) P(x2 | x1) P(x3 | x2),
  each row cut to its top 2 under top_k = 2, a sequence ending at its
  first EOS (later digits: the padding digit 3)."""
  rows = TABLE.copy()
  if sampling is not None:  # top-2 of every row, renormalised
    rows = np.where(rows >= np.sort(rows, 1)[:, 1:2], rows, 0.0)
    rows /= rows.sum(1, keepdims=True)
  want = {}
  for seq in itertools.product(range(3), repeat=3):
    prob, context, digits = 1.0, 1, []
    for x in seq:
      if digits and digits[-1] in (EOS, 3):
        digits.append(3)
        continue
      prob *= rows[context, x]
      context = x
      digits.append(x)
    want[tuple(digits)] = prob
  ids, law = testing.generation_law(_bigram(), np.array([0, 1]), 3, sampling,
                                    eos_id=EOS)
  # EOS first (1), or second after a non-EOS (2), or three tokens (2 * 2 * 3).
  assert len(ids) == len(want) == 1 + 2 + 12
  for seq, prob in want.items():
    (at,) = np.flatnonzero(ids == (seq[0] * 16 + seq[1] * 4 + seq[2]))
    assert law[at] == pytest.approx(prob, rel=1e-6), seq
  assert (np.diff(ids) > 0).all()
  assert law.sum() == pytest.approx(1.0, abs=1e-6)
  if sampling is not None:
    assert (law == 0).sum() > 0  # top-k masked some sequences


def test_law_matches_a_full_forward_of_a_transformer():
  """The law through `__call__` from an empty cache equals the product of
  the full-sequence forward's (`logits`) probabilities, under top-k and
  top-p, without an EOS: ids are the continuations in radix V."""
  model = testing.toy_transformer(4, 0)
  prompt = np.array([1, 2, 0], np.int32)
  sampling = sj.SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)
  ids, law = testing.generation_law(model, prompt, 3, sampling)
  np.testing.assert_array_equal(ids, np.arange(4 ** 3))
  seqs = np.array(list(itertools.product(range(4), repeat=3)), np.int32)
  full = np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], 1)
  p = np.asarray(sampling_lib.probabilities(model.logits(jnp.asarray(full)),
                                            sampling), np.float64)
  want = np.prod([p[np.arange(len(seqs)), len(prompt) - 1 + k, seqs[:, k]]
                  for k in range(3)], axis=0)
  np.testing.assert_allclose(law, want, rtol=1e-5, atol=1e-9)


def test_exact_samples_pass_and_a_wrong_law_or_an_impossible_row_fails():
  """20,000 rows of `specjax.generate` (the exact sampler) from a peaked
  toy, K = 4 with EOS: they pass. The negative controls, on the same rows:
  the law of another temperature, another model's law, and one row made
  impossible (padding before its EOS)."""
  model = testing.toy_transformer(4, 0)
  prompt = np.array([2, 0, 1], np.int32)
  n, eos = 20_000, 3
  t1 = sj.SamplingConfig(temperature=1.0)
  out = sj.generate(model, np.tile(prompt, (n, 1)), np.full(n, 3, np.int32),
                    jax.random.key(0), max_new_tokens=4, sampling=t1,
                    eos_id=eos, pad_id=4)
  tokens = np.asarray(out.tokens)
  assert 100 < (np.asarray(out.lengths) < 4).sum() < n - 100  # EOS stops
  result = testing.check_generation(tokens, model, prompt, t1, eos_id=eos)
  assert result.passed, str(result)
  assert result.n == n and result.num_impossible == 0
  for wrong_model, sampling in ((model, sj.SamplingConfig(temperature=0.8)),
                                (testing.toy_transformer(4, 1), t1)):
    wrong = testing.check_generation(tokens, wrong_model, prompt, sampling,
                                     eos_id=eos)
    assert not wrong.passed, str(wrong)
  row = int(np.flatnonzero(np.asarray(out.lengths) == 4)[0])
  broken = tokens.copy()
  broken[row, 1] = 4  # padding at position 1 of a row with no EOS
  impossible = testing.check_generation(broken, model, prompt, t1, eos_id=eos)
  assert not impossible.passed and impossible.num_impossible == 1


def _refuse(*_, **__):
  raise AssertionError("the model ran before the arguments were checked")


@pytest.mark.parametrize("call, error, match", [
    (lambda m: testing.generation_law(m, np.array([[1, 2]]), 2), ValueError,
     "prompt_P must have rank 1"),
    (lambda m: testing.generation_law(m, np.array([], np.int32), 2),
     ValueError, "prompt_P must hold at least one token"),
    (lambda m: testing.generation_law(m, np.array([1.0]), 2), TypeError,
     "prompt_P must be an integer array"),
    (lambda m: testing.generation_law(m, np.array([1, 4]), 2), ValueError,
     r"prompt_P\[1\] = 4 is outside the vocabulary \[0, 4\)"),
    (lambda m: testing.generation_law(m, np.array([1]), 0), ValueError,
     "num_tokens must be >= 1"),
    (lambda m: testing.generation_law(m, np.array([1]), 2.0), TypeError,
     "num_tokens must be a Python int"),
    (lambda m: testing.generation_law(m, np.array([1]), 2, {"temperature": 1}),
     TypeError, "sampling must be a specjax.SamplingConfig"),
    (lambda m: testing.generation_law(m, np.array([1]), 2,
                                      sj.SamplingConfig(top_k=5)),
     ValueError, "top_k"),
    (lambda m: testing.generation_law(m, np.array([1]), 2, eos_id=4),
     ValueError, "eos_id must be <= 3"),
    (lambda m: testing.generation_law(m, np.array([1]), 11), ValueError,
     r"vocab_size\*\*num_tokens = 4\*\*11 = 4,194,304 continuations, more "
     r"than max_sequences=1,048,576"),
    (lambda m: testing.generation_law(m, np.array([1]), 3, max_sequences=63),
     ValueError, "4\\*\\*3 = 64 continuations, more than max_sequences=63"),
    (lambda m: testing.generation_law(m, np.ones(30, np.int32), 4),
     ValueError, r"prompt_P \(30 tokens\) and num_tokens=4 need 33 "
     "positions; the model has max_positions=32"),
    (lambda m: testing.generation_law(object(), np.array([1]), 2), TypeError,
     "model must be a CausalLM"),
    (lambda m: testing.check_generation(np.zeros((4, 2)), m, np.array([1])),
     TypeError, "tokens_NxK must be an integer array"),
    (lambda m: testing.check_generation(np.zeros((4,), np.int32), m,
                                        np.array([1])),
     ValueError, "tokens_NxK must have rank 2"),
    (lambda m: testing.check_generation(np.zeros((0, 2), np.int32), m,
                                        np.array([1])),
     ValueError, "tokens_NxK must hold at least one row"),
    (lambda m: testing.check_generation(np.zeros((4, 2), np.int32), m,
                                        np.array([1]), significance=0.0),
     ValueError, "significance must be in"),
    (lambda m: testing.check_generation(np.zeros((4, 2), np.int32), m,
                                        np.array([1]), min_expected=0),
     ValueError, "min_expected must be > 0"),
    (lambda m: testing.check_generation(np.zeros((4, 2), np.int32), m,
                                        np.array([7])),
     ValueError, "prompt_P"),
    (lambda m: testing.generation_ids(np.zeros((4, 2), np.int32), 0),
     ValueError, "vocab_size must be >= 1"),
    (lambda m: testing.generation_ids(np.zeros((4, 0), np.int32), 4),
     ValueError, "tokens_NxK must hold at least one token"),
    (lambda m: testing.generation_ids(np.zeros((4, 2), np.int32), 4,
                                      eos_id=-1),
     ValueError, "eos_id must be >= 0"),
    (lambda m: testing.generation_ids(np.zeros((1, 40), np.int32), 4,
                                      eos_id=0),
     ValueError, r"tokens_NxK: 40 tokens in radix vocab_size \+ 1 = 5 \(the "
     "padding digit after eos_id\\) overflow int64"),
    (lambda m: testing.toy_transformer(4, embed_scale=0.0), ValueError,
     "embed_scale must be > 0"),
])
def test_bad_arguments_are_refused_before_the_model_runs(monkeypatch, call,
                                                         error, match):
  model = testing.toy_transformer(4, 0)
  monkeypatch.setattr(testing, "_scored_logits", _refuse)
  with pytest.raises(error, match=match):
    call(model)


def test_toy_transformer_scales_only_its_embeddings():
  """The same arguments give the same weights; embed_scale multiplies the
  embedding tables (token and gpt2's positions) and nothing else, which
  peaks the gpt2 flavour's next-token laws."""
  plain = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=8, d_model=16, num_layers=1, num_heads=2, max_positions=32),
      3)
  one = testing.toy_transformer(8, 3, embed_scale=1.0)
  peaked = testing.toy_transformer(8, 3)
  assert peaked.config == plain.config
  for (path, a), b, c in zip(
      jax.tree_util.tree_leaves_with_path(plain.state),
      jax.tree.leaves(one.state), jax.tree.leaves(peaked.state)):
    np.testing.assert_array_equal(a, b)
    scale = 4.0 if "embed" in jax.tree_util.keystr(path) else 1.0
    np.testing.assert_array_equal(np.asarray(a) * scale, c)
  tokens = jnp.asarray([[1, 2, 3]], jnp.int32)
  top = lambda m: float(jax.nn.softmax(m.logits(tokens)).max(-1).mean())
  assert top(peaked) > top(plain) + 0.1
  half = testing.toy_transformer(8, 0, flavour="llama", dtype="bfloat16")
  assert {str(x.dtype) for x in jax.tree.leaves(half.state)} == {"bfloat16"}
