"""EagleDraft: a feature-level head drafting from the target's hidden states.

Checks: the target's features are what its LM head reads; the head shares
the target's arrays; its cached, teacher-forced and own-feature forwards
agree; it sees token order; training reads the pairs drafting reads; the
decode loop feeds it exactly the features a from-scratch reference computes
(acceptance counts match a Python re-enactment, in a chain and in a tree
of one child per node), and a tree level's logits equal the head's chain
along each root-to-node path; training lowers the loss and restores
bitwise; bad input gets a clear error. Greedy speculative output equals
greedy autoregressive output (ragged prompts, length 1, EOS, an adaptive
draft length) in tests/test_greedy.py; whole-generation exactness in
tests/test_exactness.py (`eagle` in `_draft_kinds`, and in
`test_tree_generations_are_exact`).
"""

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import data
from specjax import testing
from specjax.models import TransformerConfig, TransformerLM
from specjax.models import eagle
from specjax.train import checkpoint as checkpoint_lib
from specjax.train import eagle as eagle_train
from specjax.train import trainer

V = 16


def _target(flavour="gpt2", vocab=V, d_model=32, seed=0, scale=1.0):
  # scale > 1: peaked laws, so that argmaxes are far from ties.
  return testing.toy_transformer(
      vocab, seed, flavour=flavour, embed_scale=scale, d_model=d_model,
      num_layers=2, num_heads=4,
      num_kv_heads=2 if flavour == "llama" else None, max_positions=64)


# The head on a Llama-flavoured target in the full tier (the flavour's
# blocks are tested in the fast tier in tests/test_transformer.py).
@pytest.fixture(scope="module", params=[
    "gpt2", pytest.param("llama", marks=pytest.mark.full)])
def target(request):
  return _target(request.param)


def _prompts(batch, seed=0, max_len=10, vocab=V):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch).astype(np.int32)
  lengths[0] = 1  # a one-token prompt has no target feature to pair with
  return rng.integers(0, vocab, size=(batch, max_len)).astype(np.int32), lengths


def test_features_are_what_the_head_reads(target):
  tokens = jnp.asarray(_prompts(2)[0])
  logits, _ = target(tokens, target.init_cache(2, 16))
  logits2, hidden, cache = target.forward_with_hidden(
      tokens, target.init_cache(2, 16))
  assert hidden.shape == (2, 10, 32)
  np.testing.assert_array_equal(logits2, logits)
  np.testing.assert_allclose(target.head_logits(hidden), logits, atol=1e-5)
  np.testing.assert_array_equal(cache.lengths, [10, 10])


def test_head_shares_the_target_arrays(target):
  draft = sj.EagleDraft.create(target, 1)
  for a, b in zip(jax.tree.leaves(draft.target), jax.tree.leaves(target)):
    assert a is b
  d = 32
  mlp = target.config.mlp_dim
  fc = 2 * d * d + (d if target.config.flavour == "gpt2" else 0)
  assert draft.param_count() == draft.head.param_count()
  assert draft.param_count() > fc + mlp * d  # fc + block, no embedding/head
  assert draft.param_count() < target.param_count()


def test_cached_and_own_feature_forwards_agree(target):
  draft = sj.EagleDraft.create(target, 1)
  tokens = jnp.asarray(_prompts(2, seed=3)[0])
  features = jax.random.normal(jax.random.key(0), (2, 10, 32))
  # Teacher forced in one call == one pair at a time.
  want, want_f, _ = draft.from_features(features, tokens,
                                        draft.init_cache(2, 16))
  cache = draft.init_cache(2, 16)
  for t in range(10):
    got, got_f, cache = draft.from_features(features[:, t:t + 1],
                                            tokens[:, t:t + 1], cache)
    np.testing.assert_allclose(got[:, 0], want[:, t], atol=1e-5)
  np.testing.assert_allclose(cache.feature, want_f[:, -1], atol=1e-5)
  # __call__ pairs each token with the previous prediction.
  own, own_cache = draft(tokens[:, :3], draft.init_cache(2, 16))
  cache, f = draft.init_cache(2, 16), jnp.zeros((2, 1, 32))
  for t in range(3):
    step, f, cache = draft.from_features(f, tokens[:, t:t + 1], cache)
    np.testing.assert_allclose(own[:, t], step[:, 0], atol=1e-5)
  np.testing.assert_array_equal(own_cache.lengths, [3, 3])


