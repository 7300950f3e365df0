"""specjax.harness.distortion: the lossy verifiers' per-token TV, checked on the lab."""

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax.harness import distortion
from specjax.lab import models as lab_models
from specjax.lab import verifiers as lab_verifiers

LAWS = ("token", "lenient:0.5", "typical:0.09,0.3", "wrong_fallback",
        "always_accept")


@pytest.mark.parametrize("certainty,match", [(1.5, 0.5), (3.0, 0.8)])
def test_position_law_matches_the_labs_enumeration(certainty, match):
  pair = lab.make_markov_pair(certainty, match, 0)
  p = pair.target_rows_CxV.astype(np.float32)
  q = pair.draft_rows_CxV.astype(np.float32)
  for v in LAWS:
    law = np.asarray(distortion.position_law(v, p, q))
    np.testing.assert_allclose(law.sum(-1), 1.0, atol=1e-6)
    tv = np.asarray(distortion.position_tv(v, p, q))
    np.testing.assert_allclose(tv, lab_verifiers.position_tv(pair, v),
                               atol=1e-6, err_msg=v)
    # Negative control: the exact rule's law is p; the others' is not.
    assert (tv.max() < 1e-6) == (v == "token"), (v, tv)


def test_estimate_matches_the_exact_expectation_on_real_decoding():
  pair, gamma, rows, new, context = lab.make_markov_pair(1.5, 0.5, 0), 2, 2000, 4, 3
  target, draft = lab_models.markov_lms(pair)
  prompts = np.full((rows, 1), context, np.int32)
  lengths = np.ones(rows, np.int32)
  sampling = sj.SamplingConfig(temperature=1.0)
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(0), gamma=gamma,
                                max_new_tokens=new, sampling=sampling,
                                verifier="lenient:0.5")
  estimate = lambda v: distortion.per_token_tv(
      target, draft, v, sampling, prompts_BxP=prompts,
      prompt_lengths_B=lengths, tokens_BxN=out.tokens, lengths_B=out.lengths)
  est = estimate("lenient:0.5")
  exact = lab_verifiers.expected_position_tv(pair, gamma, new, "lenient:0.5",
                                             context)
  assert est["positions"] == rows * new
  assert 0.01 < exact  # the check has power: the verifier does distort
  assert abs(est["tv_per_token"] - exact) < 4 * est["tv_per_token_se"], (
      est, exact)
  # The same comparison rejects another verifier's expectation.
  other = lab_verifiers.expected_position_tv(pair, gamma, new, "lenient:0.4",
                                             context)
  assert abs(est["tv_per_token"] - other) > 4 * est["tv_per_token_se"], (
      est, other)
  # The bound of the module docstring, against the lab's sequence TV.
  assert lab_verifiers.verifier_tv(pair, gamma, new, "lenient:0.5",
                                   context) <= new * exact + 1e-12
  # Negative control: token verification's law is p, so its estimate is 0
  # on the same text; a wrong rule's is not.
  assert estimate("token")["tv_per_token"] < 1e-6
  assert estimate("wrong_fallback")["tv_per_token"] > 0.02


