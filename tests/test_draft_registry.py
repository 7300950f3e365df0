"""The one draft registry (`specjax.harness.drafts`): every spec resolves
here, bad specs are refused before anything loads, and a config's drafts
load with their recipes."""

import numpy as np
import pytest

from conftest import REPO
from configs import adaptive_gamma as adaptive_config
from configs import reproduce
from configs import verifiers as verifiers_config
import specjax as sj
from specjax.harness import drafts
from specjax.harness import zoo
from specjax.models import hf

DATA = REPO / "tests" / "data" / "hf"


@pytest.fixture(scope="module")
def gpt2():
  return hf.load(DATA / "gpt2")


def test_every_kind_resolves(gpt2):
  target, tok = gpt2
  ids = tok.encode("the quick brown fox")
  layers = target.config.num_layers
  for spec, cls, kind in (
      ("self:1", sj.SelfDraft, "self"),
      ("self:0", sj.SelfDraft, "self"),
      (f"skip:{layers - 1}", sj.SelfDraft, "self"),
      ("truncated:1", sj.TransformerLM, "transformer"),
      ("truncated:0", sj.SelfDraft, "self"),
      ("bigram", sj.NGramLM, "bigram"),
      ("unigram", sj.NGramLM, "unigram"),
      ("prompt_lookup", sj.PromptLookupDraft, "prompt_lookup"),
      ("prompt-lookup:4", sj.PromptLookupDraft, "prompt_lookup"),
      ("random:16,1", sj.TransformerLM, "transformer"),
      ("perturbed:0.5", sj.TransformerLM, "transformer"),
      (str(DATA / "gpt2"), sj.TransformerLM, "transformer")):
    draft = drafts.make_draft(spec, target, tokenizer=tok, prompt_ids=ids)
    assert isinstance(draft.model, cls), spec
    assert draft.kind == kind == drafts.check_spec(spec), spec
    assert draft.name == spec and draft.description.startswith(spec)
    assert draft.model.vocab_size == target.vocab_size
    assert draft.target is target
  # A view on the target that shares its KV cache, not a copy.
  view = drafts.make_draft("self:1", target).model
  assert view.share_cache and view.target is target and view.layers == (0,)
  assert drafts.make_draft("skip:0", target).model.layers == tuple(
      range(1, layers))
  assert drafts.make_draft("prompt-lookup:4", target).model.max_ngram == 4
  assert "first 1 of" in drafts.make_draft("self:01", target).description
  # truncated:N is the target's own first N blocks: the same logits as
  # self:N, which runs those blocks as a view.
  prompts = np.array([ids[:4]], np.int32)
  a, _ = drafts.make_draft("truncated:1", target).model(
      prompts, drafts.make_draft("truncated:1", target).model.init_cache(1, 8))
  self1 = sj.SelfDraft(target, layers=1)
  b, _ = self1(prompts, self1.init_cache(1, 8))
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec, error, match", [
    (None, TypeError, "non-empty string"),
    (" bigram", TypeError, "surrounding spaces"),
    ("Bigram", ValueError, r"unknown draft 'Bigram'.*self:N.*prompt_lookup"),
    ("no/such/dir", ValueError, "unknown draft"),
    ("self:two", ValueError, "use self:N"),
    ("self:1+adaptor", ValueError, "use self:N"),
    ("self:9", ValueError, r"N must be in \[0, 2\]"),
    ("skip:", ValueError, "use skip:I,J"),
    ("skip:2", ValueError, r"in \[0, 2\)"),
    ("truncated:-1", ValueError, "use truncated:N"),
    ("prompt_lookup:0", ValueError, "n >= 1"),
    ("random:x", ValueError, "random:<preset>"),
    ("perturbed:-1", ValueError, "perturbed:s"),
    # ASCII digits only: int() would read these.
    ("self:1_0", ValueError, "use self:N"),
    ("self:\u0663", ValueError, "use self:N"),
])
def test_bad_specs_are_refused_before_loading(gpt2, spec, error, match):
  target, _ = gpt2
  with pytest.raises(error, match=match):
    drafts.make_draft(spec, target)
  if spec is not None and error is ValueError and "N must" not in match and (
      "[0, 2" not in match):
    with pytest.raises(error, match=match):
      drafts.check_spec(spec)  # the syntax alone, nothing loaded