def test_head_sees_token_order(target):
  """Pairs a, b, b and b, a, b get different predictions at the last one.

  Without positions the head's attention sees the same set of pairs in both.
  A 'gpt2' target has no RoPE, so there the order comes from the target's
  position embedding in the head's input.
  """
  draft = sj.EagleDraft.create(target, 1)
  # Sharper attention than an untrained head's nearly uniform one, so that
  # the order signal shows well above float rounding (not one-hot: a head
  # attending only to itself would ignore the others in either order).
  head = draft.head.replace(state=jax.tree_util.tree_map_with_path(
      lambda path, x: 6 * x if "query" in jax.tree_util.keystr(path)
      or "key" in jax.tree_util.keystr(path) else x, draft.head.state))
  draft = draft.replace(head=head)
  a, b = jnp.ones(32), -jnp.ones(32)
  features = jnp.stack([jnp.stack([a, b, b]), jnp.stack([b, a, b])])
  tokens = jnp.asarray([[3, 5, 5], [5, 3, 5]], jnp.int32)
  _, predicted, _ = draft.from_features(features, tokens,
                                        draft.init_cache(2, 8))
  assert np.abs(predicted[0, -1] - predicted[1, -1]).max() > 1e-5


def test_training_reads_the_pairs_drafting_reads(target):
  """The loss's KL is the KL of what `from_features` drafts on the same text."""
  tokens = jnp.asarray(_prompts(2, seed=4, max_len=11)[0])
  inputs = tokens[:, :-1]
  draft = sj.EagleDraft.create(target, 5)
  _, metrics = eagle_train.eagle_loss(feature_weight=0.0)(
      draft.head.module(), {"tokens": tokens}, jax.random.key(0), target)
  logits_p, hidden, _ = target.forward_with_hidden(inputs,
                                                   target.init_cache(2, 16))
  logits_q, _, _ = draft.from_features(eagle.shift_features(hidden), inputs,
                                       draft.init_cache(2, 16))
  log_p = jax.nn.log_softmax(logits_p)
  kl = (jnp.exp(log_p) * (log_p - jax.nn.log_softmax(logits_q))).sum(-1)
  np.testing.assert_allclose(metrics["kl"], kl.mean(), rtol=1e-4)
  # With TV in the KL's place, the loss is the TV metric (KL still reported).
  loss, tv_metrics = eagle_train.eagle_loss(feature_weight=0.0,
                                            divergence="tv")(
      draft.head.module(), {"tokens": tokens}, jax.random.key(0), target)
  np.testing.assert_allclose(loss, tv_metrics["tv"], rtol=1e-6)
  np.testing.assert_allclose(tv_metrics["kl"], metrics["kl"], rtol=1e-6)
  with pytest.raises(ValueError, match="divergence must be one of"):
    eagle_train.eagle_loss(divergence="kl")
  # 1e-38 passed a > 0 check, and training stopped at a NaN loss whose
  # message blamed the learning rate; distillation_loss refused it.
  for t in (1e-38, 0.0, 1e38):
    with pytest.raises(ValueError, match="temperature"):
      eagle_train.eagle_loss(temperature=t)


def test_loss_masks_the_byte_pad_only_in_the_byte_vocabulary():
  """Id 258 is the byte tokenizer's PAD, but a real token of a 300-token
  vocabulary: text of it must still be trained on."""
  target = _target(vocab=300)
  draft = sj.EagleDraft.create(target, 5)
  tokens = jnp.asarray([[5, 258, 258, 258, 258]], jnp.int32)
  loss, _ = eagle_train.eagle_loss()(draft.head.module(), {"tokens": tokens},
                                     jax.random.key(0), target)
  assert float(loss) > 0.1
  # An id off the vocabulary embeds as NaN; one past max_positions clamps.
  for bad, match in (([[5, 300, 2]], "outside the target.s vocabulary"),
                     (np.zeros((1, 99), np.int32), "max_positions")):
    with pytest.raises(ValueError, match=match):
      eagle_train.eagle_loss()(draft.head.module(),
                               {"tokens": jnp.asarray(bad, jnp.int32)},
                               jax.random.key(0), target)


