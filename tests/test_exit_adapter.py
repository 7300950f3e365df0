"""The exit adapter of a SelfDraft: identity at init, no copy, bad input, training.

Greedy equality and whole-generation exactness of a SelfDraft with an
adapter are in tests/test_greedy.py and tests/test_self_draft.py (with the
other SelfDraft variants).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import data
from specjax.harness import zoo
from specjax.models import ExitAdapterConfig, TransformerConfig, TransformerLM
from specjax.train import checkpoint
from specjax.train import exit_adapter as exit_adapter_train
from specjax.train import recipes
from specjax.train import trainer

V = 16


def _target(layers=3, d_model=32, flavour="llama"):
  return TransformerLM.create(TransformerConfig(
      vocab_size=V, d_model=d_model, num_layers=layers, num_heads=4,
      max_positions=64, flavour=flavour), 0)


@pytest.fixture(scope="module")
def target():
  return _target()


def test_untrained_adapter_is_the_training_free_draft(target):
  adapter = sj.ExitAdapter.create(target, 2)
  tokens = jnp.asarray(np.arange(20).reshape(2, 10) % V, jnp.int32)
  plain = sj.SelfDraft(target, layers=2)
  adapted = sj.SelfDraft(target, layers=2, adapter=adapter)
  np.testing.assert_array_equal(plain.logits(tokens), adapted.logits(tokens))
  # Cached calls give the full forward's logits.
  got, _ = adapted(tokens, adapted.init_cache(2, 16))
  np.testing.assert_allclose(got, adapted.logits(tokens), atol=1e-5)
  # The target's arrays are the draft's leaves (no copy); the adapter's
  # parameters are the only ones the draft adds.
  leaves = jax.tree.leaves(adapted)
  for a, b in zip(leaves, jax.tree.leaves(target)):
    assert a is b
  assert adapted.param_count() == plain.param_count() + adapter.param_count()
  assert adapter.param_count() == 3 * 32 * 32 + 32  # norm, gate/up/down (llama)


def test_shared_cache_with_adapter_holds_only_the_targets_layers(target):
  adapted = sj.SelfDraft(target, layers=1, share_cache=True,
                         adapter=sj.ExitAdapter.create(target, 1))
  view = adapted.cache_from_target(target.init_cache(2, 16))
  assert view.num_layers == 1


@pytest.mark.parametrize("other, match", [
    (dict(layers=4), "different target"),       # same width, another depth
    (dict(d_model=48), "d_model"),             # another width
    (dict(flavour="gpt2"), "flavour"),
])
def test_adapter_for_another_target_is_refused(target, other, match):
  adapter = sj.ExitAdapter.create(_target(**other), 1)
  with pytest.raises(ValueError, match=match):
    sj.SelfDraft(target, layers=1, adapter=adapter)


@pytest.mark.full
def test_a_cast_target_is_the_same_target(target):
  """A float32 adapter drafts for its target cast to bfloat16 (as an EAGLE
  head does), and greedy output is still the target's own."""
  cast = target.astype("bfloat16")
  draft = sj.SelfDraft(cast, layers=1, share_cache=True,
                       adapter=sj.ExitAdapter.create(target, 1))
  prompts, lengths = np.array([[1, 2, 3, 4]], np.int32), np.array([4])
  kw = dict(max_new_tokens=6, sampling=sj.GREEDY)
  out = sj.speculative_generate(cast, draft, prompts, lengths,
                                jax.random.key(0), gamma=2, **kw)
  want = sj.generate(cast, prompts, lengths, jax.random.key(0), **kw)
  np.testing.assert_array_equal(out.tokens, want.tokens)


def test_bad_adapter_arguments_get_clear_errors(target):
  adapter = sj.ExitAdapter.create(target, 1)
  with pytest.raises(ValueError, match=r"follows blocks \(0,\)"):
    sj.SelfDraft(target, layers=2, adapter=adapter)
  with pytest.raises(TypeError, match="ExitAdapter"):
    sj.SelfDraft(target, layers=1, adapter=target)
  with pytest.raises(TypeError, match="TransformerLM"):
    sj.ExitAdapter.create(sj.NGramLM.fit(np.arange(50) % V, V, order=1), 1)
  with pytest.raises(ValueError, match="ExitAdapter.create layers"):
    sj.ExitAdapter.create(target, 5)
  with pytest.raises(ValueError, match="mlp_dim"):
    sj.ExitAdapter.create(target, 1, mlp_dim=0)
  # jax would keep the low 32 bits: seed 0's weights again.
  with pytest.raises(ValueError, match="seed must be <= 4294967295"):
    sj.ExitAdapter.create(target, 1, seed=2**32)
  with pytest.raises(TypeError, match="layers must be a sequence"):
    ExitAdapterConfig(target=target.config, layers=1)
  with pytest.raises(ValueError, match="eval_every"):
    cfg = recipes.exit_adapter_config(1)
    cfg.eval_every = 5
    trainer.train(cfg, "/nonexistent", model=adapter)
  # config.model records the adapter: it may not say otherwise.
  with pytest.raises(ValueError, match="config.model.layers is 1 but layers"):
    exit_adapter_train.train_exit_adapter(
        target, 2, "/nonexistent", config=recipes.exit_adapter_config(1))
  with pytest.raises(ValueError, match="config.model.mlp_dim is 8 but"):
    exit_adapter_train.train_exit_adapter(
        target, 1, "/nonexistent", mlp_dim=16,
        config=recipes.exit_adapter_config(1, mlp_dim=8))
  # The loss is built before it sees a target: everything but the bound is
  # checked then, not at the first traced call of a training step.
  for layers, err, match in ((-1, ValueError, ">= 0"),
                             ("ab", TypeError, "an int k"),
                             ((2, 1), ValueError, "strictly increasing")):
    with pytest.raises(err, match="exit_adapter_loss layers.*" + match):
      exit_adapter_train.exit_adapter_loss(layers)
  with pytest.raises(ValueError, match="SelfDraft layers must be <= 3"):
    loss = exit_adapter_train.exit_adapter_loss(99)
    loss(sj.ExitAdapter.create(target, 1).module(), None, None, target)


