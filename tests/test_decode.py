"""The compiled decode loop: ragged batches, stats, one program, errors.

Greedy equality with `generate`, for every draft kind: tests/test_greedy.py.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.decode import loop
from specjax.decode import validation
from specjax.models import TransformerConfig, TransformerLM
from specjax.models.ngram import NGramLM

V = 16


def _config(**kw):
  base = dict(vocab_size=V, d_model=32, num_layers=2, num_heads=4,
              max_positions=96, flavour="gpt2")
  return TransformerConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def target():
  return TransformerLM.create(_config(), 0)


@pytest.fixture(scope="module")
def good_draft(target):
  """The target with lightly perturbed weights: high but imperfect agreement."""
  leaves, treedef = jax.tree.flatten(target.state)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  noisy = [x + 0.02 * jax.random.normal(k, x.shape, x.dtype)
           for x, k in zip(leaves, keys)]
  return target.replace(state=jax.tree.unflatten(treedef, noisy))


def _prompts(batch, seed=0, max_len=12):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch).astype(np.int32)
  prompts = rng.integers(0, V, size=(batch, max_len)).astype(np.int32)
  return prompts, lengths


@pytest.mark.full
def test_self_draft_accepts_everything(target):
  prompts, lengths = _prompts(4)
  out = sj.speculative_generate(target, target, prompts, lengths,
                                jax.random.key(0), gamma=4, max_new_tokens=25,
                                sampling=sj.SamplingConfig(temperature=1.0))
  s = out.summary()
  assert s["alpha_hat"] == 1.0 and s["one_minus_tv"] == pytest.approx(1.0)
  # 25 tokens in rounds of 5: exactly 5 target calls per row.
  assert s["target_calls"] == 4 * 5
  assert s["tokens_per_target_call"] == pytest.approx(5.0)


@pytest.mark.parametrize("sampling", [
    pytest.param(sj.GREEDY, marks=pytest.mark.slow),  # sampled is the harder
    sj.SamplingConfig(0.8, top_k=5)])
def test_row_output_does_not_depend_on_batch(target, good_draft, sampling):
  prompts, lengths = _prompts(8, seed=3)
  keys = jax.random.split(jax.random.key(11), 8)
  batched = sj.speculative_generate(target, good_draft, prompts, lengths, keys,
                                    gamma=3, max_new_tokens=16,
                                    sampling=sampling)
  for b in (0, 5):
    alone = sj.speculative_generate(target, good_draft, prompts[b:b + 1],
                                    lengths[b:b + 1], keys[b:b + 1], gamma=3,
                                    max_new_tokens=16, sampling=sampling)
    np.testing.assert_array_equal(alone.tokens[0], batched.tokens[b])


def test_eos_stops_row_and_rows_stay_ragged(target, good_draft):
  prompts, lengths = _prompts(8, seed=4)
  free = sj.speculative_generate(target, good_draft, prompts, lengths,
                                 jax.random.key(2), gamma=3, max_new_tokens=24,
                                 sampling=sj.SamplingConfig())
  eos = int(np.asarray(free.tokens)[0, 5])  # a token row 0 emits at step 5
  out = sj.speculative_generate(target, good_draft, prompts, lengths,
                                jax.random.key(2), gamma=3, max_new_tokens=24,
                                sampling=sj.SamplingConfig(), eos_id=eos,
                                pad_id=-1)
  tokens, n = np.asarray(out.tokens), np.asarray(out.lengths)
  assert n[0] <= 6
  for b in range(8):
    row = tokens[b, :n[b]]
    hits = np.flatnonzero(row == eos)
    # Stops right after the first EOS, or runs to the budget without one.
    assert (hits.size and hits[0] == n[b] - 1) or (not hits.size and n[b] == 24)
    assert (tokens[b, n[b]:] == -1).all()
    # Everything before the stop agrees with the run that had no EOS.
    np.testing.assert_array_equal(row, np.asarray(free.tokens)[b, :n[b]])
  assert len(set(n.tolist())) > 1, "expected ragged lengths"
  # 0-d jax ints (a tokenizer's id read off an array) were refused as not
  # Python ints; they are the same static arguments.
  same = sj.speculative_generate(
      target, good_draft, prompts, lengths, jax.random.key(2),
      gamma=jnp.int32(3), max_new_tokens=jnp.int32(24),
      sampling=sj.SamplingConfig(), eos_id=jnp.int32(eos),
      pad_id=jnp.int32(-1))
  np.testing.assert_array_equal(same.tokens, out.tokens)


def test_stats_are_consistent(target, good_draft):
  prompts, lengths = _prompts(8, seed=5)
  gamma = 4
  out = sj.speculative_generate(target, good_draft, prompts, lengths,
                                jax.random.key(1), gamma=gamma,
                                max_new_tokens=30, sampling=sj.SamplingConfig())
  st = jax.tree.map(np.asarray, out.stats)
  np.testing.assert_array_equal(st.accept_hist.sum(1), st.rounds)
  np.testing.assert_array_equal(st.draft_calls, gamma * st.rounds)
  np.testing.assert_array_equal(st.target_calls, st.rounds)
  np.testing.assert_array_equal(
      st.accepted, (st.accept_hist * np.arange(gamma + 1)).sum(1))
  assert (st.verified <= st.draft_calls).all() and (st.accepted <= st.verified).all()
  # Each round emits accepted + 1 tokens, except a final round cut by the budget.
  assert ((st.accepted + st.rounds >= np.asarray(out.lengths))).all()
  assert (np.asarray(out.lengths) == 30).all()
  # A fixed gamma reads no prompt (only a Goodput rule's prompt_prior does).
  assert not st.prompt_scored.any() and not st.prompt_overlap_sum.any()


def test_one_compilation_per_padded_shape(target, good_draft):
  traces = []
  original = loop._round

  def counting_round(*args, **kwargs):
    traces.append(1)
    return original(*args, **kwargs)

  loop._round = counting_round
  try:
    kwargs = dict(gamma=2, max_new_tokens=7, sampling=sj.SamplingConfig(0.9))
    for seed, width in [(0, 5), (1, 9), (2, 14)]:  # all in the 16 bucket
      prompts, lengths = _prompts(3, seed=seed, max_len=width)
      sj.speculative_generate(target, good_draft, prompts, lengths,
                              jax.random.key(seed), **kwargs)
    assert len(traces) == 1
    # A new model with the same structure reuses the program too.
    other = TransformerLM.create(_config(), 42)
    sj.speculative_generate(other, good_draft, prompts, lengths,
                            jax.random.key(0), **kwargs)
    assert len(traces) == 1
  finally:
    loop._round = original


def test_draft_and_verify_steps_are_public_and_exact_for_self_draft(target):
  prompts = jnp.asarray(_prompts(2, max_len=6)[0])
  cache = target.init_cache(2, 16)
  keys = jax.random.split(jax.random.key(0), 2)
  token, q, cache2 = sj.draft_step(target, cache, prompts, keys,
                                   sj.SamplingConfig())
  chex.assert_shape(q, (2, V))
  chex.assert_shape(token, (2,))
  np.testing.assert_array_equal(cache2.lengths, [6, 6])
  out = sj.verify_step(target, cache.replace(lengths=jnp.array([5, 5])),
                       prompts[:, -1], token[:, None], q[:, None],
                       keys, sj.SamplingConfig())
  np.testing.assert_array_equal(out.num_accepted, [1, 1])  # p == q
  np.testing.assert_array_equal(out.tokens[:, 0], token)


def test_steps_refuse_tokens_caches_and_laws_they_would_misuse(target):
  """Each of these once returned tokens: ids wrapped or clamped into the
  vocabulary (or NaN logits), writes past the cache dropped, a NaN or
  all-zero q that kept every draft."""
  keys = jax.random.split(jax.random.key(0), 1)
  t = sj.SamplingConfig()
  cache = target.init_cache(1, 8)
  q_1x2xV = jnp.full((1, 2, V), 1.0 / V)
  for bad in (-1, V):
    with pytest.raises(ValueError, match=r"tokens\[0, 1\] = .* outside"):
      sj.draft_step(target, cache, jnp.asarray([[1, bad]]), keys, t)
    with pytest.raises(ValueError, match=r"drafts\[0, 1\] = .* outside"):
      sj.verify_step(target, cache, jnp.asarray([1]), jnp.asarray([[2, bad]]),
                     q_1x2xV, keys, t)
    with pytest.raises(ValueError, match=r"last\[0\] = .* outside"):
      sj.verify_step(target, cache, jnp.asarray([bad]), jnp.asarray([[2, 3]]),
                     q_1x2xV, keys, t)
  with pytest.raises(ValueError, match="exceed cache.max_len=2"):
    sj.draft_step(target, target.init_cache(1, 2),
                  jnp.asarray([[1, 2, 3]]), keys, t)
  with pytest.raises(ValueError, match="exceed cache.max_len=8"):
    sj.verify_step(target, cache.replace(lengths=jnp.asarray([6])),
                   jnp.asarray([1]), jnp.asarray([[2, 3]]), q_1x2xV, keys, t)
  for match, select in (("select must index", np.asarray([2])),
                        ("select must be an integer", np.asarray([0.0]))):
    with pytest.raises((ValueError, TypeError), match=match):
      sj.draft_step(target, cache, jnp.asarray([[1, 2]]), keys, t,
                    select_B=select)
  for match, q in (("NaN", q_1x2xV * jnp.nan), ("sum to 1", 0 * q_1x2xV),
                   ("negative", q_1x2xV.at[0, 0, 0].set(-0.5)),
                   # Drafts q cannot propose: both were kept.
                   (r"drafts\[0, 0\] = 2 has probability 0 under q",
                    jnp.zeros((1, 2, V)).at[:, :, 0].set(1.0))):
    with pytest.raises(ValueError, match=match):
      sj.verify_step(target, cache, jnp.asarray([1]), jnp.asarray([[2, 3]]),
                     q, keys, t)
  # A cache that is none (failed in jit's argument handling), of another
  # batch, or with negative lengths (accepted, and the cache moved on).
  for error, match, bad_cache in (
      (TypeError, "cache must be the model's cache", "c"),
      (ValueError, r"cache.lengths has shape \(2,\); the step feeds 1 rows",
       target.init_cache(2, 8)),
      (ValueError, "cache.lengths must be >= 0",
       cache.replace(lengths=jnp.asarray([-4]))),
      # Float lengths failed inside flax's trace.
      (TypeError, "cache.lengths must be integer positions",
       cache.replace(lengths=jnp.asarray([2.0])))):
    with pytest.raises(error, match=match):
      sj.draft_step(target, bad_cache, jnp.asarray([[1, 2]]), keys, t)
    with pytest.raises(error, match=match):
      sj.verify_step(target, bad_cache, jnp.asarray([1]),
                     jnp.asarray([[2, 3]]), q_1x2xV, keys, t)


# ---- Bad input: a clear Python error before tracing, naming the argument.

def _call(target, draft, **overrides):
  prompts, lengths = _prompts(2, max_len=6)
  kwargs = dict(prompts=prompts, prompt_lengths=lengths, key=jax.random.key(0),
                gamma=2, max_new_tokens=8, sampling=sj.SamplingConfig())
  kwargs.update(overrides)
  return sj.speculative_generate(target, draft, **kwargs)


@pytest.mark.parametrize("overrides, error, match", [
    (dict(prompts=np.zeros((2, 200), np.int32),
          prompt_lengths=np.array([200, 3], np.int32)), ValueError,
     "max_positions"),
    (dict(prompt_lengths=np.array([0, 3], np.int32)), ValueError,
     "prompt_lengths"),
    (dict(prompt_lengths=np.array([7, 3], np.int32)), ValueError,
     "prompt_lengths"),
    (dict(prompt_lengths=np.array([3, 3, 3], np.int32)), ValueError,
     "prompt_lengths"),
    (dict(prompt_lengths=np.array([[3, 3]], np.int32)), ValueError,
     "prompt_lengths"),
    (dict(prompts=np.zeros((2, 6), np.float32)), TypeError, "prompts"),
    (dict(gamma=0), ValueError, "gamma"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=500), ValueError, "max_new_tokens"),
    (dict(sampling=sj.SamplingConfig(top_k=V + 1)), ValueError, "top_k"),
    (dict(eos_id=V), ValueError, "eos_id"),
    (dict(eos_id=-1), ValueError, "eos_id"),
    (dict(key=jax.random.split(jax.random.key(0), 3)), ValueError, "key"),
    (dict(key=7), TypeError, "key"),
    (dict(prompts=np.full((2, 6), V, np.int32)), ValueError, "vocabulary"),
    (dict(sampling=dict(temperature=1.0)), TypeError, "sampling"),
    # int64 ids past int32 must not wrap into the vocabulary.
    (dict(prompts=np.full((2, 6), 2**32 + 1, np.int64)), ValueError,
     "4294967297 is outside the vocabulary"),
    (dict(pad_id=2**31), ValueError, "pad_id must be <= 2147483647"),
])
def test_bad_input_gets_clear_error(target, good_draft, overrides, error, match):
  with pytest.raises(error, match=match):
    _call(target, good_draft, **overrides)


def test_sampling_config_rejects_bad_values():
  with pytest.raises(ValueError, match="temperature"):
    sj.SamplingConfig(temperature=-0.1)
  for top_p in (0.0, 1.5):
    with pytest.raises(ValueError, match="top_p"):
      sj.SamplingConfig(top_p=top_p)
  with pytest.raises(ValueError, match="top_k"):
    sj.SamplingConfig(top_k=-1)


def test_vocab_mismatch_is_an_error(target):
  other = TransformerLM.create(_config(vocab_size=V + 1), 0)
  with pytest.raises(ValueError, match="vocab_size"):
    _call(target, other)


def test_not_a_model_is_an_error(target):
  with pytest.raises(TypeError, match="draft"):
    _call(target, object())


def test_positions_past_int32_are_refused_for_models_without_a_limit():
  # An n-gram has no max_positions: jit failed parsing 2**40.
  bigram = NGramLM.fit(np.arange(64) % V, V, order=2)
  prompts, lengths = _prompts(2, max_len=6)
  for call in (lambda: sj.generate(bigram, prompts, lengths,
                                   jax.random.key(0), max_new_tokens=2**40),
               lambda: sj.speculative_generate(
                   bigram, bigram, prompts, lengths, jax.random.key(0),
                   gamma=2, max_new_tokens=2**31)):
    with pytest.raises(ValueError, match="max_new_tokens=.* past int32"):
      call()


def test_caches_that_cannot_fit_are_refused_before_anything_is_allocated(
    monkeypatch):
  """A call whose KV caches alone outgrow the free memory was still running
  after 120 s (an ad hoc run of the code before, killed by a timeout); now
  it is a MemoryError in under a second, naming the sizes and the fix."""
  config = TransformerConfig(vocab_size=V, d_model=32, num_layers=1,
                             num_heads=2, max_positions=16384)
  model = TransformerLM.create(config, 0)
  # x 10,032 positions (16 + 10,000 + the lookahead + 1, rounded up to a
  # multiple of loop.CACHE_BLOCK) x 2 x 32 float32: 2.4 TiB per model.
  rows = 1 << 20
  prompts, lengths = np.ones((rows, 1), np.int32), np.ones((rows,), np.int32)
  share = sj.SelfDraft(model, layers=1, share_cache=True)
  for call, match in (
      (lambda: sj.generate(model, prompts, lengths, jax.random.key(0),
                           max_new_tokens=10_000), r"model 2,508\.0 GiB"),
      (lambda: sj.speculative_generate(
          model, model, prompts, lengths, jax.random.key(0), gamma=3,
          max_new_tokens=10_000), r"target 2,508\.0 GiB, draft 2,508\.0"),
      # A draft that reads the target's cache holds none of its own.
      (lambda: sj.speculative_generate(
          model, share, prompts, lengths, jax.random.key(0), gamma=3,
          max_new_tokens=10_000), r"\(target 2,508\.0 GiB; 1048576 rows")):
    with pytest.raises(MemoryError, match=match + ".*free on .*lower "
                       "max_new_tokens"):
      call()
  # The control: the same check passes a call that fits, and refuses it
  # when the free memory is made smaller than its caches.
  small = (np.ones((2, 3), np.int32), np.full((2,), 3, np.int32))
  assert sj.generate(model, *small, jax.random.key(0),
                     max_new_tokens=4).tokens.shape == (2, 4)
  monkeypatch.setattr(validation, "_host_available_bytes", lambda: 1000)
  with pytest.raises(MemoryError, match="more than the 0.0 GiB free"):
    sj.generate(model, *small, jax.random.key(0), max_new_tokens=4)


def test_a_context_overflow_names_a_trees_node_count_as_its_lookahead():
  # It said "a tree's depth: the lookahead"; tree:2,1,1 has depth 3 and 6
  # nodes, and a round scores all 6.
  model = TransformerLM.create(TransformerConfig(
      vocab_size=V, d_model=32, num_layers=1, num_heads=1, max_positions=29),
      0)
  draft = sj.SelfDraft(model, layers=1, share_cache=True)
  with pytest.raises(ValueError, match=r"lookahead \(6\) needs 32 positions.*"
                     r"a tree's node count"):
    sj.speculative_generate(model, draft, np.ones((1, 22), np.int32),
                            np.array([22]), jax.random.key(0),
                            max_new_tokens=5, verifier="tree:2,1,1")