def _reference_accepted(target, draft, prompts, lengths, gamma, max_new):
  """Greedy rounds re-enacted from scratch for every row: accepted drafts.

  Each round's drafts come from full teacher-forced passes of the head over
  the committed text (the target's features of it) followed by steps on the
  head's own features: no window bookkeeping, no carried cache.
  """
  full = np.asarray(sj.generate(target, prompts, lengths, jax.random.key(0),
                                max_new_tokens=max_new + gamma + 1,
                                sampling=sj.GREEDY).tokens)
  width = prompts.shape[1] + max_new + gamma + 1

  @jax.jit
  def drafts(seq_W, n):
    _, hidden, _ = target.forward_with_hidden(
        seq_W[None], target.init_cache(1, width))
    features = eagle.shift_features(hidden)
    logits, predicted, cache = draft.from_features(
        features, seq_W[None], draft.init_cache(1, width))
    cache = cache.replace(lengths=n[None],
                          feature=predicted[:, n - 1])
    x = jnp.argmax(logits[0, n - 1]).astype(jnp.int32)
    out = [x]
    for _ in range(gamma - 1):
      step, cache = draft(x[None, None], cache)
      x = jnp.argmax(step[0, 0]).astype(jnp.int32)
      out.append(x)
    return jnp.stack(out)

  accepted = []
  for b in range(len(lengths)):
    seq = np.zeros(width, np.int32)
    p = int(lengths[b])
    seq[:p] = prompts[b, :p]
    seq[p:p + full.shape[1]] = full[b]
    n, total = p, 0
    while n - p < max_new:
      x = np.asarray(drafts(jnp.asarray(seq), jnp.int32(n)))
      a = 0
      while a < gamma and x[a] == seq[n + a]:
        a += 1
      total += a
      n += a + 1
    accepted.append(total)
  return np.array(accepted)


@pytest.mark.full
def test_loop_feeds_the_head_the_right_features():
  """Off-by-one windows would only lower alpha silently; here they fail.

  A V = 2 target with peaked laws makes the untrained head's drafts accepted
  often enough (and rejected often enough) to pin every round down.
  """
  target = _target("gpt2", vocab=2, scale=6.0, seed=1)
  draft = sj.EagleDraft.create(target, 3)
  prompts, lengths = _prompts(6, seed=5, vocab=2)
  gamma, max_new = 3, 16
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(0), gamma=gamma,
                                max_new_tokens=max_new, sampling=sj.GREEDY)
  want = _reference_accepted(target, draft, prompts, lengths, gamma, max_new)
  got = np.asarray(out.stats.accepted)
  assert want.sum() > 10 and (np.asarray(out.stats.verified) > got).any()
  np.testing.assert_array_equal(got, want)


@pytest.mark.full
def test_a_tree_level_is_the_heads_chain_along_each_path():
  """`tree_from_features` at every node equals the head drafting along the
  node's root-to-node path one token at a time (`__call__`, on its own
  features): each node pairs with its parent's predicted feature, attends
  to its ancestors and sits at position root + depth."""
  from specjax.decode import tree as tree_lib
  target = _target("llama")  # positions by RoPE (gpt2's: test_exactness)
  topo = tree_lib.TreeTopology((-1, -1, 0, 0, 1, 2))
  depth_T, ancestor_TxT = topo.depth_with_root(), topo.ancestor_table()
  draft = sj.EagleDraft.create(target, 5)
  rng = np.random.default_rng(2)
  prompts = jnp.asarray(rng.integers(0, V, (2, 6)), jnp.int32)
  nodes_BxN = jnp.asarray(rng.integers(0, V, (2, topo.num_nodes)), jnp.int32)
  _, hidden, _ = target.forward_with_hidden(prompts, target.init_cache(2, 32))
  # The committed prefix read from the target's features; the root (the
  # last prompt token) predicts f_root.
  _, predicted, cache = draft.from_features(
      eagle.shift_features(hidden), prompts, draft.init_cache(2, 32))
  del predicted  # the cache holds f_root, the last prediction
  root_cache = cache
  levels = jax.jit(lambda d, c, x: _levels(d, c, x, topo))
  logits_BxNxV = levels(draft, root_cache, nodes_BxN)
  for node in range(topo.num_nodes):
    path = np.flatnonzero(ancestor_TxT[node + 1])[1:] - 1  # nodes, in order
    want, _ = jax.jit(lambda d, c, x: d(x, c))(draft, root_cache,
                                              nodes_BxN[:, path])
    np.testing.assert_allclose(logits_BxNxV[:, node], want[:, -1], atol=2e-4,
                               err_msg=f"node {node}")
  level = dict(depth_T=depth_T, ancestor_TxT=ancestor_TxT)
  with pytest.raises(ValueError, match="pass nodes"):
    draft.tree_from_features(jnp.zeros((2, 6, 32)), nodes_BxN, root_cache,
                             nodes=None, **level)
  with pytest.raises(ValueError, match="one parent feature per node"):
    draft.tree_from_features(jnp.zeros((2, 1, 32)), nodes_BxN[:, :2],
                             root_cache, nodes=(1, 2), **level)


