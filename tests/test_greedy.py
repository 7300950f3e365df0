"""Greedy speculative decoding equals greedy autoregressive decoding.

At temperature 0 both p and q are one-hot, so an exact verifier keeps a
draft iff it is the target's argmax and emits the target's argmax
otherwise: whatever the draft, `speculative_generate` must return
`generate`'s tokens and lengths exactly. One table (`CASES`) covers every
draft kind (independent Transformers good and bad, n-grams, prompt lookup
with and without a fallback, self-drafts on the target's cache or their
own, a skip set, an exit adapter, an EAGLE head, the lab's Markov chains)
under every verifier (token, block, tree, tree-wor, traversal) and
draft-length rule (Confidence, Goodput), on the targets, prompts (ragged,
length 1), EOS and batch sizes these checks have always run on
(`SETTINGS`). A new draft kind or verifier is one line of `CASES`
(traversal's fast-tier greedy checks are in tests/test_traversal.py).

Each distinct (model structure, gamma, verifier, sampling, shape) compiles
its own decode loop, and each setting its reference: the default (fast)
tier runs the fewest cases that still run every draft kind and every
verifier once (12 cases, 17 programs); the rest are marked `full`, and
those that were opt-in before are `slow` too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax import testing
from specjax.lab import models as lab_models
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models.self_draft import SelfDraft

from test_self_draft import perturbed_adapter  # tests/ is on sys.path

V = 16


# ---- Targets: each built once per process.

@functools.cache
def _decode_target():
  return testing.toy_transformer(V, 0, embed_scale=1.0, d_model=32,
                                 num_layers=2, num_heads=4, max_positions=96)


@functools.cache
def _self_draft_target(flavour):
  return testing.toy_transformer(
      V, 0, flavour=flavour, embed_scale=1.0, d_model=32, num_layers=3,
      num_heads=4, num_kv_heads=2 if flavour == "llama" else None,
      max_positions=64)


@functools.cache
def _eagle_target(flavour):
  return testing.toy_transformer(
      V, 0, flavour=flavour, embed_scale=1.0, d_model=32, num_layers=2,
      num_heads=4, num_kv_heads=2 if flavour == "llama" else None,
      max_positions=64)


@functools.cache
def _tree_target(flavour, seed=0):
  # Peaked laws, so that drafts are often rejected and the kept depth varies.
  return testing.toy_transformer(
      V, seed, flavour=flavour, num_layers=2, max_positions=64,
      num_kv_heads=1 if flavour == "llama" else None)


@functools.cache
def _markov_lms():
  return lab_models.markov_lms(lab.make_markov_pair(1.5, 0.5, 0))


@functools.cache
def _draft_length_target():
  return testing.toy_transformer(V, 0, embed_scale=1.0, d_model=32,
                                 num_layers=3, num_heads=4, max_positions=96)


# ---- Prompts: (batch, seed) -> (prompts [batch, max_len], lengths [batch]).

def _random_prompts(max_len, *, first_has_one_token=False):
  def prompts(batch, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=batch).astype(np.int32)
    if first_has_one_token:
      lengths[0] = 1  # an EAGLE head has no target feature to pair it with
    return (rng.integers(0, V, size=(batch, max_len)).astype(np.int32),
            lengths)
  return prompts


def _fixed_prompts(prompts, lengths):
  return lambda batch, seed: (np.array(prompts, np.int32),
                              np.array(lengths, np.int32))


@dataclasses.dataclass(frozen=True)
class Setting:
  """A target and how the drafts on it are run.

  Attributes:
    target: builds the target (cached).
    prompts: (batch, seed) -> (prompts, lengths).
    max_new_tokens: the budget of both generations.
    eos_id: ends a row in both, or None.
    ref_key: the reference's key; None: the speculative run's.
  """
  target: Callable[[], Any]
  prompts: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
  max_new_tokens: int
  eos_id: int | None = None
  ref_key: int | None = None


SETTINGS = {
    "decode": Setting(_decode_target, _random_prompts(12), 20),
    **{f"self:{f}": Setting(functools.partial(_self_draft_target, f),
                            _random_prompts(10), 24)
       for f in ("gpt2", "llama")},
    # Trees on a self-draft: one flavour (the tree pass itself is checked on
    # both in tests/test_trees.py).
    "self-tree": Setting(functools.partial(_self_draft_target, "llama"),
                         _random_prompts(10), 16, eos_id=3),
    **{f"eagle:{f}": Setting(functools.partial(_eagle_target, f),
                             _random_prompts(10, first_has_one_token=True),
                             20, eos_id=5)
       for f in ("gpt2", "llama")},
    "eagle:gpt2-no-eos": Setting(
        functools.partial(_eagle_target, "gpt2"),
        _random_prompts(10, first_has_one_token=True), 20),
    "eagle:llama-16": Setting(
        functools.partial(_eagle_target, "llama"),
        _random_prompts(10, first_has_one_token=True), 16),
    **{f"tree:{f}": Setting(functools.partial(_tree_target, f),
                            _fixed_prompts([[1, 2, 3, 4, 5], [7, 0, 0, 0, 0],
                                            [3, 3, 9, 0, 0]], [5, 1, 3]),
                            13, eos_id=11, ref_key=0)
       for f in ("gpt2", "llama")},
    "markov": Setting(lambda: _markov_lms()[0],
                      _fixed_prompts([[1, 2, 3], [4, 0, 0]], [3, 1]), 9,
                      ref_key=0),
    "draft-length": Setting(_draft_length_target, _random_prompts(10), 24),
}


# ---- Drafts: (target, reference GenerationResult) -> draft.

def _good(target, ref):
  """The target with lightly perturbed weights: high but imperfect
  agreement."""
  del ref
  leaves, treedef = jax.tree.flatten(target.state)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  noisy = [x + 0.02 * jax.random.normal(k, x.shape, x.dtype)
           for x, k in zip(leaves, keys)]
  return target.replace(state=jax.tree.unflatten(treedef, noisy))


def _bad(target, ref):
  """An unrelated Llama-flavoured model: a terrible but valid draft."""
  del target, ref
  return testing.toy_transformer(V, 3, flavour="llama", embed_scale=1.0,
                                 num_kv_heads=2, num_heads=4,
                                 max_positions=96)


def _independent(target, ref):
  """Another small random Transformer (gpt2, 1 block)."""
  del target, ref
  return testing.toy_transformer(V, 4, embed_scale=1.0, max_positions=96)


def _tree_transformer(target, ref):
  """Another peaked random Transformer, drafting a tree level by level."""
  del ref
  return _tree_target(target.config.flavour, seed=5)


def _corpus():
  return np.random.default_rng(1).integers(0, V, size=3000)


def _ngram(order):
  return lambda target, ref: NGramLM.fit(_corpus(), V, order=order)


def _prompt_lookup(target, ref):
  del target, ref
  return PromptLookupDraft(V, max_ngram=3)


def _prompt_lookup_with_fallback(target, ref):
  del target, ref
  return PromptLookupDraft(V, fallback=NGramLM.fit(_corpus(), V, order=2))


def _greedy_text_bigram(target, ref):
  """A context-free draft that agrees with the target sometimes: a bigram
  fitted to the target's greedy text plus noise."""
  del target
  noise = np.random.default_rng(0).integers(0, V, 60)
  return NGramLM.fit(np.concatenate([np.asarray(ref.tokens).reshape(-1),
                                     noise]), V)


