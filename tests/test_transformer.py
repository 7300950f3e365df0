"""TransformerLM: cached incremental logits equal the full causal forward."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.models import CausalLM
from specjax.models import KVCache
from specjax.models import TransformerConfig
from specjax.models import TransformerLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models import transformer as transformer_lib

V = 13
TOL = dict(atol=1e-5, rtol=1e-5)
# Tests share shapes (batch 2, 12-token sequences, 16-slot caches, chunks of
# 1 or 3 tokens) so that the jitted functions below compile only a few times.
B, N, S = 2, 12, 16
CONFIGS = {
    "gpt2": TransformerConfig(vocab_size=V, d_model=32, num_layers=2,
                              num_heads=4, max_positions=32, flavour="gpt2"),
    # Grouped-query: 4 query heads share 2 kv heads.
    "llama": TransformerConfig(vocab_size=V, d_model=32, num_layers=2,
                               num_heads=4, num_kv_heads=2, mlp_dim=48,
                               max_positions=32, flavour="llama"),
}


def _model(flavour, seed=0):
  """A model whose logits are O(1), so a 1e-5 tolerance means something.

  The default init (std 0.02) makes logits ~1e-2; every weight is redrawn
  at unit scale per fan-in instead.
  """
  model = TransformerLM.create(CONFIGS[flavour], seed)
  leaves, treedef = jax.tree.flatten(model.state)
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  leaves = [jax.random.normal(k, x.shape) / np.sqrt(x.shape[0] if x.ndim == 2
                                                    else 1.0)
            for k, x in zip(keys, leaves)]
  return model.replace(state=jax.tree.unflatten(treedef, leaves))


def _tokens(seed, shape):
  return jax.random.randint(jax.random.key(seed), shape, 0, V, jnp.int32)


# Module level, so compilations are shared between tests (one per shape).
_step = jax.jit(lambda model, tokens_BxT, cache: model(tokens_BxT, cache))
_full = jax.jit(lambda model, tokens_BxT: model.logits(tokens_BxT))


def _run_chunks(model, tokens_BxN, cache, sizes):
  logits = []
  start = 0
  for t in sizes:
    out, cache = _step(model, tokens_BxN[:, start:start + t], cache)
    logits.append(out)
    start += t
  return jnp.concatenate(logits, axis=1), cache


@pytest.mark.parametrize("flavour", [
    "gpt2", pytest.param("llama", marks=pytest.mark.full)])
def test_token_by_token_and_chunks_equal_full_forward(flavour):
  model = _model(flavour)
  tokens_BxN = _tokens(1, (B, N))
  ref_BxNxV = _full(model, tokens_BxN)
  assert ref_BxNxV.dtype == jnp.float32
  assert float(jnp.std(ref_BxNxV)) > 0.3  # the tolerance is meaningful
  for sizes in ([1] * N, [3, 1, 1, 3, 3, 1]):
    got, cache = _run_chunks(model, tokens_BxN, model.init_cache(B, S), sizes)
    np.testing.assert_allclose(got, ref_BxNxV, **TOL)
    np.testing.assert_array_equal(cache.lengths, [N, N])


@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_rollback_then_continue_equals_full_forward(flavour):
  model = _model(flavour)
  tokens_BxN = _tokens(2, (B, N))
  ref_BxNxV = _full(model, tokens_BxN)
  _, cache = _run_chunks(model, tokens_BxN, model.init_cache(B, S), [3, 3])
  # Speculative tokens that get rejected: garbage written at positions 6..11.
  garbage_BxN = (tokens_BxN + 5) % V
  _, cache = _run_chunks(model, garbage_BxN[:, 6:], cache, [3, 3])
  np.testing.assert_array_equal(cache.lengths, [12, 12])
  cache = cache.replace(lengths=jnp.array([6, 6], jnp.int32))
  got, cache = _run_chunks(model, tokens_BxN[:, 6:], cache, [3, 1, 1, 1])
  np.testing.assert_allclose(got, ref_BxNxV[:, 6:], **TOL)


@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_ragged_rows_like_the_decode_loop(flavour):
  """Each round scores 3 tokens per row and keeps a different number per row."""
  model = _model(flavour)
  t = 3
  seq_BxN = _tokens(3, (B, N))
  ref_BxNxV = _full(model, seq_BxN)
  _, cache = _step(model, seq_BxN[:, :t], model.init_cache(B, S))
  cache = cache.replace(lengths=jnp.array([0, 2], jnp.int32))
  rng = np.random.default_rng(0)
  for _ in range(3):  # lengths stay <= 2 + 3 * 2, so indices stay < N
    lengths_B = np.asarray(cache.lengths)
    idx_BxT = lengths_B[:, None] + np.arange(t)
    tokens_BxT = jnp.take_along_axis(seq_BxN, jnp.asarray(idx_BxT), axis=1)
    logits_BxTxV, cache = _step(model, tokens_BxT, cache)
    want_BxTxV = jnp.take_along_axis(ref_BxNxV, jnp.asarray(idx_BxT)[..., None],
                                     axis=1)
    np.testing.assert_allclose(logits_BxTxV, want_BxTxV, **TOL)
    np.testing.assert_array_equal(cache.lengths, lengths_B + t)
    keep_B = rng.integers(1, t + 1, size=B)
    cache = cache.replace(lengths=jnp.asarray(lengths_B + keep_B, jnp.int32))


def test_grouped_query_equals_multi_head_with_repeated_kv():
  """kv head k serves query heads k*G .. k*G+G-1 (Hugging Face order)."""
  gqa = _model("llama")
  c = gqa.config
  mha = TransformerLM.create(
      TransformerConfig(**{**vars(c), "num_kv_heads": c.num_heads}), 0)
  module, group = gqa.module(), c.num_heads // c.num_kv_heads
  mha_module = mha.module()
  nnx.update(mha_module, nnx.state(module))  # everything but k/v shapes
  for gqa_block, mha_block in zip(module.blocks, mha_module.blocks):
    for name in ("key", "value"):
      kernel = getattr(gqa_block.attn, name).kernel[...]
      kernel = kernel.reshape(c.d_model, c.num_kv_heads, 1, c.head_dim)
      kernel = jnp.broadcast_to(
          kernel, (c.d_model, c.num_kv_heads, group, c.head_dim))
      getattr(mha_block.attn, name).kernel = nnx.Param(
          kernel.reshape(c.d_model, -1))
  mha = TransformerLM.from_module(mha_module)
  tokens_BxN = _tokens(4, (B, N))
  np.testing.assert_allclose(_full(mha, tokens_BxN), _full(gqa, tokens_BxN),
                             **TOL)
  got, _ = _run_chunks(gqa, tokens_BxN, gqa.init_cache(B, S), [3] * 4)
  np.testing.assert_allclose(got, _full(mha, tokens_BxN), **TOL)


def test_writes_beyond_max_len_are_dropped():
  model = _model("gpt2")
  tokens_BxN = _tokens(5, (B, N))
  ref_BxNxV = _full(model, tokens_BxN)
  _, cache = _step(model, tokens_BxN[:, :3], model.init_cache(B, 5))
  k_before = np.asarray(cache.k[0])
  logits, cache = _step(model, tokens_BxN[:, 3:6], cache)  # positions 3..5
  np.testing.assert_array_equal(cache.lengths, [6, 6])
  assert np.isfinite(np.asarray(logits)).all()
  # Positions that fit are exact; position 5 did not wrap around onto 0..2.
  np.testing.assert_allclose(logits[:, :2], ref_BxNxV[:, 3:5], **TOL)
  np.testing.assert_array_equal(cache.k[0][:, :, :3], k_before[:, :, :3])


def test_negative_and_out_of_range_cache_slots_are_dropped():
  """.at[-1] wraps even with mode="drop": a write at -1 landed in the last
  slot, a move to -1 overwrote it, and a move from past the end copied the
  last slot."""
  cache = KVCache.create(num_layers=1, batch_size=1, max_len=4,
                         num_kv_heads=1, head_dim=1)
  one = jnp.ones((1, 1, 1, 1))
  written = cache.write(0, one, one, jnp.asarray([[-1]]))
  np.testing.assert_array_equal(written.k[0].ravel(), [0, 0, 0, 0])
  filled = cache.write(0, jnp.arange(4.0).reshape(1, 4, 1, 1),
                       jnp.arange(4.0).reshape(1, 4, 1, 1),
                       jnp.arange(4)[None])
  moved = filled.move(jnp.asarray([[0, 9, 1]]), jnp.asarray([[-1, 0, 2]]))
  np.testing.assert_array_equal(moved.k[0].ravel(), [0, 1, 1, 3])


@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_empty_cache_and_stale_entries_make_no_nan(flavour):
  model = _model(flavour)
  tokens_BxN = _tokens(6, (B, N))
  fresh, _ = _step(model, tokens_BxN[:, :1], model.init_cache(B, S))
  # Rolled back to empty, with huge stale values everywhere.
  stale = model.init_cache(B, S)
  stale = stale.replace(k=jax.tree.map(lambda x: x + 1e30, stale.k),
                        v=jax.tree.map(lambda x: x - 1e30, stale.v))
  got, _ = _step(model, tokens_BxN[:, :1], stale)
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(got, fresh, **TOL)
  np.testing.assert_allclose(fresh[:, 0], _full(model, tokens_BxN)[:, 0], **TOL)
  # A fully masked attention row is uniform, not NaN.
  q = jnp.ones((1, 1, 4, 8))
  kv = jnp.ones((1, 2, 5, 8))
  out = transformer_lib._attend(q, kv, kv, jnp.zeros((1, 1, 5), bool))
  assert np.isfinite(np.asarray(out)).all()


def test_prefill_past_max_positions_is_finite():
  """A padded prefill may run past the position table; no NaN comes out."""
  model = _model("gpt2")
  tokens_Bx40 = _tokens(9, (B, 40))  # max_positions is 32
  logits, cache = _step(model, tokens_Bx40, model.init_cache(B, 32))
  assert np.isfinite(np.asarray(logits)).all()
  np.testing.assert_allclose(logits[:, :N], _full(model, tokens_Bx40[:, :N]),
                             **TOL)


def test_jit_does_not_retrace_for_new_weights():
  traces = []

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(model, tokens_BxT, cache):
    traces.append(1)
    return model(tokens_BxT, cache)

  tokens_BxN = _tokens(7, (B, N))
  a, b = _model("llama", seed=0), _model("llama", seed=1)
  out_a, _ = step(a, tokens_BxN[:, :3], a.init_cache(B, S))
  out_b, _ = step(b, tokens_BxN[:, :3], b.init_cache(B, S))
  assert len(traces) == 1
  assert not np.allclose(out_a, out_b)
  np.testing.assert_allclose(out_b, _full(b, tokens_BxN)[:, :3], **TOL)


def test_protocol_module_roundtrip_and_param_count():
  model = _model("gpt2")
  assert isinstance(model, CausalLM)
  assert model.vocab_size == V and model.max_positions == 32
  assert model.one_hot_q is False
  c = model.config
  d, f = c.d_model, c.mlp_dim
  per_layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
  assert model.param_count() == (V * d + c.max_positions * d + c.num_layers
                                 * per_layer + 2 * d)
  module = model.module()
  assert isinstance(module, transformer_lib.Transformer)
  tokens_BxN = _tokens(8, (B, N))
  again = TransformerLM.from_module(module)
  np.testing.assert_array_equal(_full(again, tokens_BxN),
                                _full(model, tokens_BxN))
  # The model is a differentiable pytree (training goes through it).
  grads = jax.jit(jax.grad(lambda m: m.logits(tokens_BxN).mean()))(model)
  assert jax.tree.structure(grads) == jax.tree.structure(model)
  assert all(np.abs(g).sum() > 0 for g in jax.tree.leaves(grads))


def test_config_presets_and_derived_fields():
  c = TransformerConfig.preset("byte-85m")
  assert (c.head_dim, c.mlp_dim, c.num_kv_heads, c.tie_embeddings) == (
      64, 3072, 12, True)
  assert hash(c) == hash(TransformerConfig.preset("byte-85m"))
  llama = TransformerConfig.preset("byte-85m-llama")
  assert not llama.tie_embeddings and llama.num_kv_heads == 4
  with pytest.raises(ValueError, match="num_kv_heads"):
    TransformerConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=4,
                      num_kv_heads=3)
  with pytest.raises(ValueError, match="flavour"):
    TransformerConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=4,
                      flavour="gpt3")
  with pytest.raises(ValueError, match="Unknown preset"):
    TransformerConfig.preset("nope")
  small = dict(vocab_size=V, d_model=32, num_layers=1, num_heads=4,
               flavour="llama")
  # A string is truthy: "False" would silently build biases or tie weights.
  for field in ("qkv_bias", "tie_embeddings"):
    with pytest.raises(TypeError, match=f"{field} must be a bool"):
      TransformerConfig(**small, **{field: "False"})
  for scaling in (5, "linear"):
    with pytest.raises(TypeError, match="rope_scaling must be a mapping"):
      TransformerConfig(**small, rope_scaling=scaling)
  # numpy ints are stored as Python ints (checkpoint metadata is JSON).
  c = TransformerConfig(**{**small, "vocab_size": np.int64(V),
                           "d_model": np.int32(32)}, mlp_dim=np.int64(64))
  assert all(type(getattr(c, f)) is int for f in (
      "vocab_size", "d_model", "head_dim", "mlp_dim", "num_kv_heads"))
  assert c == TransformerConfig(**small, mlp_dim=64)


def test_config_refuses_none_dtypes():
  """numpy reads None as float64: every forward then warned of truncation."""
  small = dict(vocab_size=V, d_model=32, num_layers=1, num_heads=4)
  for field in ("dtype", "param_dtype"):
    with pytest.raises(TypeError, match=f"TransformerConfig.{field} must be "
                       "a floating dtype such as 'float32'.* got None"):
      TransformerConfig(**small, **{field: None})
  assert TransformerConfig(**small, dtype="bfloat16").dtype == "bfloat16"
  # astype's None still means "unchanged".
  model = TransformerLM.create(TransformerConfig(**small), 0)
  assert model.astype(None, None) is model


def test_rope_values_that_overflow_float32_are_refused():
  """RoPE turns position p (< 2**31) by p * frequency radians in float32: a
  theta that is 0 in float32, or frequencies whose angles overflow, gave NaN
  logits. The edges of the accepted range stay finite at every position."""
  small = dict(vocab_size=V, d_model=32, num_layers=1, num_heads=4,
               flavour="llama")  # head_dim 8
  f32 = np.finfo(np.float32)
  x_BxTxNxH = jnp.ones((1, 2, 1, 8))
  far_BxT = jnp.array([[0, 2**31 - 1]], jnp.int32)
  finite = lambda theta, freq_h=None: bool(np.isfinite(
      transformer_lib._rope(x_BxTxNxH, far_BxT, theta, freq_h)).all())
  # 1e-50 passed the > 0 check, but is 0 in float32 (1e300 is inf).
  assert not finite(1e-50)
  for theta in (1e-50, 1e-39, 1e300):
    with pytest.raises(ValueError, match="rope_theta must be a normal float32"):
      TransformerConfig(**small, rope_theta=theta)
  # The smallest normal float32 is fine for head_dim 8 (frequencies up to
  # tiny ** -0.75, 2.8e28), and so is the largest.
  for theta in (float(f32.tiny), float(f32.max)):
    config = TransformerConfig(**small, rope_theta=theta)
    assert finite(theta)
    logits = TransformerLM.create(config, 0).logits(_tokens(0, (1, 8)))
    assert np.isfinite(np.asarray(logits)).all()
  # head_dim 32: frequencies theta ** (-i / 16) reach theta ** (-15 / 16).
  wide = dict(small, head_dim=32)
  x_BxTxNxH = jnp.ones((1, 2, 1, 32))
  edge = transformer_lib._MAX_ROPE_FREQUENCY ** (-16 / 15)
  assert TransformerConfig(**wide, rope_theta=edge * (1 + 1e-9))
  assert finite(edge)
  # Past float32 max / 2**31 the angle at the last int32 position is inf.
  nan_theta = (float(f32.max) / 2**31 * 1.01) ** (-16 / 15)
  assert not finite(nan_theta)
  for theta in (edge * (1 - 1e-6), nan_theta):
    with pytest.raises(ValueError, match=r"rope_theta=.* frequencies up to "
                       r".* use rope_theta >= "):
      TransformerConfig(**wide, rope_theta=theta)
  # A linear factor divides every frequency: 1e-300 made them inf.
  x_BxTxNxH = jnp.ones((1, 2, 1, 8))
  linear = lambda factor: {"rope_type": "linear", "factor": factor}
  edge = 1 / transformer_lib._MAX_ROPE_FREQUENCY
  config = TransformerConfig(**small, rope_scaling=linear(edge))
  assert finite(1e4, transformer_lib.rope_frequencies(config))
  freq_h = np.full(4, float(f32.max) / 2**31 * 1.01, np.float32)
  assert not finite(1e4, freq_h)  # what a factor of 1 / (that) would give
  for factor in (1e-300, edge / 2.02):
    with pytest.raises(ValueError, match=r"rope_theta=.* with rope_scaling="
                       ".* frequencies up to .* larger rope_theta or "
                       "rope_scaling factor"):
      TransformerConfig(**small, rope_scaling=linear(factor))
  llama3 = {"rope_type": "llama3", "factor": 1e-300, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
  with pytest.raises(ValueError, match="rope_scaling=.* frequencies up to"):
    TransformerConfig(**small, rope_scaling=llama3)


def test_create_refuses_key_arrays_and_seeds_jax_would_wrap():
  """A batch of keys failed inside jax.random.fold_in, a seed past int64 in
  jax's prng; 2**32 silently drew seed 0's weights (jax keeps a seed's low
  32 bits without x64), -1 seed 2**32 - 1's."""
  from specjax.models import eagle  # pylint: disable=g-import-not-at-top
  from specjax.testing import _x64  # pylint: disable=g-import-not-at-top
  config = TransformerConfig(vocab_size=8, d_model=16, num_layers=1,
                             num_heads=2, max_positions=32)
  model = TransformerLM.create(config, 0)
  keys = jax.random.split(jax.random.key(0), 2)
  for create in (TransformerLM.create, eagle.EagleDraft.create):
    arg = config if create == TransformerLM.create else model
    for bad in (keys, jax.random.split(jax.random.PRNGKey(0), 2)):
      with pytest.raises(ValueError, match=r"rngs must be a single PRNG key "
                         r"or an int seed, got a key array of shape \(2,\)"):
        create(arg, bad)
    for seed in (2**70, 2**64 - 1, 2**63, 2**32, -1):
      with pytest.raises(ValueError, match=r"rngs must be .* int seed in "
                         r"\[0, 2\*\*32 - 1\]"):
        create(arg, seed)
  # A key, a raw key, a seed, numpy seeds and nnx.Rngs all still work.
  same = [TransformerLM.create(config, r) for r in (
      jax.random.key(3), jax.random.PRNGKey(3), 3, np.uint64(3),
      nnx.Rngs(3))]
  for other in same[1:]:
    chex.assert_trees_all_equal(other.state, same[0].state)
  TransformerLM.create(config, 2**32 - 1)
  eagle.EagleDraft.create(model, keys[1])
  with _x64():  # 64-bit seeds are kept whole
    TransformerLM.create(config, 2**40)
    with pytest.raises(ValueError, match=r"seed in \[0, 2\*\*63 - 1\]"):
      TransformerLM.create(config, 2**63)