@pytest.mark.slow  # ~11 s of training; the zoo's keying is test_distill_zoo's
def test_zoo_trains_an_adapter_once_then_loads_it(tmp_path, capsys):
  root = tmp_path / "corpus"
  os.makedirs(root)
  for i, path in enumerate(data.stdlib_corpus().files[:8]):
    with open(path.path, "rb") as src, open(root / f"f{i}.py", "wb") as dst:
      dst.write(src.read()[:8_000])
  corpus = data.text_corpus(str(root), heldout_fraction=0.2)
  fast = {"num_steps": 3, "optim.warmup_steps": 1, "batch_size": 4,
          "seq_len": 32, "checkpoint_every": 0, "progress": False}
  kw = dict(cache_dir=str(tmp_path / "zoo"), corpus=corpus,
            overrides=dict(fast, eval_batches=1, eval_batch_size=4),
            teacher_overrides=dict(fast, eval_every=0))
  adapter = zoo.load("exit-adapter-1@tiny", **kw)
  assert "held-out TV(p, q)" in capsys.readouterr().out
  again = zoo.load("exit-adapter-1@tiny", **kw)
  assert "training" not in capsys.readouterr().out
  target = zoo.load("tiny", cache_dir=kw["cache_dir"], corpus=corpus,
                    overrides=kw["teacher_overrides"], verbose=False)
  assert isinstance(adapter, sj.ExitAdapter)
  assert adapter.config.target == target.config
  for a, b in zip(jax.tree.leaves(adapter), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)
  # Trained: the output projection left zero, and the draft runs.
  down = [x for p, x in jax.tree_util.tree_leaves_with_path(adapter.state)
          if "down" in jax.tree_util.keystr(p) and x.ndim == 2]
  assert np.abs(down[0]).max() > 0
  draft = sj.SelfDraft(target, layers=1, share_cache=True, adapter=adapter)
  out = sj.speculative_generate(target, draft, np.ones((1, 4), np.int32),
                                np.array([4], np.int32), jax.random.key(0),
                                gamma=2, max_new_tokens=4, sampling=sj.GREEDY)
  assert int(out.lengths[0]) == 4
  # Another target recipe is another adapter entry, never this one.
  other = zoo.recipe("exit-adapter-1@tiny", corpus=corpus,
                     overrides=kw["overrides"],
                     teacher_overrides=dict(fast, num_steps=4))
  assert zoo.key(other) != zoo.key(zoo.recipe(
      "exit-adapter-1@tiny", corpus=corpus, overrides=kw["overrides"],
      teacher_overrides=kw["teacher_overrides"]))
  with pytest.raises(ValueError, match="Unknown zoo model"):
    zoo.load("exit-adapter-2@tiny", **kw)  # tiny has 2 blocks: k < 2
  # load_exit_adapter refuses another target's architecture.
  entry = zoo.entry_dir("exit-adapter-1@tiny", **kw)
  with pytest.raises(ValueError, match="different target"):
    exit_adapter_train.load_exit_adapter(entry, _target(layers=2, d_model=32))
  # An adapter is no Transformer: the restore said "unexpected keyword
  # argument 'target'"; now each loader names the other.
  with pytest.raises(checkpoint.CheckpointError,
                     match=r"holds an exit-adapter(.|\n)*load_exit_adapter"):
    checkpoint.load_model(entry)
  teacher = zoo.entry_dir("tiny", cache_dir=kw["cache_dir"], corpus=corpus,
                          overrides=kw["teacher_overrides"])
  with pytest.raises(checkpoint.CheckpointError,
                     match=r"holds a transformer(.|\n)*load_model"):
    exit_adapter_train.load_exit_adapter(teacher, target)