def _self(layers, share_cache=False, adapter=False):
  return lambda target, ref: SelfDraft(
      target, layers=layers, share_cache=share_cache,
      adapter=perturbed_adapter(target, layers) if adapter else None)


def _self_skip(target, ref):
  del ref
  return SelfDraft.skipping(target, skip=[1])  # blocks 0 and 2, own cache


def _eagle(seed):
  return lambda target, ref: sj.EagleDraft.create(target, seed)


def _markov_draft(target, ref):
  del target, ref
  return _markov_lms()[1]


# ---- Checks beyond equality, named in a case's `checks`.

def _keeps_drafts(out, setting):
  """Drafts were kept, so later rounds read moved KV entries back."""
  del setting
  assert np.asarray(out.stats.accept_hist)[:, 1:].sum() > 0


def _rejects_at_the_root(out, setting):
  del setting
  assert np.asarray(out.stats.accept_hist)[:, 0].sum() > 0


def _stops_at_eos(out, setting):
  """Some row stopped at EOS, before the budget."""
  assert (np.asarray(out.lengths) < setting.max_new_tokens).any()


@dataclasses.dataclass(frozen=True)
class Case:
  """A draft on a setting, judged by a verifier or a draft-length rule.

  Attributes:
    setting: a key of SETTINGS.
    draft: (target, reference GenerationResult) -> draft.
    gamma: an int, a draft-length rule, or None (a tree's depth).
    verifier: the `speculative_generate` verifier.
    batch: rows per generation.
    runs: (prompt seed, key) of each generation.
    min_alpha: alpha_hat must exceed it (a good draft), or None.
    checks: functions of (result, setting) that must not raise.
  """
  setting: str
  draft: Callable[[Any, Any], Any]
  gamma: Any = None
  verifier: str = "token"
  batch: int = 8
  runs: tuple[tuple[int, int], ...] = ((0, 0),)
  min_alpha: float | None = None
  checks: tuple[Callable[[Any, Setting], None], ...] = ()


