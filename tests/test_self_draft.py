"""SelfDraft: the target's own shallow layers as a draft, with and without a shared cache.

Also with an exit adapter (exit_adapter.py): the adapter variants join the
whole-generation exactness tests; its own checks are in
tests/test_exit_adapter.py. So do draft trees (`verifier="tree:..."`), on
either cache.

Checks: the weights are shared, not copied; the draft's forward equals the
kept blocks' forward; a shared-cache draft reads exactly the keys/values an
own-cache draft computes; whole generations are exact (statistical
harness), and a deliberately broken cache-sharing hook fails the same test;
bad input gets a clear error. Greedy speculative output equals greedy
autoregressive output for every variant, with and without trees, in
tests/test_greedy.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import testing
from specjax.models import TransformerConfig, TransformerLM
from specjax.models.exit_adapter import ExitAdapter
from specjax.models.self_draft import SelfDraft

V = 16


def _target(flavour="gpt2", layers=3, vocab=V, seed=0, embed_scale=1.0):
  # embed_scale > 1: peaked, distinct p and q, so that wrong samplers are
  # visible.
  return testing.toy_transformer(
      vocab, seed, flavour=flavour, d_model=32, num_layers=layers,
      num_heads=4, num_kv_heads=2 if flavour == "llama" else None,
      max_positions=64, embed_scale=embed_scale)


# The Llama flavour's blocks (GQA, RMSNorm, RoPE) are the Transformer's own,
# tested in the fast tier in tests/test_transformer.py; as a self-draft's
# target they are in the full tier.
@pytest.fixture(scope="module", params=[
    "gpt2", pytest.param("llama", marks=pytest.mark.full)])
def target(request):
  return _target(request.param)


def perturbed_adapter(target, layers, seed=0, scale=0.5):
  """An untrained adapter that is NOT the identity (random output matrix)."""
  adapter = ExitAdapter.create(target, layers)
  key = jax.random.key(seed)

  def perturb(path, x):
    if "down" in jax.tree_util.keystr(path) and x.ndim == 2:
      return scale * jax.random.normal(key, x.shape, x.dtype)
    return x
  return adapter.replace(state=jax.tree_util.tree_map_with_path(
      perturb, adapter.state))


def _prompts(batch, seed=0, max_len=10):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch).astype(np.int32)
  return rng.integers(0, V, size=(batch, max_len)).astype(np.int32), lengths


def test_weights_are_shared_not_copied(target):
  draft = SelfDraft(target, layers=2)
  for a, b in zip(jax.tree.leaves(draft), jax.tree.leaves(target)):
    assert a is b
  assert draft.layers == (0, 1) and draft.vocab_size == V
  assert draft.param_count() < target.param_count()
  assert SelfDraft(target, layers=3).param_count() == target.param_count()


def test_all_layers_reproduce_the_target(target):
  tokens = jnp.asarray(_prompts(2)[0])
  draft = SelfDraft(target, layers=target.config.num_layers)
  got, _ = draft(tokens, draft.init_cache(2, 16))
  want, _ = target(tokens, target.init_cache(2, 16))
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_skip_set_equals_explicit_layers(target):
  tokens = jnp.asarray(_prompts(2)[0])
  a = SelfDraft.skipping(target, skip=[1])
  b = SelfDraft(target, layers=(0, 2))
  assert a.layers == b.layers == (0, 2)
  np.testing.assert_array_equal(a(tokens, a.init_cache(2, 16))[0],
                                b(tokens, b.init_cache(2, 16))[0])


def test_shared_cache_holds_the_drafts_own_keys_and_values(target):
  """The claim that makes sharing exact: after the target's prefill, the
  first k layers of its cache are what the k-layer draft would compute."""
  prompts, lengths = _prompts(3, seed=4)
  tokens = jnp.asarray(prompts)
  own = SelfDraft(target, layers=2)
  shared = SelfDraft(target, layers=2, share_cache=True)
  _, tcache = target(tokens, target.init_cache(3, 24))
  _, dcache = own(tokens, own.init_cache(3, 24))
  view = shared.cache_from_target(tcache)
  for a, b in zip(view.k + view.v, dcache.k + dcache.v):
    np.testing.assert_allclose(a[:, :, :10], b[:, :, :10], atol=1e-5)
  # Next-token logits from the shared view and from the own cache agree.
  last = jnp.asarray(prompts[np.arange(3), lengths - 1])[:, None]
  roll = jnp.asarray(lengths - 1)
  got, view2 = shared(last, view.replace(lengths=roll))
  want, _ = own(last, dcache.replace(lengths=roll))
  np.testing.assert_allclose(got, want, atol=1e-5)
  # Handing the layers back keeps the target's lengths and deeper layers.
  back = shared.cache_to_target(tcache, view2)
  np.testing.assert_array_equal(back.lengths, tcache.lengths)
  assert back.k[2] is tcache.k[2]


@pytest.mark.parametrize("layers", [0, 2])
def test_logits_at_equals_the_call_at_those_tokens(target, layers):
  """`logits_at` is the call's logits at the chosen tokens, with its cache;
  with no kept block, the embeddings themselves are picked."""
  draft = SelfDraft(target, layers=layers)
  tokens = jnp.asarray(_prompts(2)[0])
  at_BxQ = jnp.asarray([[9, 2], [0, 0]], jnp.int32)
  want, want_cache = draft(tokens, draft.init_cache(2, 16))
  got, got_cache = draft.logits_at(tokens, draft.init_cache(2, 16), at_BxQ)
  np.testing.assert_allclose(
      got, np.take_along_axis(np.asarray(want), np.asarray(at_BxQ)[..., None],
                              1), atol=1e-5)
  for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_cache_of_no_layers_moves_nothing(target):
  cache = SelfDraft(target, layers=0).init_cache(2, 16)
  slots_BxK = jnp.zeros((2, 3), jnp.int32)
  assert cache.move(slots_BxK, slots_BxK + 1) is cache


def test_all_layers_shared_accepts_everything(target):
  prompts, lengths = _prompts(4)
  draft = SelfDraft(target, layers=target.config.num_layers, share_cache=True)
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(1), gamma=4, max_new_tokens=25,
                                sampling=sj.SamplingConfig(temperature=1.0))
  s = out.summary()
  # q is the target's own p up to float rounding (T = 1 vs T = 5 matmuls).
  assert s["one_minus_tv"] == pytest.approx(1.0, abs=1e-4)
  assert s["alpha_hat"] > 0.99, s


@pytest.mark.full
def test_all_layers_shared_tree_accepts_everything():
  """At every node of a tree, the draft's tree pass on the target's cache
  gives the target's own p."""
  target = _target("llama")
  prompts, lengths = _prompts(4)
  draft = SelfDraft(target, layers=target.config.num_layers, share_cache=True)
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(1), max_new_tokens=25,
                                verifier="tree:2,1",
                                sampling=sj.SamplingConfig(temperature=1.0))
  s = out.summary()
  assert s["one_minus_tv"] == pytest.approx(1.0, abs=1e-4)
  assert s["alpha_hat"] > 0.99, s


