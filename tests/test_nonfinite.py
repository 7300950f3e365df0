"""No silent wrong tokens: non-finite logits are counted, then raised or warned.

A NaN logit row used to sample token V-1 (PAD for bytes) without a trace. The
loop now counts, per row, target positions and draft proposals drawn from
non-finite logits (NaN, +inf, or every entry -inf); `generate` and
`speculative_generate` raise `NonFiniteLogitsError` naming the rows and the
model, or warn with `on_nonfinite="warn"`.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.models import TransformerConfig, TransformerLM
from specjax.models.ngram import NGramLM

V = 16


class Poisoned(flax.struct.PyTreeNode):
  """`model` whose logits are `value` in the batch rows `rows`."""
  model: Any
  rows: tuple = flax.struct.field(pytree_node=False)
  value: float = flax.struct.field(pytree_node=False, default=float("nan"))

  vocab_size = property(lambda self: self.model.vocab_size)
  max_positions = property(lambda self: self.model.max_positions)
  one_hot_q = property(lambda self: False)

  def init_cache(self, batch_size, max_len):
    return self.model.init_cache(batch_size, max_len)

  def __call__(self, tokens_BxT, cache):
    logits_BxTxV, cache = self.model(tokens_BxT, cache)
    bad_B = jnp.isin(jnp.arange(tokens_BxT.shape[0]), jnp.array(self.rows))
    return jnp.where(bad_B[:, None, None], self.value, logits_BxTxV), cache


@pytest.fixture(scope="module")
def target():
  config = TransformerConfig(vocab_size=V, d_model=16, num_layers=1,
                             num_heads=2, max_positions=64)
  return TransformerLM.create(config, 0)


def _prompts(batch=4):
  prompts = np.tile(np.arange(1, 6, dtype=np.int32), (batch, 1))
  return prompts, np.full(batch, 5, np.int32)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_generate_raises_naming_rows_and_target(target, value):
  prompts, lengths = _prompts()
  with pytest.raises(sj.NonFiniteLogitsError,
                     match=r"generate: the target .* 1 row\(s\) \(row 2: 6\)"):
    sj.generate(Poisoned(target, (2,), value), prompts, lengths,
                jax.random.key(0), max_new_tokens=6)


def test_all_minus_inf_row_is_non_finite_but_some_minus_inf_is_not(target):
  prompts, lengths = _prompts()
  with pytest.raises(sj.NonFiniteLogitsError, match="row 0"):
    sj.generate(Poisoned(target, (0,), -float("inf")), prompts, lengths,
                jax.random.key(0), max_new_tokens=3)
  # -inf on some tokens is a legal zero probability (an unsmoothed n-gram).
  probs_V = np.zeros(V, np.float32)
  probs_V[[3, 7]] = 0.5
  with np.errstate(divide="ignore"):
    unigram = NGramLM(log_probs=jnp.asarray(np.log(probs_V)), vocab_size=V,
                      order=1)
  out = sj.generate(unigram, prompts, lengths, jax.random.key(0),
                    max_new_tokens=4)
  assert set(np.asarray(out.tokens).ravel()) <= {3, 7}
  assert out.summary()["target_nonfinite"] == 0


@pytest.mark.parametrize("sampling", [sj.SamplingConfig(temperature=1.0),
                                      sj.GREEDY])
def test_speculative_names_the_draft_and_warn_returns(target, sampling):
  prompts, lengths = _prompts()
  draft = Poisoned(target, (1, 3))
  with pytest.raises(sj.NonFiniteLogitsError,
                     match=r"the draft proposed .* 2 row\(s\) \(row 1: .*row 3"):
    sj.speculative_generate(target, draft, prompts, lengths, jax.random.key(1),
                            gamma=3, max_new_tokens=8, sampling=sampling)
  with pytest.warns(RuntimeWarning, match="draft proposed"):
    out = sj.speculative_generate(target, draft, prompts, lengths,
                                  jax.random.key(1), gamma=3, max_new_tokens=8,
                                  sampling=sampling, on_nonfinite="warn")
  counts = np.asarray(out.stats.draft_nonfinite)
  assert counts[0] == counts[2] == 0 and counts[1] > 0 and counts[3] > 0
  assert not np.asarray(out.stats.target_nonfinite).any()
  assert out.summary()["draft_nonfinite"] == counts.sum()


def test_target_non_finite_in_speculative_and_steps(target):
  prompts, lengths = _prompts()
  bad = Poisoned(target, (0,))
  with pytest.raises(sj.NonFiniteLogitsError,
                     match=r"the target scored .*\(row 0: "):
    sj.speculative_generate(bad, target, prompts, lengths, jax.random.key(2),
                            gamma=2, max_new_tokens=5)
  # The public steps report it too: NaN q rows, and VerifyOutput.nonfinite.
  cache = bad.init_cache(4, 16)
  token_B, q_BxV, _ = sj.draft_step(bad, cache, prompts, jax.random.key(0),
                                    sj.SamplingConfig())
  assert np.isnan(np.asarray(q_BxV[0])).all()
  assert np.isfinite(np.asarray(q_BxV[1:])).all()
  out = sj.verify_step(bad, bad.init_cache(4, 16), prompts[:, 0],
                       prompts[:, 1:3], np.full((4, 2, V), 1.0 / V),
                       jax.random.key(0), sj.SamplingConfig())
  np.testing.assert_array_equal(out.nonfinite, [3, 0, 0, 0])


def test_healthy_run_counts_zero_and_bad_option_is_an_error(target):
  prompts, lengths = _prompts()
  out = sj.speculative_generate(target, target, prompts, lengths,
                                jax.random.key(0), gamma=2, max_new_tokens=4)
  s = out.summary()
  assert s["target_nonfinite"] == 0 and s["draft_nonfinite"] == 0
  with pytest.raises(ValueError, match="on_nonfinite"):
    sj.generate(target, prompts, lengths, jax.random.key(0), max_new_tokens=2,
                on_nonfinite="ignore")