def _levels(draft, cache, nodes_BxN, topo):
  """Every node's logits, fed level by level as the tree round feeds them."""
  depth_T, ancestor_TxT = topo.depth_with_root(), topo.ancestor_table()
  cache = cache.replace(lengths=cache.lengths - 1)  # the tree starts at root
  f_BxN1xD = jnp.zeros((2, topo.num_nodes + 1, cache.feature.shape[-1]),
                       cache.feature.dtype).at[:, 0].set(cache.feature)
  out = [None] * topo.num_nodes
  for d in range(1, topo.max_depth + 1):
    nodes = np.array([u for u in range(topo.num_nodes)
                      if topo.depth[u] == d])
    parents = np.array([topo.parents[u] for u in nodes])
    logits, f, cache = draft.tree_from_features(
        f_BxN1xD[:, parents + 1], nodes_BxN[:, nodes], cache, depth_T,
        ancestor_TxT, nodes=tuple(int(u) + 1 for u in nodes))
    f_BxN1xD = f_BxN1xD.at[:, nodes + 1].set(f)
    for j, u in enumerate(nodes):
      out[u] = logits[:, j]
  return jnp.stack(out, axis=1)


@pytest.mark.full
def test_a_chain_tree_feeds_the_head_as_the_chain_does():
  """A tree of one child per node is the chain: its greedy rounds keep what
  the re-enacted chain keeps, which pins down the level-0 window and the
  target's features along the kept path, and greedy output is unchanged."""
  target = _target("gpt2", vocab=2, scale=6.0, seed=1)
  draft = sj.EagleDraft.create(target, 3)
  prompts, lengths = _prompts(6, seed=5, vocab=2)
  max_new = 16
  kwargs = dict(max_new_tokens=max_new, sampling=sj.GREEDY)
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(0), verifier="tree:1,1,1",
                                **kwargs)
  ref = sj.generate(target, prompts, lengths, jax.random.key(0), **kwargs)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  want = _reference_accepted(target, draft, prompts, lengths, 3, max_new)
  assert want.sum() > 10
  np.testing.assert_array_equal(np.asarray(out.stats.accepted), want)


@pytest.mark.full
def test_training_lowers_the_loss_and_restores(tmp_path):
  target = TransformerLM.create(TransformerConfig(
      vocab_size=259, d_model=16, num_layers=1, num_heads=2,
      max_positions=32), 0)
  text = tmp_path / "text"
  text.mkdir()
  (text / "a.txt").write_text("the quick brown fox jumps over the dog. " * 40)
  config = eagle_train.train_config(target.config, mlp_dim=32)
  config.update(num_steps=6, batch_size=4, seq_len=16, progress=False,
                log_every=3)
  config.optim.warmup_steps = 1
  config.optim.lr = 1e-2
  corpus = data.text_corpus(str(text), heldout_fraction=0.0)
  draft, metrics = eagle_train.train_head(target, config, str(tmp_path / "w"),
                                          corpus=corpus)
  loss = metrics["train_loss"]
  assert loss[-2:].mean() < loss[:2].mean(), loss
  restored, meta = eagle_train.load_head(str(tmp_path / "w"), target)
  assert meta["extra"]["kind"] == "eagle-head"
  assert (checkpoint_lib.tree_checksum(restored.head)
          == checkpoint_lib.tree_checksum(draft.head))
  # A head, not a Transformer: the restore said the files were corrupt and
  # to delete the checkpoint; a head's loader refuses a Transformer.
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"holds an eagle-head(.|\n)*load_head"):
    checkpoint_lib.load_model(str(tmp_path / "w"))
  transformer_meta = {"model_config": dataclasses.asdict(target.config)}
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"holds a transformer(.|\n)*load_model"):
    checkpoint_lib.check_stored_kind(transformer_meta, "eagle-head", "dir")
  with pytest.raises(ValueError, match="d_model"):
    eagle_train.load_head(str(tmp_path / "w"), _target(vocab=259))
  # Same width and vocabulary, another architecture.
  with pytest.raises(ValueError, match="another target(.|\n)*flavour"):
    eagle_train.load_head(str(tmp_path / "w"), TransformerLM.create(
        dataclasses.replace(target.config, flavour="llama"), 0))
  # Same width, vocabulary and flavour, another depth or MLP width: the
  # head's one-block config cannot tell, the checkpoint's record can.
  for field, value in (("num_layers", 2), ("mlp_dim", 48)):
    with pytest.raises(ValueError, match=f"another target(.|\n)*{field}"):
      eagle_train.load_head(str(tmp_path / "w"), TransformerLM.create(
          dataclasses.replace(target.config, **{field: value}), 0))
  cast, _ = eagle_train.load_head(str(tmp_path / "w"),
                                  target.astype("bfloat16"))
  assert cast.head.target_config == eagle.architecture(target.config)
  # A head saved before the inputs were recorded had another layout.
  config.num_steps = 2
  trainer.train(config, str(tmp_path / "old"),
                loss_fn=eagle_train.eagle_loss(), aux=target, corpus=corpus,
                extra_metadata={"kind": "eagle-head"},
                model=sj.EagleHead.create(draft.head.config))
  with pytest.raises(checkpoint_lib.CheckpointError, match="retrain"):
    eagle_train.load_head(str(tmp_path / "old"), target)
  wider = eagle_train.train_config(_target(vocab=259).config)
  with pytest.raises(ValueError, match="not a head for this target"):
    eagle_train.train_head(target, wider, str(tmp_path / "x"), corpus=corpus)
  # Resuming the run for a deeper target: the head's config is the same,
  # so the trainer resumed it, and mixed two targets' features.
  deeper = TransformerLM.create(
      dataclasses.replace(target.config, num_layers=2), 0)
  config.num_steps = 8
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match="another target(.|\n)*num_layers"):
    eagle_train.train_head(deeper, config, str(tmp_path / "w"), corpus=corpus)


