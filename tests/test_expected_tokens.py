"""Closed-form expected acceptance (`Verifier.expected_accepted`) and the
paired, Rao-Blackwellised tokens per round (`specjax.harness.expected_tokens`)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax.decode import verifiers as vf
from specjax.harness import expected_tokens
from specjax.lab import models as lab_models
from specjax.lab import verifiers as lv
from specjax.models.ngram import NGramLM

T1 = sj.SamplingConfig(temperature=1.0)


def _blocks(pair, gamma):
  """Every (context, draft block) of a lab pair: p `[N, G+1, V]`, q, drafts
  and each block's probability under q, all contexts stacked (C x V**G)."""
  vocab, num_ctx = pair.vocab_size, pair.vocab_size + 1
  drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)))
  ctx = np.concatenate([np.broadcast_to(np.arange(num_ctx)[:, None, None],
                                        (num_ctx, len(drafts), 1)),
                        np.broadcast_to(drafts, (num_ctx,) + drafts.shape)],
                       axis=-1).reshape(-1, gamma + 1)
  p = pair.target_rows_CxV[ctx]
  q = pair.draft_rows_CxV[ctx[:, :gamma]]
  x = np.tile(drafts, (num_ctx, 1))
  prob = np.prod(np.take_along_axis(q, x[..., None], -1)[..., 0], axis=-1)
  return p, q, x, prob.reshape(num_ctx, -1)


@pytest.mark.parametrize("spec", ["token", "block"])
@pytest.mark.parametrize("certainty, match, seed, gamma", [
    (1.5, 0.5, 0, 1), (3.0, 0.25, 1, 3), (8.0, 0.95, 2, 2), (1000.0, 0.8, 3, 3),
    (0.5, 1.0, 4, 2)])
def test_expected_accepted_matches_the_lab_enumeration(spec, certainty, match,
                                                       seed, gamma):
  """Averaged over every draft block, the JAX closed form equals the lab's
  independent float64 enumeration of the verdict's law, in every context."""
  pair = lab.make_markov_pair(certainty, match, seed)
  p, q, x, prob_CxN = _blocks(pair, gamma)
  kept = np.asarray(vf.get_verifier(spec).expected_accepted(
      jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32),
      jnp.asarray(x, jnp.int32)), np.float64).reshape(prob_CxN.shape)
  np.testing.assert_allclose((prob_CxN * kept).sum(1),
                             lv.expected_accepted(pair, gamma, spec),
                             atol=2e-6)


def test_expected_accepted_of_the_paper_example_tells_token_from_block():
  pair, gamma = lv.paper_example()
  p, q, x, prob = _blocks(pair, gamma)
  got = {spec: float((prob * np.asarray(vf.get_verifier(spec).expected_accepted(
      jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32),
      jnp.asarray(x, jnp.int32))).reshape(prob.shape)).sum(1)[0])
         for spec in ("token", "block")}
  assert got["token"] == pytest.approx(10 / 9, abs=1e-6)
  assert got["block"] == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("spec", ["token", "block"])
def test_expected_accepted_refuses_what_is_not_a_law(spec):
  """Shapes were checked, values not: logits as p gave -3.6 drafts kept."""
  v = vf.get_verifier(spec)
  q = jnp.full((1, 1, 2), 0.5)
  drafts = jnp.zeros((1, 1), jnp.int32)
  for p, match in ((jnp.asarray([[[2.0, -1.0], [0.3, -2.0]]]), "negative"),
                   (jnp.full((1, 2, 2), jnp.nan), "NaN"),
                   (jnp.full((1, 2, 2), 0.3), "sum to 1")):
    with pytest.raises(ValueError, match=match):
      v.expected_accepted(p, q, drafts)
  with pytest.raises(TypeError, match="p"):
    v.expected_accepted(jnp.ones((1, 2, 2), jnp.int32), q, drafts)


@pytest.mark.parametrize("spec", ["lenient:0.5", "typical:0.09,0.3",
                                  "wrong_fallback", "always_accept"])
def test_verifiers_without_a_closed_form_say_so(spec):
  with pytest.raises(NotImplementedError, match="no closed-form"):
    vf.get_verifier(spec).expected_accepted(
        jnp.full((1, 2, 2), 0.5), jnp.full((1, 1, 2), 0.5),
        jnp.zeros((1, 1), jnp.int32))


def _texts(rows=48, prompt_len=3, new=24, seed=0):
  rng = np.random.default_rng(seed)
  prompts = rng.integers(0, 2, (rows, prompt_len)).astype(np.int32)
  tokens = rng.integers(0, 2, (rows, new)).astype(np.int32)
  return dict(prompts_BxP=prompts, prompt_lengths_B=np.full(rows, prompt_len),
              tokens_BxN=tokens, lengths_B=np.full(rows, new))


def test_paper_example_through_real_models_and_its_negative_control():
  """The paper's pair as CausalLMs (context-free, so every context's
  E[tau + 1] is 1 + 10/9 for token and 1 + 11/9 for block): the driver's
  estimates agree within 4 standard errors, and the token estimate rejects
  the block value (the test can fail)."""
  pair, gamma = lv.paper_example()
  target, draft = lab_models.markov_lms(pair)
  out = expected_tokens.expected_tokens_per_round(
      target, draft, ("token", "block"), T1, gamma=gamma, **_texts(),
      key=jax.random.key(0), samples=4, chunk=512)
  (tok, blk), (tok_se, blk_se) = (out["tokens_per_round"],
                                  out["tokens_per_round_se"])
  assert out["verifiers"] == ["token", "block"]
  assert out["contexts"] == 48 * 24 and out["blocks"] == 4 * 48 * 24
  assert abs(tok - (1 + 10 / 9)) < 4 * tok_se
  assert abs(blk - (1 + 11 / 9)) < 4 * blk_se
  assert abs(tok - (1 + 11 / 9)) > 4 * tok_se  # negative control
  ratio = (1 + 11 / 9) / (1 + 10 / 9)
  assert out["ratio"][0] == 1.0
  assert abs(out["ratio"][1] - ratio) < 4 * out["ratio_se"][1]
  assert abs(1.0 - ratio) > 4 * out["ratio_se"][1]  # paired: tight enough