def _case(case_id, *args, fast=False, slow=False, **kwargs):
  marks = () if fast else (pytest.mark.full,) + ((pytest.mark.slow,)
                                                 if slow else ())
  return pytest.param(Case(*args, **kwargs), id=case_id, marks=marks)


def _twice(batch):
  """Two generations: prompt seeds 10 batch and 10 batch + 1, keys 0, 1."""
  return ((10 * batch, 0), (10 * batch + 1, 1))


_SELF_VARIANTS = {
    "first-1": _self(1),
    "first-2-shared": _self(2, share_cache=True),
    "embed-only-shared": _self(0, share_cache=True),
    "skip-middle": _self_skip,
    "embed-only": _self(0),  # a cache of no layers
    "first-2-shared-adapter": _self(2, share_cache=True, adapter=True),
}

_CONFIDENCE = sj.Confidence(threshold=0.9, gamma_max=5)
_GOODPUT = sj.Goodput(c=0.5, r=(1.1, 1.3, 1.6, 2.0))

_DECODE_GRID = ((1, 8), (3, 1), (3, 8), (8, 8))  # (gamma, batch)
_FLAVOURS = ("gpt2", "llama")

CASES = [
    # ---- The fast tier: one case per draft kind (an n-gram, prompt lookup,
    # a Transformer, self-drafts, EAGLE), and through them every verifier
    # (token, block, tree, tree-wor) and a draft-length rule (Confidence).
    _case("decode-good-g3-b8", "decode", _good, 3, runs=_twice(8),
          min_alpha=0.5, fast=True),
    _case("decode-unigram", "decode", _ngram(1), 3, runs=((21, 0),)),
    _case("decode-bigram", "decode", _ngram(2), 3, runs=((21, 0),),
          fast=True),
    _case("decode-prompt-lookup", "decode", _prompt_lookup, 3,
          runs=((21, 0),), fast=True),
    _case("decode-prompt-lookup-bigram-fallback", "decode",
          _prompt_lookup_with_fallback, 3, runs=((21, 0),)),
    _case("markov-block", "markov", _markov_draft, 3, verifier="block",
          batch=2, runs=((0, 5),), fast=True),
    _case("draft-length-self-shared-confidence", "draft-length",
          _self(1, share_cache=True), _CONFIDENCE, runs=((8, 0),), fast=True),
    # An unrelated Transformer: a bad draft. (A Goodput rule's planned loop
    # runs in the fast tier in tests/test_sweep.py's auto cells.)
    _case("draft-length-independent-goodput", "draft-length", _independent,
          _GOODPUT, runs=((8, 0),)),
    # Trees drafted through the kept blocks on the target's cache, and on
    # the draft's own (moved) cache.
    _case("self-tree-first-2-shared-adapter-tree:2,2", "self-tree",
          _SELF_VARIANTS["first-2-shared-adapter"], verifier="tree:2,2",
          batch=4, runs=((9, 0),), fast=True),
    _case("self-tree-skip-middle-tree-wor:parents", "self-tree",
          _self_skip, verifier="tree-wor:parents=-1,-1,0,1,2", batch=4,
          runs=((9, 0),), fast=True),
    # A prefix of no blocks on its own cache, moved by the tree round (it
    # raised an IndexError while tracing). The skip set above keeps an own
    # cache of real blocks in the fast tier.
    _case("self-tree-embed-only-tree:2,1", "self-tree",
          _SELF_VARIANTS["embed-only"], verifier="tree:2,1", batch=4,
          runs=((9, 0),)),
    # Ragged prompts with a 1-token one, and EOS.
    _case("eagle-gpt2-g3", "eagle:gpt2", _eagle(2), 3, batch=6,
          runs=((3, 0),), checks=(_stops_at_eos,), fast=True),

    # ---- The full tier.
    *(_case(f"decode-good-g{g}-b{b}", "decode", _good, g, batch=b,
            runs=_twice(b), min_alpha=0.5)
      for g, b in _DECODE_GRID if (g, b) != (3, 8)),
    *(_case(f"decode-bad-g{g}-b{b}", "decode", _bad, g, batch=b,
            runs=_twice(b)) for g, b in _DECODE_GRID),
    _case("markov-token", "markov", _markov_draft, 3, batch=2,
          runs=((0, 5),)),
    # Three self-draft variants on both flavours at batch 8, every variant
    # at batch 1 (slow).
    *(_case(f"self-{f}-{name}-g4-b8", f"self:{f}", _SELF_VARIANTS[name], 4,
            runs=((12, 0),))
      for f in _FLAVOURS
      for name in ("first-1", "skip-middle", "first-2-shared-adapter")),
    *(_case(f"self-{f}-{name}-g3-b1", f"self:{f}", draft, 3, batch=1,
            runs=((4, 0),), slow=True)
      for f in _FLAVOURS for name, draft in _SELF_VARIANTS.items()),
    # Another Transformer drafting a tree level by level, kept and rejected
    # at the root; a bigram of the target's greedy text, which keeps
    # full-depth paths of an irregular tree and of one wider than the walk
    # unrolls.
    _case("tree-llama-transformer-tree:2,2,1", "tree:llama",
          _tree_transformer, verifier="tree:2,2,1", batch=3, runs=((0, 4),),
          checks=(_keeps_drafts, _rejects_at_the_root)),
    _case("tree-gpt2-bigram-tree-wor:parents", "tree:gpt2",
          _greedy_text_bigram, verifier="tree-wor:parents=-1,-1,-1,0,3,1",
          batch=3, runs=((0, 4),), checks=(_keeps_drafts,)),
    _case("tree-gpt2-bigram-tree-wor:12,1", "tree:gpt2", _greedy_text_bigram,
          verifier="tree-wor:12,1", batch=3, runs=((0, 4),),
          checks=(_keeps_drafts,)),
    # Traversal verification: at T = 0 the greedy walk, as token-level
    # (tests/test_traversal.py runs its own walk at T = 0 too).
    _case("tree-llama-transformer-traversal:2,2,1", "tree:llama",
          _tree_transformer, verifier="traversal:2,2,1", batch=3,
          runs=((0, 4),), checks=(_keeps_drafts, _rejects_at_the_root)),
    _case("self-tree-skip-middle-traversal-wor:parents", "self-tree",
          _self_skip, verifier="traversal-wor:parents=-1,-1,0,1,2", batch=4,
          runs=((9, 0),)),
    _case("draft-length-self-shared-confidence-b1", "draft-length",
          _self(1, share_cache=True), _CONFIDENCE, batch=1, runs=((1, 0),),
          slow=True),
    _case("draft-length-independent-goodput-b1", "draft-length",
          _independent, _GOODPUT, batch=1, runs=((1, 0),), slow=True),
    _case("eagle-llama-g3", "eagle:llama", _eagle(2), 3, batch=6,
          runs=((3, 0),), checks=(_stops_at_eos,), slow=True),
    _case("eagle-gpt2-g1-no-eos", "eagle:gpt2-no-eos", _eagle(2), 1,
          batch=6, runs=((1, 0),), slow=True),
    _case("eagle-llama-confidence", "eagle:llama-16", _eagle(4),
          sj.Confidence(threshold=0.3, gamma_max=3), batch=4, runs=((9, 3),),
          slow=True),
]