@pytest.mark.parametrize("flavour", [
    "gpt2", pytest.param("llama", marks=pytest.mark.full)])
def test_logits_at_equals_the_call_at_those_tokens(flavour):
  """`logits_at` runs the last block's queries and MLP, the final norm and
  the head at the chosen new tokens alone: the same logits there as
  `__call__`, on a cache holding ragged rows, and the same cache."""
  model = _model(flavour)
  tokens_BxN = _tokens(4, (B, N))
  _, cache = _step(model, tokens_BxN[:, :3], model.init_cache(B, S))
  cache = cache.replace(lengths=jnp.array([3, 1], jnp.int32))
  new_BxT = tokens_BxN[:, 3:9]
  want_BxTxV, want_cache = _step(model, new_BxT, cache)
  # Repeats and any order; an index past the new tokens is clipped.
  at_BxQ = jnp.array([[5, 0, 2], [1, 1, 9]], jnp.int32)
  got_BxQxV, got_cache = jax.jit(
      lambda m, t, c, a: m.logits_at(t, c, a))(model, new_BxT, cache, at_BxQ)
  np.testing.assert_allclose(
      got_BxQxV, jnp.take_along_axis(want_BxTxV,
                                     jnp.minimum(at_BxQ, 5)[..., None], 1),
      **TOL)
  chex.assert_trees_all_close(got_cache, want_cache, **TOL)
  # `features` is the same pass up to the head, at every token or at some.
  hidden_BxTxD, feature_cache = model.features(new_BxT, cache)
  np.testing.assert_allclose(model.head_logits(hidden_BxTxD), want_BxTxV,
                             **TOL)
  chex.assert_trees_all_close(feature_cache, want_cache, **TOL)
  hidden_BxQxD, _ = model.features(new_BxT, cache, at_BxQ)
  np.testing.assert_allclose(model.head_logits(hidden_BxQxD), got_BxQxV,
                             **TOL)
  with pytest.raises(TypeError, match="at_BxQ"):
    model.logits_at(new_BxT, cache, jnp.zeros((B, 2), jnp.float32))
  with pytest.raises(TypeError, match="at_BxQ .* got None"):
    model.logits_at(new_BxT, cache, None)
  with pytest.raises(ValueError, match="at_BxQ has 3 rows"):
    model.logits_at(new_BxT, cache, jnp.zeros((3, 2), jnp.int32))


