"""Whole generations are exact samples from the target (statistical tests).

A tiny Transformer target (V = 8) lets us enumerate the exact law of the first
three generated tokens from the target's own forward passes. 10^5 speculative
generations (batch rows are independent samples) must pass the harness in
`specjax.testing`; the same program with a deliberately wrong coupling rule
(resample from p on rejection; always accept) must fail it.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import sampling as sampling_lib
from specjax import testing
from specjax.decode import loop
from specjax.models import TransformerConfig, TransformerLM
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft

V, K, N = 8, 3, 100_000
PROMPT = np.array([1, 2, 3], np.int32)


def _model(seed, flavour):
  config = TransformerConfig(vocab_size=V, d_model=16, num_layers=1,
                             num_heads=2, num_kv_heads=1 if flavour == "llama"
                             else None, max_positions=32, flavour=flavour)
  model = TransformerLM.create(config, seed)
  # Random init gives nearly uniform next-token laws, under which every rule
  # looks exact; scaling the embeddings makes p and q peaked and different.
  state = jax.tree_util.tree_map_with_path(
      lambda path, x: 6.0 * x if "embed" in jax.tree_util.keystr(path) else x,
      model.state)
  return model.replace(state=state)


@pytest.fixture(scope="module")
def models():
  return _model(0, "gpt2"), _model(1, "llama")


def _exact_law(target, sampling):
  """float64 [V**K]: P(first K tokens = s) under target-only sampling."""
  seqs_SxK = np.array(list(itertools.product(range(V), repeat=K)), np.int32)
  full = np.concatenate([np.tile(PROMPT, (len(seqs_SxK), 1)), seqs_SxK], 1)
  p = np.asarray(sampling_lib.probabilities(target.logits(jnp.asarray(full)),
                                            sampling), np.float64)
  rows = np.arange(len(seqs_SxK))
  law = np.ones(len(seqs_SxK))
  for k in range(K):
    law *= p[rows, len(PROMPT) - 1 + k, seqs_SxK[:, k]]
  return law


def _sequence_ids(tokens):
  tokens = np.asarray(tokens)
  assert tokens.shape[1] == K
  return (tokens * V ** np.arange(K - 1, -1, -1)).sum(1)


def _run(target, draft, sampling, gamma, coupling_rule=None):
  prompts = np.tile(PROMPT, (N, 1))
  lengths = np.full(N, len(PROMPT), np.int32)
  if coupling_rule is None:
    return sj.speculative_generate(target, draft, prompts, lengths,
                                   jax.random.key(gamma), gamma=gamma,
                                   max_new_tokens=K, sampling=sampling)
  prompts, lengths, keys, *_ = loop._prepare(
      target, prompts, lengths, jax.random.key(gamma), max_new_tokens=K,
      lookahead=gamma, sampling=sampling, eos_id=None, pad_id=0, models=())
  return loop._generate(target, draft, prompts, lengths, keys, gamma=gamma,
                        max_new_tokens=K, sampling=sampling, eos_id=None,
                        pad_id=0, coupling_rule=coupling_rule)


def _gather(probs, token):
  return jnp.take_along_axis(probs, token[..., None], axis=-1)[..., 0]


def _wrong_fallback(u_accept, u_residual, p, q, draft):
  accepted = u_accept * _gather(q, draft) < _gather(p, draft)
  resampled = sampling_lib.sample_from_probs(u_residual, p)  # not (p - q)+
  return jnp.where(accepted, draft, resampled), accepted


def _always_accept(u_accept, u_residual, p, q, draft):
  del u_accept, u_residual, p, q
  return draft, jnp.ones(draft.shape, bool)


@pytest.mark.parametrize("sampling, gamma", [
    (sj.SamplingConfig(temperature=1.0), 3),
    (sj.SamplingConfig(temperature=0.7, top_k=5, top_p=0.9), 2),
])
def test_speculative_generations_are_exact(models, sampling, gamma):
  target, draft = models
  out = _run(target, draft, sampling, gamma)
  result = testing.check_distribution(_sequence_ids(out.tokens),
                                      _exact_law(target, sampling))
  assert result.passed, str(result)
  s = out.summary()
  # The draft is far enough from the target that the controls below bite.
  assert s["one_minus_tv"] < 0.9, s
  # alpha_hat is a mean of Bernoulli(sum min(p, q)) draws over the verified
  # positions: it must sit within a few standard errors of one_minus_tv.
  se = np.sqrt(s["one_minus_tv"] * (1 - s["one_minus_tv"]) / s["verified"])
  assert abs(s["alpha_hat"] - s["one_minus_tv"]) < 6 * se, s


def _draft_kinds():
  """Every draft kind the loop supports, built for the V = 8 toy vocabulary."""
  corpus = np.random.default_rng(0).integers(0, V, size=2000)
  return {
      "bigram": NGramLM.fit(corpus, V, order=2),
      # one_hot_q: the loop takes the proposal without sampling q.
      "prompt_lookup": PromptLookupDraft(V, max_ngram=2),
      "prompt_lookup+unigram": PromptLookupDraft(
          V, max_ngram=2, fallback=NGramLM.fit(corpus, V, order=1)),
  }


@pytest.mark.parametrize("kind", ["bigram", "prompt_lookup",
                                  "prompt_lookup+unigram"])
def test_every_draft_kind_is_exact(models, kind):
  target, _ = models
  sampling = sj.SamplingConfig(temperature=1.0)
  out = _run(target, _draft_kinds()[kind], sampling, 2)
  result = testing.check_distribution(_sequence_ids(out.tokens),
                                      _exact_law(target, sampling))
  assert result.passed, f"{kind}: {result}"


@pytest.mark.parametrize("rule", [_wrong_fallback, _always_accept])
def test_negative_controls_are_rejected(models, rule):
  target, draft = models
  sampling = sj.SamplingConfig(temperature=1.0)
  out = _run(target, draft, sampling, 3, coupling_rule=rule)
  result = testing.check_distribution(_sequence_ids(out.tokens),
                                      _exact_law(target, sampling))
  assert not result.passed, str(result)