def test_check_spec_bounds_blocks_without_a_target():
  assert drafts.check_spec("self:4", num_layers=4) == "self"
  for spec in ("self:5", "truncated:5", "skip:4", "skip:0,4"):
    with pytest.raises(ValueError, match="blocks"):
      drafts.check_spec(spec, num_layers=4)
  assert drafts.check_spec("skip:0,4") == "self"  # bounds need the layers
  assert drafts.check_spec("distilled-draft-0.1m@target-3m") == "distilled"
  assert drafts.check_spec("eagle-head@target-3m") == "eagle"
  assert drafts.is_zoo_model("draft-0.1m")
  assert not drafts.is_zoo_model("bigram") and not drafts.is_zoo_model("self:1")
  with pytest.raises(ValueError, match="unknown draft"):
    drafts.check_spec("exit-adapter-1@target-3m")  # an adapter, no draft


def test_bad_arguments_are_named(gpt2, monkeypatch):
  target, tok = gpt2
  ids = tok.encode("the quick brown fox")
  # A dtype typo is refused whichever draft kind would ignore it.
  for spec in ("self:1", "bigram", "prompt_lookup"):
    with pytest.raises(ValueError, match="dtype"):
      drafts.make_draft(spec, target, prompt_ids=ids, dtype="bogus")
  with pytest.raises(TypeError, match="target must be a specjax"):
    drafts.make_draft("self:1", sj.NGramLM.uniform(8))
  with pytest.raises(TypeError, match="target must implement"):
    drafts.make_draft("prompt_lookup", None)
  with pytest.raises(ValueError, match="tokenizer"):
    drafts.make_draft(str(DATA / "gpt2"), target)
  # Another tokenizer is no longer an error: it is read through TLI.
  assert "token-level intersection" in drafts.make_draft(
      str(DATA / "llama_gqa"), target, tokenizer=tok).description
  with pytest.raises(ValueError, match="is a self draft, not 'bigram'"):
    drafts.make_draft("self:1", target, kind="bigram")
  # Comparison errors and AttributeErrors named nothing.
  for bad in ([], np.zeros((2, 2, 2), np.int32)):
    with pytest.raises(ValueError, match="prompt_ids"):
      drafts.make_draft("bigram", target, prompt_ids=bad)
  # Without prompts, bigram is the zoo's byte-level fit: refused for a
  # target of another vocabulary (the zoo is stubbed: nothing trains).
  with monkeypatch.context() as m:
    m.setattr(zoo, "load", _stub_zoo)
    with pytest.raises(ValueError, match="pass prompt_ids"):
      drafts.make_draft("bigram", target)


def test_a_bigram_counts_pairs_within_each_prompt(gpt2):
  """Never from one prompt's end to the next one's start, however the
  prompts come."""
  target, tok = gpt2
  a, b = tok.encode("ab"), tok.encode("cd")
  want = sj.NGramLM.fit([a, b], target.vocab_size, 2).log_probs
  padded = np.full((2, max(len(a), len(b))), -1, np.int32)
  padded[0, :len(a)], padded[1, :len(b)] = a, b
  for prompts in ([a, b], padded, (a, b)):
    got = drafts.make_draft("bigram", target, prompt_ids=prompts).model
    np.testing.assert_array_equal(got.log_probs, want)
  one = sj.NGramLM.fit(a, target.vocab_size, 2).log_probs
  for prompt in (a, a.tolist()):  # one prompt's ids
    got = drafts.make_draft("bigram", target, prompt_ids=prompt).model
    np.testing.assert_array_equal(got.log_probs, one)
  bridge = int(a[-1]), int(b[0])
  assert want[bridge] == one[bridge]


_BYTES = 259  # the built-in corpus' vocabulary


def _stub_zoo(name, **kwargs):
  """A model of the kind the zoo would return for `name`, untrained."""
  del kwargs
  if name in zoo.NGRAMS:
    return sj.NGramLM.fit(np.arange(20) % 5, _BYTES, zoo.NGRAMS[name])
  lm = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=_BYTES, d_model=16, num_layers=2, num_heads=2,
      max_positions=64))
  return sj.EagleDraft.create(lm) if name.startswith("eagle-head") else lm


