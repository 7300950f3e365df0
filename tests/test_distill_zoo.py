"""Draft distillation and the model zoo (tiny models, seconds)."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import data
from specjax.harness import zoo
from specjax.train import distill
from specjax.train import recipes
from specjax.train import trainer

# Train for real, briefly: the tiny recipe, small batches, no checkpoints.
QUICK = {"num_steps": 40, "eval_every": 0, "checkpoint_every": 0,
         "progress": False}
# Integrity tests only need *a* trained entry: a few steps of small batches.
FAST = {"num_steps": 3, "optim.warmup_steps": 1, "batch_size": 4,
        "seq_len": 32, "eval_every": 0, "checkpoint_every": 0,
        "progress": False}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  for i, path in enumerate(data.stdlib_corpus().files[:40]):
    with open(path.path, "rb") as src, open(root / f"f{i}.py", "wb") as dst:
      dst.write(src.read()[:20_000])
  return data.text_corpus(str(root), heldout_fraction=0.2)


def _small_corpus(root, files, start=0):
  os.makedirs(root, exist_ok=True)
  for i, path in enumerate(data.stdlib_corpus().files[start:start + files]):
    with open(path.path, "rb") as src, open(os.path.join(root, f"f{i}.py"),
                                            "wb") as dst:
      dst.write(src.read()[:8_000])
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
  # p and q over different vocabularies: refused by name, not by XLA.
  small = lambda v: sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=v, d_model=16, num_layers=1, num_heads=2, max_positions=16), 0)
  teacher, student = small(40), small(32)
  with pytest.raises(ValueError, match="vocab_size is 40 and the student's 32"):
    distill.mean_tv(teacher, student, np.zeros((1, 2, 4), np.int32))
  loss_fn = distill.distillation_loss("tv")
  with pytest.raises(ValueError, match="vocab_size is 40 and the student's 32"):
    jax.eval_shape(lambda t: loss_fn(student.module(), {"tokens": t}, None,
                                     teacher), jnp.zeros((2, 5), jnp.int32))


def test_train_checks_the_teacher_before_any_work(corpus, tmp_path):
  # Found while the step was traced, after the workdir was made; an int
  # aux reached the loss as a tracer and was named as one.
  config = recipes.train_config("tiny")
  config.update(QUICK)
  wide = sj.TransformerLM.create(dataclasses.replace(
      trainer.model_config_from(config), vocab_size=300), 0)
  for aux, error, match in (
      (wide, ValueError, "vocab_size is 300 and the student's 259"),
      (3, TypeError, "aux must be the frozen teacher .* got int")):
    with pytest.raises(error, match=match):
      trainer.train(config, str(tmp_path / "w"), aux=aux, corpus=corpus,
                    loss_fn=distill.distillation_loss("tv"))
  assert not (tmp_path / "w").exists()


@pytest.mark.slow  # a training-quality check (~10 s), not zoo integrity
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


@pytest.mark.full
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


@pytest.mark.full
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
  # "~/x" made a directory named "~" under the working directory.
  monkeypatch.setenv(zoo.CACHE_ENV, "~/zoo")
  assert zoo.resolve_cache_dir() == os.path.expanduser("~/zoo")
  # "" fell back to the default cache; a file failed in the lock's mkdir.
  with pytest.raises(ValueError, match="cache_dir must be a non-empty path"):
    zoo.resolve_cache_dir("")
  (tmp_path / "afile").write_text("")
  with pytest.raises(NotADirectoryError, match="cache directory .* is a file"):
    zoo.load("tiny", cache_dir=str(tmp_path / "afile"))


def test_zoo_bad_names_and_overrides(cache, capsys):
  with pytest.raises(ValueError, match="Unknown zoo model 'target-1t'"):
    zoo.load("target-1t", cache_dir=cache)
  with pytest.raises(ValueError, match="not a field"):
    zoo.load("tiny", cache_dir=cache, overrides={"num_stepz": 3})
  # A bad value is refused before anything is announced or locked.
  for name in ("tiny", "eagle-head@tiny"):
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
      zoo.load(name, cache_dir=cache, overrides={"num_steps": -5})
  # The name sets an exit adapter's blocks, spelt one way.
  with pytest.raises(ValueError, match="model.layers may not be overridden"):
    zoo.load("exit-adapter-1@tiny", cache_dir=cache,
             overrides={"model.layers": 2})
  with pytest.raises(ValueError, match="Unknown zoo model"):
    zoo.load("exit-adapter-01@tiny", cache_dir=cache)
  with pytest.raises(TypeError, match="overrides must be a dict"):
    zoo.load("tiny", cache_dir=cache, overrides=[("num_steps", 3)])
  # What `train` would refuse after the lock, refused with the recipe.
  for overrides, error, match in (
      ({"optim.lr": -1.0}, ValueError, "config.optim.lr must be > 0"),
      ({"seq_len": 10**6}, ValueError, "config.seq_len=1000000 is longer"),
      ({"model.vocab_size": 100}, ValueError, "model.vocab_size=100 is "
       "smaller than the corpus tokenizer's"),
      ({"optim.lr.x": 1}, ValueError, "'optim.lr.x' is not a field"),
      ({1: 1}, TypeError, "keys are dotted field names"),
      # ml_collections' own message named no argument; a nested dict
      # replaced the whole block.
      ({"num_steps": "2"}, TypeError, "'num_steps' = '2' does not fit"),
      ({"model": {"d_model": 48}}, ValueError,
       r"'model' is a block of fields.*'model.d_model'")):
    with pytest.raises(error, match=match):
      zoo.load("tiny", cache_dir=cache, overrides=overrides)
  # Both were refused only after the teacher trained (audit): a student
  # window past the teacher's positions, and a teacher's model.* override
  # that reshaped the head it also reached.
  for name in ("distilled-tiny@tiny", "exit-adapter-1@tiny",
               "eagle-head@tiny"):
    with pytest.raises(ValueError, match="longer than the teacher's "
                       "max_positions 16"):
      zoo.load(name, cache_dir=cache, overrides={"seq_len": 32},
               teacher_overrides={"model.max_positions": 16, "seq_len": 16})
  with pytest.raises(ValueError, match="the head's config follows its "
                     "teacher(.|\n)*num_layers"):
    zoo.load("eagle-head@tiny", cache_dir=cache,
             overrides={"model.num_layers": 3})
  with pytest.raises(TypeError, match="corpus must be a specjax.data.Corpus"):
    zoo.entry_dir("tiny", cache_dir=cache, corpus="/some/path")
  # str.isdigit takes "²", which int() does not.
  with pytest.raises(ValueError, match="Unknown zoo model"):
    zoo.load("exit-adapter-²@tiny", cache_dir=cache)
  with pytest.raises(TypeError, match="cache_dir must be a path"):
    zoo.load("tiny", cache_dir=123)
  assert "training" not in capsys.readouterr().out


# -- zoo integrity ---------------------------------------------------------


def _trained(capsys):
  out = capsys.readouterr().out
  return out.count("training tiny"), out


def _same(a, b):
  return all(np.array_equal(x, y) for x, y in
             zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state)))


@pytest.mark.full
def test_zoo_key_covers_corpus_recipe_and_teacher(tmp_path, monkeypatch,
                                                  capsys):
  cache = str(tmp_path / "zoo")
  corpus_a = _small_corpus(tmp_path / "a", 12)
  corpus_b = _small_corpus(tmp_path / "b", 12, start=12)
  first = zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus_a)
  # Another corpus, same name and overrides: a new model, not the old one.
  other = zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus_b)
  assert _trained(capsys)[0] == 2 and not _same(first, other)
  # A changed recipe (here: the recipe table itself) is a new model too.
  original = recipes.train_config

  def new_lr(size, **kw):
    config = original(size, **kw)
    config.optim.lr = 0.5 * config.optim.lr
    return config

  monkeypatch.setattr(recipes, "train_config", new_lr)
  changed = zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus_a)
  assert _trained(capsys)[0] == 1 and not _same(first, changed)
  monkeypatch.undo()
  again = zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus_a)
  assert _trained(capsys)[0] == 0 and _same(first, again)
  # teacher_overrides=None (teacher uses `overrides`) and {} (the teacher's
  # default recipe) are different teachers, so different students.
  dirs = {repr(t): zoo.entry_dir("distilled-tiny@tiny", cache_dir=cache,
                                 overrides=FAST, teacher_overrides=t,
                                 corpus=corpus_a)
          for t in (None, {}, {"num_steps": 3, "optim.warmup_steps": 1})}
  assert len(set(dirs.values())) == 3, dirs


def test_zoo_refuses_an_entry_whose_recorded_recipe_differs(tmp_path, corpus):
  cache = str(tmp_path)
  zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus,
           verbose=False)
  entry = zoo.entry_dir("tiny", cache_dir=cache, overrides=FAST,
                        corpus=corpus)
  record_path = os.path.join(entry, zoo.RECORD_FILE)
  with open(record_path) as fh:
    record = json.load(fh)
  lr = record["recipe"]["train_config"]["optim"]["lr"]
  record["recipe"]["train_config"]["optim"]["lr"] = 123.0
  with open(record_path, "w") as fh:
    json.dump(record, fh)
  with pytest.raises(zoo.ZooError, match=r"train_config\.optim\.lr: 123\.0"):
    zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus,
             verbose=False)
  # An entry missing its checkpoints said to train first; one that is a
  # file was found only after training, when the entry was moved there.
  record["recipe"]["train_config"]["optim"]["lr"] = lr
  with open(record_path, "w") as fh:
    json.dump(record, fh)
  shutil.rmtree(os.path.join(entry, "checkpoints"))
  with pytest.raises(zoo.ZooError, match="cannot be read(.|\n)*Delete the "
                     "directory to retrain it"):
    zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus,
             verbose=False)
  shutil.rmtree(entry)
  with open(entry, "w") as fh:
    fh.write("")
  with pytest.raises(zoo.ZooError, match="is a file, not an entry"):
    zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus,
             verbose=False)


@pytest.mark.full
def test_teacher_corpus_is_keyed_by_every_argument(corpus, tmp_path):
  config = trainer.model_config_from(recipes.train_config("tiny"))
  teacher = sj.TransformerLM.create(config, 0)
  args = dict(num_sequences=3, prompt_len=8, new_tokens=24, batch_size=4)
  where = str(tmp_path / "gen")

  def text(model=teacher, **changes):
    on_policy = distill.teacher_corpus(model, corpus, where,
                                       **{**args, **changes})
    return on_policy.tokens("train")

  base = text()
  np.testing.assert_array_equal(text(), base)  # same arguments: reused
  for changed in (text(seed=1), text(temperature=0.5),
                  text(model=sj.TransformerLM.create(config, 1))):
    assert not np.array_equal(changed, base)
  assert text(new_tokens=2).size < base.size


def test_zoo_writes_are_atomic(tmp_path, corpus, monkeypatch):
  cache = str(tmp_path)
  # A crash while the n-gram file is being written leaves no entry behind...
  real_savez = np.savez

  def crash(path, **arrays):
    with open(path, "wb") as fh:
      fh.write(b"PK\x03\x04 truncated")
    raise KeyboardInterrupt("killed mid-write")

  monkeypatch.setattr(np, "savez", crash)
  with pytest.raises(KeyboardInterrupt):
    zoo.load("bigram", cache_dir=cache, corpus=corpus, verbose=False)
  monkeypatch.setattr(np, "savez", real_savez)
  # ...so the next call fits it again instead of reading a broken file.
  bigram = zoo.load("bigram", cache_dir=cache, corpus=corpus, verbose=False)
  assert bigram.order == 2
  # A crash mid-training publishes nothing under the entry's name.
  def crash_train(config, workdir, **kw):
    os.makedirs(workdir, exist_ok=True)
    raise KeyboardInterrupt("killed mid-training")

  monkeypatch.setattr(trainer, "train", crash_train)
  with pytest.raises(KeyboardInterrupt):
    zoo.load("tiny", cache_dir=cache, overrides=FAST, corpus=corpus,
             verbose=False)
  assert not os.path.exists(zoo.entry_dir("tiny", cache_dir=cache,
                                          overrides=FAST, corpus=corpus))


_RACER = """
import os, sys, time
import numpy as np, jax
from specjax import data
from specjax.harness import zoo
corpus_root, cache, sync, me = sys.argv[1:]
corpus = data.text_corpus(corpus_root, heldout_fraction=0.2)
corpus.fingerprint()
open(os.path.join(sync, me), "w").close()
while len(os.listdir(sync)) < 2:  # start both loads at the same moment
  time.sleep(0.005)
model = zoo.load("tiny", cache_dir=cache, corpus=corpus, overrides=%r)
print("SUM", float(sum(np.abs(x).sum() for x in jax.tree.leaves(model.state))))
"""


@pytest.mark.full
def test_two_processes_train_a_model_once(tmp_path, corpus):
  sync = tmp_path / "sync"
  sync.mkdir()
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen(
      [sys.executable, "-c", _RACER % (FAST,),
       os.path.dirname(corpus.files[0].path),
       str(tmp_path / "zoo"), str(sync), name], env=env, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for name in "ab"]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), outs
  both = "".join(outs)
  assert both.count("training tiny") == 1, outs
  assert both.count("loaded tiny") == 2, outs
  sums = {line for out in outs for line in out.splitlines()
          if line.startswith("SUM")}
  assert len(sums) == 1, outs