# ---- Whole-generation exactness (the harness of tests/test_exactness.py).

EV, EK, EN = 8, 3, 100_000
EPROMPT = np.array([1, 2, 3], np.int32)


@pytest.fixture(scope="module")
def exact_target():
  model = _target("llama", layers=2, vocab=EV, seed=5, embed_scale=6.0)

  def scale(path, x):
    # A peaked head and a last block that matters, so that the 1-layer draft
    # differs from the target (1 - TV about 0.8).
    name = jax.tree_util.keystr(path)
    if "lm_head" in name:
      return 20.0 * x
    if "blocks" in name and "[1]" in name and ("out" in name or "down" in name):
      return 10.0 * x
    return x
  return model.replace(state=jax.tree_util.tree_map_with_path(scale,
                                                              model.state))


def _sample(target, draft, sampling, gamma, verifier="token"):
  """(tokens, summary) of EN generations; gamma None: the tree verifier's
  depth."""
  out = sj.speculative_generate(
      target, draft, np.tile(EPROMPT, (EN, 1)), np.full(EN, 3, np.int32),
      jax.random.key(gamma or 0), gamma=gamma, max_new_tokens=EK,
      sampling=sampling, verifier=verifier)
  return out.tokens, out.summary()


class _EarlyViewSelfDraft(SelfDraft):
  """Negative control: a cache-sharing hook off by one position.

  Its view of the target's cache starts one slot early, so the draft
  overwrites the target's committed keys/values of the second-to-last token
  in the shared layers. Every draft is exact; a cache-sharing bug is not.
  """

  def cache_from_target(self, target_cache):
    view = super().cache_from_target(target_cache)
    return view.replace(lengths=jnp.maximum(view.lengths - 1, 0))


@pytest.mark.big_batch
@pytest.mark.optimized
@pytest.mark.parametrize("layers, share, adapter, verifier", [
    pytest.param(1, False, False, "token", marks=pytest.mark.slow),
    pytest.param(1, True, False, "token", marks=pytest.mark.slow),
    # The full tier's cases: sharing and an adapter together (each alone is
    # in the slow cases, and in tests/test_greedy.py), and a tree drafted on the
    # target's cache (on the draft's own cache it is any draft's tree). The
    # fast tier's self-drafts are tests/test_exactness.py's.
    pytest.param(1, True, True, "token", marks=pytest.mark.full),
    pytest.param(1, True, False, "tree:2,1", marks=pytest.mark.full),
    # A skip set (SelfDraft.skipping(target, skip=[0])): blocks that are
    # not a prefix, so the draft keeps a cache of its own. The perturbed
    # adapter keeps it far from the target (block 1 alone has 1 - TV .96).
    pytest.param((1,), False, True, "token", marks=pytest.mark.full),
    # No blocks at all: embedding, final norm and head (a bigram of the
    # target's own weights), on a shared cache of no layers.
    pytest.param(0, True, False, "token", marks=pytest.mark.full),
    pytest.param(1, False, False, "tree-wor:2,1", marks=pytest.mark.slow)])