def test_input_validation_names_the_argument():
  model = _model("gpt2")
  cache = model.init_cache(2, 8)
  with pytest.raises(TypeError, match="tokens_BxT"):
    model(jnp.zeros((2, 3), jnp.float32), cache)
  with pytest.raises(ValueError, match="tokens_BxT"):
    model(jnp.zeros((3,), jnp.int32), cache)
  with pytest.raises(ValueError, match="tokens_BxT"):
    model(jnp.zeros((2, 0), jnp.int32), cache)
  with pytest.raises(ValueError, match="batch sizes"):
    model(jnp.zeros((3, 1), jnp.int32), cache)
  with pytest.raises(TypeError, match="cache"):
    model(jnp.zeros((2, 1), jnp.int32), {"lengths": cache.lengths})
  with pytest.raises(ValueError, match="max_len"):
    model.init_cache(1, 33)
  with pytest.raises(ValueError, match="max_positions"):
    model.logits(jnp.zeros((1, 33), jnp.int32))
  with pytest.raises(ValueError, match="at least one row"):
    model.logits(jnp.zeros((0, 3), jnp.int32))
  # Eager calls: an id past the table gave NaN logits, -1 another token's.
  for bad in (-1, model.vocab_size):
    with pytest.raises(ValueError, match=r"tokens_BxT\[0, 1\] = .* outside"):
      model.logits(jnp.array([[1, bad]], jnp.int32))
  with pytest.raises(ValueError, match="KVCache.create batch_size"):
    KVCache.create(num_layers=1, batch_size=-1, max_len=4, num_kv_heads=1,
                   head_dim=4)
  # Lengths are data, so only the caller-side helper can check they fit.
  model.check_inputs(jnp.zeros((2, 3), jnp.int32),
                     cache.replace(lengths=jnp.array([5, 0], jnp.int32)))
  with pytest.raises(ValueError, match="tokens_BxT: row 0"):
    model.check_inputs(jnp.zeros((2, 3), jnp.int32),
                       cache.replace(lengths=jnp.array([6, 0], jnp.int32)))
  for bad in (V, -1):  # NaN logits, or silently another token's
    with pytest.raises(ValueError, match=r"tokens_BxT\[1, 2\] .* outside"):
      model.check_inputs(jnp.zeros((2, 3), jnp.int32).at[1, 2].set(bad), cache)
  # An eager call checks the same values itself (an audit got NaN logits,
  # another token's, and a cache with lengths past max_len); jitted calls
  # cannot read them (test_writes_beyond_max_len_are_dropped).
  for bad in (V, -1):
    with pytest.raises(ValueError, match=r"tokens_BxT\[1, 2\] .* outside"):
      model(jnp.zeros((2, 3), jnp.int32).at[1, 2].set(bad), cache)
  with pytest.raises(ValueError, match="tokens_BxT: row 0"):
    model(jnp.zeros((2, 3), jnp.int32),
          cache.replace(lengths=jnp.array([6, 0], jnp.int32)))
  lookup = PromptLookupDraft(V, max_ngram=2)
  with pytest.raises(ValueError, match=r"tokens\[0, 1\] = -1 is outside"):
    lookup(jnp.array([[1, -1]], jnp.int32), lookup.init_cache(1, 4))


def test_kv_cache_layout():
  model = _model("llama")
  cache = model.init_cache(3, 8)
  assert isinstance(cache, KVCache)
  c = model.config
  assert cache.num_layers == len(cache.v) == c.num_layers
  assert cache.max_len == 8 and cache.batch_size == 3
  for x in cache.k + cache.v:
    assert x.shape == (3, c.num_kv_heads, 8, c.head_dim)
    assert x.dtype == jnp.float32
  assert cache.lengths.dtype == jnp.int32
  np.testing.assert_array_equal(cache.lengths, [0, 0, 0])
  positions_BxT = jnp.array([[1, 2], [0, 1], [7, 8]], jnp.int32)
  mask_BxTxS = cache.attention_mask(positions_BxT)
  np.testing.assert_array_equal(mask_BxTxS.sum(-1), [[2, 3], [1, 2], [8, 8]])