@functools.cache
def _reference(setting_name, batch, seed, key):
  setting = SETTINGS[setting_name]
  prompts, lengths = setting.prompts(batch, seed)
  return sj.generate(setting.target(), prompts, lengths,
                     jax.random.key(key), max_new_tokens=setting.max_new_tokens,
                     sampling=sj.GREEDY, eos_id=setting.eos_id)


def _check_adaptive_stats(out, rule):
  """Each round's length is what the row could keep, at most what the round
  drafted; the formula is priced at those lengths."""
  s = out.summary()
  assert sum(s["accept_hist"]) == sum(s["length_hist"]) == s["rounds"]
  drafted_B = np.asarray(out.stats.length_hist) @ np.arange(rule.gamma_max + 1)
  assert (drafted_B <= np.asarray(out.stats.draft_calls)).all()
  assert (np.asarray(out.stats.accepted) <= drafted_B).all()
  a = s["alpha_hat"]
  want = sum(k * sum(a ** i for i in range(n + 1))
             for n, k in enumerate(s["length_hist"])) / s["rounds"]
  assert s["formula_tokens_per_target_call"] == pytest.approx(want)
  ragged = np.count_nonzero(s["length_hist"]) > 1
  assert math.isnan(s["expected_tokens_per_target_call"]) == ragged