def test_generations_are_exact(exact_target, layers, share, adapter,
                               verifier):
  sampling = sj.SamplingConfig(temperature=1.0)
  draft = SelfDraft(exact_target, layers=layers, share_cache=share,
                    adapter=(perturbed_adapter(exact_target, layers, scale=2.0)
                             if adapter else None))
  tree = verifier != "token"
  tokens, s = _sample(exact_target, draft, sampling,
                      gamma=None if tree else 2, verifier=verifier)
  result = testing.check_generation(tokens, exact_target, EPROMPT, sampling)
  assert result.passed, str(result)
  # Far enough from the target that the control below has room to fail.
  assert s["one_minus_tv"] < 0.9, s


@pytest.mark.big_batch
@pytest.mark.optimized
@pytest.mark.parametrize("verifier", [
    "token", pytest.param("tree:2,1", marks=pytest.mark.slow)])
@pytest.mark.full
def test_broken_cache_sharing_is_rejected(exact_target, verifier):
  sampling = sj.SamplingConfig(temperature=1.0)
  draft = _EarlyViewSelfDraft(exact_target, layers=1, share_cache=True)
  tree = verifier != "token"
  tokens, _ = _sample(exact_target, draft, sampling,
                      gamma=None if tree else 2, verifier=verifier)
  result = testing.check_generation(tokens, exact_target, EPROMPT, sampling)
  assert not result.passed, str(result)


# ---- Bad input.

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(layers=4), ValueError, "layers"),
    (dict(layers=-1), ValueError, "layers"),
    (dict(layers=True), TypeError, "layers"),
    (dict(layers=(2, 1)), ValueError, "increasing"),
    (dict(layers=(0, 0)), ValueError, "increasing"),
    (dict(layers=(0, 3)), ValueError, "layers"),
    (dict(layers=(0, 1.5)), TypeError, "layers"),
    (dict(layers=1.0), TypeError, "SelfDraft layers must be an int k"),
    (dict(layers=(0, 2), share_cache=True), ValueError, "share_cache"),
    (dict(layers=1, share_cache="yes"), TypeError, "share_cache"),
])
def test_bad_construction_gets_clear_error(target, kwargs, error, match):
  with pytest.raises(error, match=match):
    SelfDraft(target, **kwargs)


def test_bad_target_and_cache_get_clear_errors(target):
  with pytest.raises(TypeError, match="TransformerLM"):
    SelfDraft(sj.NGramLM.fit(np.arange(50) % V, V, order=1), layers=1)
  with pytest.raises(ValueError, match="layers"):
    SelfDraft.skipping(target, skip=[7])
  with pytest.raises(TypeError, match="sequence of block indices"):
    SelfDraft.skipping(target, skip=1)
  draft = SelfDraft(target, layers=2)
  with pytest.raises(ValueError, match="2 layers"):
    draft(jnp.zeros((1, 1), jnp.int32), target.init_cache(1, 8))
  with pytest.raises(ValueError, match="cache does not fit"):
    draft(jnp.zeros((2, 1), jnp.int32), draft.init_cache(3, 8))
  with pytest.raises(ValueError, match="cache does not fit"):
    draft.logits_at(jnp.zeros((1, 1), jnp.int32),
                    SelfDraft(TransformerLM.create(TransformerConfig(
                        vocab_size=V, d_model=16, num_layers=2, num_heads=4,
                        max_positions=64), 0), layers=2).init_cache(1, 8),
                    jnp.zeros((1, 1), jnp.int32))
  with pytest.raises(ValueError, match="max_len"):
    draft.init_cache(1, 10_000)


def test_shared_cache_needs_its_own_target(target):
  other = _target("gpt2", layers=2)
  draft = SelfDraft(other, layers=1, share_cache=True)
  prompts, lengths = _prompts(2)
  with pytest.raises(ValueError, match="share_cache"):
    sj.speculative_generate(target, draft, prompts, lengths, jax.random.key(0),
                            gamma=2, max_new_tokens=4)
  # Without sharing, any same-vocabulary model is a valid (exact) draft.
  sj.speculative_generate(target, SelfDraft(other, layers=1), prompts,
                          lengths, jax.random.key(0), gamma=2,
                          max_new_tokens=4)