def test_zoo_recipes_come_from_the_config(monkeypatch):
  """A zoo draft named in a config loads with its entry's recipe; a model
  trained for the config's target (not listed) with that target's recipe
  as its teacher's; the rest with the zoo's defaults. Nothing trains here:
  the zoo's loader is stubbed."""
  asked = []
  monkeypatch.setattr(zoo, "load", lambda name, **kw: asked.append(
      (name, kw["overrides"], kw["teacher_overrides"])) or _stub_zoo(name))
  config = reproduce.get_config("quick")
  target = sj.NGramLM.uniform(_BYTES)
  distilled = next(d for d in config.drafts if d.kind == "distilled")
  for spec in (distilled.name, "eagle-head@target-3m", "draft-2m", "bigram"):
    drafts.make_draft(spec, target, config=config)
  assert asked == [
      (distilled.name, dict(distilled.overrides),
       dict(distilled.teacher_overrides)),
      ("eagle-head@target-3m", None, dict(config.target_overrides)),
      ("draft-2m", None, None),
      ("bigram", {}, None)]
  # Given a recipe, it wins; without a config, the zoo's defaults.
  asked.clear()
  drafts.make_draft(distilled.name, target, config=config,
                    overrides={"num_steps": 7}, teacher_overrides=None)
  drafts.make_draft(distilled.name, target)
  assert asked == [(distilled.name, {"num_steps": 7}, None),
                   (distilled.name, None, None)]
  # self:N+adapter is the zoo's adapter for the config's target.
  with pytest.raises(ValueError, match="pass the config"):
    drafts.make_draft("self:1+adapter", sj.TransformerLM.create(
        sj.TransformerConfig(vocab_size=8, d_model=8, num_layers=2,
                             num_heads=1, max_positions=8)))


def test_untrained_zoo_models_are_refused_with_train_false(tmp_path):
  config = reproduce.get_config("quick")
  config.cache_dir = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="train=False"):
    drafts.load_target(config, train=False)
  with pytest.raises(FileNotFoundError, match="train=False"):
    drafts.make_draft("draft-0.1m", sj.NGramLM.uniform(_BYTES),
                      config=config, train=False)


def test_a_configs_drafts_load_through_the_registry(monkeypatch):
  """`load_models` is the one loader of a config's models: each entry by
  its spec, with its recipe, checked against its kind."""
  monkeypatch.setattr(zoo, "load", _stub_zoo)
  config = reproduce.get_config("quick")
  config.drafts = [reproduce.draft("bigram", "bigram"),
                   reproduce.draft("prompt-lookup", "prompt_lookup"),
                   reproduce.draft("self:1", "self")]
  target, loaded = drafts.load_models(config)
  assert [(d.name, d.kind) for d in loaded] == [
      ("bigram", "bigram"), ("prompt-lookup", "prompt_lookup"),
      ("self:1", "self")]
  assert loaded[2].model.target is target
  assert loaded[1].model.max_ngram == 3


@pytest.mark.parametrize("drafts_, error, match", [
    ([], ValueError, "is empty"),
    (["bigram"], TypeError, r"\[0\] must be a ConfigDict"),
    ([reproduce.draft("bigram", "unigram")], ValueError,
     "give kind 'bigram'"),
    ([reproduce.draft("self:x", "self")], ValueError, "use self:N"),
    ([reproduce.draft("self:1", "self")] * 2, ValueError, "repeats"),
])
def test_config_drafts_are_checked_before_loading(drafts_, error, match):
  with pytest.raises(error, match=match):
    drafts.check_config_drafts(drafts_)


def test_every_sweep_preset_names_registry_specs():
  """The main job's presets, and the studies' sweeps of the same shape."""
  for config in (reproduce, verifiers_config, adaptive_config):
    presets = getattr(config, "SWEEP_PRESETS", reproduce.PRESETS)
    assert presets, config
    for preset in presets:
      drafts.check_config_drafts(config.get_config(preset).drafts)
