"""specjax.distortion: the lossy verifiers' per-token TV, checked on the lab."""

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import distortion
from specjax import lab
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
  with pytest.raises(ValueError, match="row count"):
    distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                            **{**ok, "lengths_B": np.ones(3, np.int32)})
  with pytest.raises(ValueError, match="lengths_B"):
    distortion.per_token_tv(target, draft, "lenient:0.5", sampling,
                            **{**ok, "lengths_B": np.full(2, 4, np.int32)})