def test_bad_inputs_are_named():
  pair = lab.make_markov_pair(1.5, 0.5, 0)
  target, draft = lab_models.markov_lms(pair)
  ok = dict(prompts_BxP=np.zeros((2, 1), np.int32),
            prompt_lengths_B=np.ones(2, np.int32),
            tokens_BxN=np.zeros((2, 3), np.int32),
            lengths_B=np.full(2, 3, np.int32))
  sampling = sj.SamplingConfig(temperature=1.0)
  assert not distortion.has_position_law("block")
  with pytest.raises(ValueError, match="no per-position law"):
    distortion.per_token_tv(target, draft, "block", sampling, **ok)
  # A non-model draft failed inside tracing, another vocabulary late.
  with pytest.raises(TypeError, match="draft"):
    distortion.per_token_tv(target, "x", "lenient:0.5", sampling, **ok)
  with pytest.raises(ValueError, match="vocab"):
    distortion.per_token_tv(target, sj.NGramLM.uniform(3),
                            "lenient:0.5", sampling, **ok)
  with pytest.raises(ValueError, match="row count"):
    distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                            **{**ok, "lengths_B": np.ones(3, np.int32)})
  with pytest.raises(ValueError, match="lengths_B"):
    distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                            **{**ok, "lengths_B": np.full(2, 4, np.int32)})
  # Ids outside the vocabulary read as the last token (99 and -1 gave V - 1's
  # number); a fractional length was truncated.
  vocab = pair.vocab_size
  for bad in (vocab, 99, -1):
    tokens = np.zeros((2, 3), np.int32)
    tokens[1, 2] = bad
    with pytest.raises(ValueError,
                       match=rf"tokens_BxN\[1, 2\] = {bad} is outside"):
      distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                              **{**ok, "tokens_BxN": tokens})
  with pytest.raises(ValueError, match=r"prompts_BxP\[0, 0\] = -1"):
    distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                            **{**ok, "prompts_BxP": np.full((2, 1), -1,
                                                            np.int32)})
  with pytest.raises(TypeError, match="lengths_B must be an integer array"):
    distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                            **{**ok, "lengths_B": np.full(2, 2.7)})
  # Padding past a row's length (the decode's pad_id) may be any id: it is
  # not read, and the estimate is the same as with zeros there.
  padded = np.array([[1, 0, -1], [0, 1, 1]], np.int32)
  zeros = np.array([[1, 0, 0], [0, 1, 1]], np.int32)
  est = lambda toks: distortion.per_token_tv(
      target, draft, "lenient:0.5", sampling,
      **{**ok, "tokens_BxN": toks, "lengths_B": np.array([2, 3], np.int32)})
  assert est(padded) == est(zeros)


def test_position_law_refuses_what_is_not_a_pair_of_laws():
  p = np.array([0.5, 0.3, 0.2], np.float32)
  q = np.array([0.3, 0.1, 0.6], np.float32)
  for fn in (distortion.position_law, distortion.position_tv):
    # JAX's "min got incompatible shapes for broadcasting" before.
    with pytest.raises(ValueError, match="p_xV and q_xV must share the vocabulary axis"):
      fn("token", p, np.full(4, 0.25, np.float32))
    with pytest.raises(ValueError, match="do not broadcast against each other"):
      fn("token", np.stack([p] * 2), np.stack([q] * 3))
    # Integer one-hots were accepted as laws.
    with pytest.raises(TypeError, match="p_xV must be a float array"):
      fn("token", np.array([1, 0, 0]), q)
    # An all-zero p gave a NaN law; an unnormalised one a wrong law.
    with pytest.raises(ValueError, match="every row of p_xV must sum to 1"):
      fn("token", np.zeros(3, np.float32), q)
    with pytest.raises(ValueError, match="every row of q_xV must sum to 1"):
      fn("lenient:0.5", p, np.stack([q, 2 * q]))
    with pytest.raises(ValueError, match="q_xV holds NaN or inf"):
      fn("token", p, np.array([0.3, np.nan, 0.7], np.float32))
    with pytest.raises(ValueError, match="p_xV has negative entries"):
      fn("token", np.array([1.2, -0.2, 0.0], np.float32), q)
  # No positions: nothing to check, an empty result (no reduction error).
  assert distortion.position_tv("token", np.zeros((0, 3), np.float32),
                                q).shape == (0,)
  # Leading axes broadcast, and the checks leave traced calls alone.
  np.testing.assert_allclose(
      distortion.position_tv("lenient:0.5", np.stack([p, q]), q),
      [distortion.position_tv("lenient:0.5", p, q), 0.0], atol=1e-7)
  jitted = jax.jit(lambda p, q: distortion.position_tv("lenient:0.5", p, q))
  np.testing.assert_allclose(jitted(p, q),
                             distortion.position_tv("lenient:0.5", p, q))