# ---- Bad input.

def test_bad_target_kind_and_width_get_clear_errors(target):
  draft = sj.EagleDraft.create(target, 0)
  prompts, lengths = _prompts(2)
  ngram = sj.NGramLM.fit(np.arange(50) % V, V, order=1)
  with pytest.raises(TypeError, match="forward_with_hidden"):
    sj.speculative_generate(ngram, draft, prompts, lengths, jax.random.key(0),
                            gamma=2, max_new_tokens=4)
  other = _target(target.config.flavour, d_model=16)
  with pytest.raises(ValueError, match="d_model"):
    sj.speculative_generate(other, draft, prompts, lengths, jax.random.key(0),
                            gamma=2, max_new_tokens=4)
  with pytest.raises(ValueError, match="d_model"):
    sj.EagleDraft(target=other, head=draft.head)
  with pytest.raises(ValueError, match="vocab_size"):
    sj.EagleDraft(target=_target(target.config.flavour, vocab=V + 1),
                  head=draft.head)
  # Same width and vocabulary, another architecture: its features are not
  # the ones the head reads; a cast of the head's own target is.
  flavour = "llama" if target.config.flavour == "gpt2" else "gpt2"
  with pytest.raises(ValueError, match="the target it was built for"):
    sj.speculative_generate(_target(flavour), draft, prompts, lengths,
                            jax.random.key(0), gamma=2, max_new_tokens=4)
  draft.check_target(target.astype("bfloat16"))
  # Nor may such a target be paired with this head directly, nor one of
  # another depth (not in the head's config; in its record of its target).
  with pytest.raises(ValueError, match="made for another target"):
    sj.EagleDraft(target=_target(flavour), head=draft.head)
  deeper = TransformerLM.create(dataclasses.replace(target.config,
                                                    num_layers=3), 0)
  with pytest.raises(ValueError, match="num_layers: 2 .* vs 3"):
    sj.EagleDraft(target=deeper, head=draft.head)
  with pytest.raises(ValueError, match="not a head for target_config"):
    sj.EagleHead.create(draft.head.config, target_config=_target(
        target.config.flavour, d_model=16).config)
  with pytest.raises(TypeError, match="TransformerLM"):
    sj.EagleDraft.create(ngram)
  with pytest.raises(TypeError, match="EagleHead"):
    sj.EagleDraft(target=target, head=target)


def test_bad_head_config_and_cache_get_clear_errors(target):
  with pytest.raises(ValueError, match="one-layer"):
    sj.EagleHead.create(target.config)
  with pytest.raises(ValueError, match="mlp_dim"):
    eagle.head_config(target.config, mlp_dim=0)
  draft = sj.EagleDraft.create(target, 0)
  with pytest.raises(TypeError, match="EagleCache"):
    draft(jnp.zeros((1, 1), jnp.int32), target.init_cache(1, 8))
  tokens = jnp.zeros((2, 3), jnp.int32)
  with pytest.raises(ValueError, match="cache does not fit"):
    draft(tokens, draft.init_cache(3, 8))  # batch 3 for 2 rows
  d = target.config.d_model
  for shape in ((2, 3, d + 1), (2, 2, d)):
    with pytest.raises(ValueError, match="features_BxTxD has shape"):
      draft.from_features(jnp.zeros(shape), tokens, draft.init_cache(2, 8))
  with pytest.raises(ValueError, match="max_len"):
    draft.init_cache(1, 10_000)