def _check_tree_stats(out, verifier, batch):
  """A tree of depth d: one level per draft pass, d per round, and a kept
  depth in [0, d] per round."""
  depth = sj.get_verifier(verifier).topology.max_depth
  assert np.asarray(out.stats.accept_hist).shape == (batch, depth + 1)
  s = out.summary()
  assert s["draft_calls"] == depth * s["rounds"]
  assert s["verified"] <= depth * s["rounds"]


@pytest.mark.parametrize("case", CASES)
def test_greedy_speculative_equals_autoregressive(case):
  setting = SETTINGS[case.setting]
  target = setting.target()
  for seed, key in case.runs:
    prompts, lengths = setting.prompts(case.batch, seed)
    ref = _reference(case.setting, case.batch, seed,
                     key if setting.ref_key is None else setting.ref_key)
    out = sj.speculative_generate(
        target, case.draft(target, ref), prompts, lengths,
        jax.random.key(key), gamma=case.gamma, verifier=case.verifier,
        max_new_tokens=setting.max_new_tokens, sampling=sj.GREEDY,
        eos_id=setting.eos_id)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    s = out.summary()
    assert s["accepted"] <= s["verified"] <= s["draft_calls"], s
    # Greedy rows start from the prior: the loop scored no prompt.
    assert not np.asarray(out.stats.prompt_scored).any()
    if case.min_alpha is not None:
      assert s["alpha_hat"] > case.min_alpha, s
    if isinstance(case.gamma, sj.Confidence | sj.Goodput):
      _check_adaptive_stats(out, case.gamma)
    if isinstance(sj.get_verifier(case.verifier), sj.TreeVerifier):
      _check_tree_stats(out, case.verifier, case.batch)
    for check in case.checks:
      check(out, setting)
