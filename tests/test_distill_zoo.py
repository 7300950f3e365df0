"""Draft distillation and the model zoo (tiny models, seconds)."""

import os

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import data
from specjax import zoo
from specjax.train import distill
from specjax.train import recipes
from specjax.train import trainer

# Train for real, briefly: the tiny recipe, small batches, no checkpoints.
QUICK = {"num_steps": 40, "eval_every": 0, "checkpoint_every": 0,
         "progress": False}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  for i, path in enumerate(data.stdlib_corpus().files[:40]):
    with open(path.path, "rb") as src, open(root / f"f{i}.py", "wb") as dst:
      dst.write(src.read()[:20_000])
  return data.text_corpus(str(root), heldout_fraction=0.2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("zoo"))


def _windows(corpus, n=2):
  heldout = corpus.tokens("heldout").astype(np.int32)
  return np.stack([data.batch_at(heldout, 8, 48, 0, i)[:, :-1]
                   for i in range(n)])


@pytest.mark.parametrize("divergence", distill.DIVERGENCES)
def test_divergences_vanish_on_equal_distributions(divergence):
  logits = jax.random.normal(jax.random.key(0), (2, 3, 7))
  same = distill.divergence_BxT(divergence, logits, logits)
  np.testing.assert_allclose(same, 0.0, atol=1e-6)
  other = distill.divergence_BxT(divergence, logits, 2.0 * logits)
  assert (other > 1e-3).all()


def test_tv_divergence_matches_coupling_tv():
  a, b = jax.random.normal(jax.random.key(1), (2, 4, 9))
  np.testing.assert_allclose(
      distill.divergence_BxT("tv", a[None], b[None])[0],
      sj.tv_distance(jax.nn.softmax(a), jax.nn.softmax(b)), atol=1e-6)


def test_bad_divergence_is_an_error():
  with pytest.raises(ValueError, match="divergence"):
    distill.distillation_loss("js")
  with pytest.raises(ValueError, match="temperature"):
    distill.distillation_loss("tv", temperature=0.0)


def test_distillation_lowers_heldout_tv_to_the_target(corpus, cache):
  teacher = zoo.load("tiny", cache_dir=cache, overrides=QUICK, corpus=corpus,
                     verbose=False)
  config = recipes.train_config("tiny")
  config.update(QUICK)
  config.seed = 1
  before = sj.TransformerLM.create(trainer.model_config_from(config), 1)
  windows = _windows(corpus)
  tv_before = distill.mean_tv(teacher, before, windows)
  student, metrics = trainer.train(
      config, os.path.join(cache, "student"), aux=teacher, corpus=corpus,
      loss_fn=distill.distillation_loss("tv"))
  tv_after = distill.mean_tv(teacher, student, windows)
  assert tv_after < 0.7 * tv_before, (tv_before, tv_after)
  assert metrics["train_loss"][-1] < metrics["train_loss"][0]


def test_on_policy_corpus_is_the_teachers_text(corpus, cache, tmp_path):
  teacher = zoo.load("tiny", cache_dir=cache, overrides=QUICK, corpus=corpus,
                     verbose=False)
  on_policy = distill.teacher_corpus(
      teacher, corpus, str(tmp_path / "gen"), num_sequences=6, prompt_len=8,
      new_tokens=16, batch_size=4)
  assert len(on_policy.files) == 6
  tokens = on_policy.tokens("train")
  assert tokens.size >= 6 * 8  # prompts plus whatever bytes were generated
  again = distill.teacher_corpus(
      teacher, corpus, str(tmp_path / "gen"), num_sequences=6, prompt_len=8,
      new_tokens=16, batch_size=4)
  np.testing.assert_array_equal(again.tokens("train"), tokens)


def test_zoo_trains_once_then_loads(corpus, cache, capsys):
  first = zoo.load("tiny", cache_dir=cache, overrides=QUICK, corpus=corpus)
  second = zoo.load("tiny", cache_dir=cache, overrides=QUICK, corpus=corpus)
  assert "loaded tiny" in capsys.readouterr().out
  for a, b in zip(jax.tree.leaves(first.state), jax.tree.leaves(second.state)):
    np.testing.assert_array_equal(a, b)


def test_zoo_ngram_and_distilled_names(corpus, cache):
  bigram = zoo.load("bigram", cache_dir=cache, corpus=corpus, verbose=False)
  assert bigram.order == 2 and bigram.vocab_size == data.BYTE_VOCAB_SIZE
  again = zoo.load("bigram", cache_dir=cache, corpus=corpus, verbose=False)
  np.testing.assert_array_equal(bigram.log_probs, again.log_probs)
  student = zoo.load("distilled-tiny@tiny", cache_dir=cache, overrides=QUICK,
                     corpus=corpus, verbose=False)
  assert isinstance(student, sj.TransformerLM)
  assert "distilled-draft-0.1m@target-3m" in zoo.names()


def test_zoo_cache_dir_env(monkeypatch, tmp_path):
  monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
  assert zoo.resolve_cache_dir() == str(tmp_path)
  assert zoo.resolve_cache_dir("/x/y") == "/x/y"


def test_zoo_bad_names_and_overrides(cache):
  with pytest.raises(ValueError, match="Unknown zoo model 'target-1t'"):
    zoo.load("target-1t", cache_dir=cache)
  with pytest.raises(ValueError, match="not a field"):
    zoo.load("tiny", cache_dir=cache, overrides={"num_stepz": 3})