def test_transformer_target_with_a_bigram_draft_and_ragged_rows():
  cfg = sj.TransformerConfig(vocab_size=16, d_model=32, num_layers=2,
                             num_heads=2, max_positions=64)
  target = sj.TransformerLM.create(cfg, 0)
  draft = NGramLM(log_probs=jax.nn.log_softmax(
      jax.random.normal(jax.random.key(1), (16, 16))), vocab_size=16, order=2)
  rng = np.random.default_rng(0)
  texts = dict(prompts_BxP=rng.integers(0, 16, (6, 5)).astype(np.int32),
               prompt_lengths_B=np.array([5, 2, 3, 5, 1, 4]),
               tokens_BxN=rng.integers(0, 16, (6, 9)).astype(np.int32),
               lengths_B=np.array([9, 0, 4, 9, 1, 6]))
  out = expected_tokens.expected_tokens_per_round(target, draft, ("block", "token"), T1,
                                     gamma=3, **texts, key=jax.random.key(2),
                                     chunk=7)
  assert out["contexts"] == 29
  block, token = out["tokens_per_round"]
  assert 1.0 <= token <= block + 1e-5 <= 4.0 + 1e-5
  # Chunks of 7 with a padded tail give what one chunk gives.
  whole = expected_tokens.expected_tokens_per_round(target, draft, ("block", "token"), T1,
                                       gamma=3, **texts,
                                       key=jax.random.key(2), chunk=64)
  np.testing.assert_allclose(whole["tokens_per_round"],
                             out["tokens_per_round"], rtol=1e-6)


@pytest.mark.full
def test_the_cut_context_is_the_prefix_alone():
  """A context cut from a longer prefilled text scores exactly as a text
  that ends there: the cache past the cut is masked. Same key, so the same
  uniforms draw the drafts; any leak from the future changes q or p."""
  cfg = sj.TransformerConfig(vocab_size=16, d_model=32, num_layers=2,
                             num_heads=2, max_positions=64)
  target = sj.TransformerLM.create(cfg, 0)
  draft = sj.TransformerLM.create(dataclasses.replace(cfg, num_layers=1), 1)
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, 16, (1, 4)).astype(np.int32)
  tokens = rng.integers(0, 16, (1, 8)).astype(np.int32)
  # Only the first generated position (the prompt alone) is a context.
  one = lambda toks: expected_tokens.expected_tokens_per_round(
      target, draft, ("token", "block"), T1, gamma=3, prompts_BxP=prompts,
      prompt_lengths_B=[4], tokens_BxN=toks, lengths_B=[1],
      key=jax.random.key(0))["tokens_per_round"]
  np.testing.assert_allclose(one(tokens), one(tokens[:, :1]), atol=1e-5)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(verifiers=("token", "lenient:0.5")), ValueError, "no closed-form"),
    (dict(verifiers=()), ValueError, "at least one"),
    (dict(gamma=0), ValueError, "gamma"),
    (dict(samples=0), ValueError, "samples"),
    (dict(gamma=40), ValueError, "at most 64 positions"),
    (dict(lengths_B=np.zeros(48, np.int64)), ValueError, "all 0"),
    (dict(sampling="T=1"), TypeError, "SamplingConfig"),
    # These failed inside tracing, after both prefills, or as verifier 't'.
    (dict(draft="not a model"), TypeError, "draft"),
    (dict(draft=sj.NGramLM.uniform(3)), ValueError, "vocab"),
    (dict(verifiers="token"), TypeError, "pass it in a tuple"),
    # Ids outside the vocabulary [0, 2) read as the last token; fractional
    # lengths were truncated.
    (dict(tokens_BxN=np.full((48, 24), 2, np.int32)), ValueError,
     r"tokens_BxN\[0, 0\] = 2 is outside target's vocabulary \[0, 2\)"),
    (dict(tokens_BxN=np.full((48, 24), -1, np.int32)), ValueError,
     r"tokens_BxN\[0, 0\] = -1 is outside"),
    (dict(prompts_BxP=np.full((48, 3), 99, np.int32)), ValueError,
     r"prompts_BxP\[0, 0\] = 99 is outside"),
    (dict(lengths_B=np.full(48, 2.7)), TypeError,
     "lengths_B must be an integer array"),
    (dict(prompt_lengths_B=np.full(48, 3.0)), TypeError,
     "prompt_lengths_B must be an integer array"),
    # One key per row (as `generate` takes) failed inside jax.random.
    (dict(key=jax.random.split(jax.random.key(0), 48)), ValueError,
     r"key must be a single PRNG key .* shape \(48,\)"),
])
def test_bad_input_is_refused_before_tracing(kwargs, error, match):
  pair, _ = lv.paper_example()
  _, draft = lab_models.markov_lms(pair)
  cfg = sj.TransformerConfig(vocab_size=2, d_model=16, num_layers=1,
                             num_heads=2, max_positions=64)
  args = dict(target=sj.TransformerLM.create(cfg, 0), draft=draft,
              verifiers=("token", "block"), sampling=T1, gamma=2,
              key=jax.random.key(0), **_texts())
  args.update(kwargs)
  with pytest.raises(error, match=match):
    expected_tokens.expected_tokens_per_round(**args)
