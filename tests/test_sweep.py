"""The reproduction pipeline end to end on tiny models: sweep, files, theory."""

import json
import math
import os

import numpy as np
import pytest

from configs import reproduce
from specjax.decode import verifiers
from specjax.harness import drafts as drafts_lib
from specjax.harness import figures
from specjax.harness import measure
from specjax.harness import sweep


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  config = reproduce.get_config("tiny")
  config.cache_dir = str(tmp_path_factory.mktemp("zoo"))
  config.temperatures = (1.0,)
  config.gammas = (1, 2)
  # Two of the preset's three drafts (a count model and a distilled
  # Transformer): each draft's cells cost about 7 s of compiles and timing,
  # and prompt lookup's one-hot path is checked exactly in test_exactness.
  config.drafts = [d for d in config.drafts if d.name != "prompt-lookup"]
  out = str(tmp_path_factory.mktemp("results"))
  rows = sweep.run_config(config, out)
  return out, rows, figures.make_all(out)


@pytest.mark.full
def test_artifacts_exist(results):
  out, rows, written = results
  for name in ("sweep.jsonl", "sweep.csv", "metadata.json", "table3.md",
               "summary.txt"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  assert all(os.path.getsize(p) > 0 for p in written)
  assert sum(p.endswith(".png") for p in written) == 5
  # The rows-so-far file (kept if the grid dies) is gone once all is written.
  assert not os.path.exists(os.path.join(out, sweep.PARTIAL_ROWS))
  with open(os.path.join(out, "metadata.json")) as fh:
    meta = json.load(fh)
  for key in ("config", "corpus", "models", "jax_version", "device", "seed",
              "git_commit"):
    assert key in meta, key
  assert meta["corpus"]["files"] > 100
  loaded, _ = figures.load_results(out)
  assert len(loaded) == len(rows) == 2 * 2  # drafts x gammas at one T


@pytest.mark.full
def test_alpha_hat_agrees_with_one_minus_tv(results):
  _, rows, _ = results
  accepted = sum(r["accepted"] for r in rows)
  verified = sum(r["verified"] for r in rows)
  overlap = sum(r["one_minus_tv"] * r["verified"] for r in rows) / verified
  se = math.sqrt(overlap * (1 - overlap) / verified)
  assert 0.05 < overlap < 0.999  # the test has power: not all or nothing
  assert abs(accepted / verified - overlap) < 5 * se


@pytest.mark.full
def test_tokens_per_pass_matches_the_truncated_formula(results):
  _, rows, _ = results
  for row in rows:
    # The budget cut only ever lowers the expectation.
    assert (row["predicted_tokens_per_target_call"]
            <= row["formula_tokens_per_target_call"] + 1e-12)
    if row["gamma"] != 1:
      continue  # beyond gamma = 1 real text's acceptances are not i.i.d.
    # Each round emits 1 + kept drafts, and one round cut at the budget can
    # only emit fewer: at gamma = 1, verified = rounds, so tokens per call
    # is at most 1 + alpha_hat exactly.
    assert row["tokens_per_target_call"] <= 1 + row["alpha_hat"] + 1e-9
    # The prediction counts each prompt's last round cut at its budget, so
    # it needs no slack beyond the sampling error.
    se = row["tokens_per_target_call_se"]
    assert abs(row["tokens_per_target_call"]
               - row["predicted_tokens_per_target_call"]) < 5 * se + 1e-9, row


@pytest.mark.full
def test_rows_are_complete_and_consistent(results):
  _, rows, _ = results
  # Each distinct pass is timed once: every cell sees the same AR step.
  assert len({r["target_step_s"] for r in rows}) == 1
  for row in rows:
    g = row["gamma"]
    assert len(row["accept_hist"]) == g + 1
    # One row per prompt at batch 1: loop rounds are rounds.
    assert row["measured_loop_rounds"] * row["rows"] == sum(row["accept_hist"])
    assert row["round_s"] == pytest.approx(
        row["draft_window_s"] + (g - 1) * row["draft_step_s"]
        + row["verify_s"] + row["other_s"])
    assert row["measured_draft_s"] + row["measured_verify_s"] + row[
        "other_s"] == pytest.approx(row["measured_round_s"])
    assert row["off"] in ("",) + measure.COMPONENTS
    factors = [v for k, v in row.items() if k.startswith("factor_")]
    assert len(factors) == 4  # acceptance, baseline, draft, verify
    if row["round_s"] == 0:
      # The tiny models' parts, timed over a few ms on a busy machine, can
      # all come out at zero (`measure._ratio` clamps them): then there is
      # no prediction, and the library says so rather than dividing.
      assert math.isnan(row["predicted_decode_speedup"])
      continue
    assert row["predicted_decode_speedup"] == pytest.approx(
        row["max_new_tokens"] / row["predicted_loop_rounds"]
        * row["ar_round_s"] / row["round_s"])
    assert row["efficiency"] == pytest.approx(
        row["speedup"] / row["predicted_speedup"])
    assert np.prod(factors) == pytest.approx(row["decode_efficiency"])


@pytest.mark.full
def test_models_have_heldout_bits_per_byte(results):
  out, _, _ = results
  with open(os.path.join(out, "metadata.json")) as fh:
    models = json.load(fh)["models"]
  uniform = math.log2(259)
  # A fitted bigram of bytes is far better than uniform (3.4 on the full
  # corpus); 20 steps of the tiny target learn something too.
  assert models["bigram"]["heldout_bpb"] < 4.5
  assert models["tiny"]["heldout_bpb"] < uniform - 0.5
  with open(os.path.join(out, "summary.txt")) as fh:
    text = fh.read()
  assert "bits/byte" in text and "Cost model check" in text


# -- The verifier, gamma = auto and batch axes (specjax.harness.sweep.plan / run) -----


def _markov_drafts():
  from specjax import lab  # pylint: disable=import-outside-toplevel
  from specjax.lab import models as lab_models  # pylint: disable=import-outside-toplevel
  target, draft = lab_models.markov_lms(lab.make_markov_pair(1.5, 0.5, 0))
  return target, [drafts_lib.wrap("markov-q", "bigram", draft)]


def test_plan_skips_incompatible_cells_with_a_reason():
  _, drafts = _markov_drafts()
  cells, skipped = sweep.plan(
      drafts, temperatures=(1.0,), gammas=(2, "auto"),
      verifiers=("token", "block", "lenient:0.5"), batch_sizes=(1, 2),
      num_prompts=4)
  assert len(cells) == 2 * 4  # batch x (3 fixed + token auto)
  assert {(c.verifier.spec, c.gamma) for c in cells} == {
      ("token", 2), ("block", 2), ("lenient:0.5", 2), ("token", "auto")}
  assert len(skipped) == 2 * 2
  reasons = {(s["verifier"], s["batch_size"]): s["reason"] for s in skipped}
  assert "as a whole" in reasons[("block", 1)]
  assert "lossy" in reasons[("lenient:0.5", 2)]
  assert all(s["gamma"] == "auto" for s in skipped)


@pytest.mark.parametrize("kwargs,match", [
    (dict(verifiers=("nope",)), "unknown verifier"),
    (dict(gammas=(0,)), "ints >= 1 or 'auto'"),
    (dict(gammas=("sometimes",)), "ints >= 1 or 'auto'"),
    (dict(batch_sizes=(3,)), "does not divide"),
    (dict(temperatures=(1.0, -1.0)), "temperature"),
    (dict(temperatures=()), "temperatures is empty"),
])
def test_plan_refuses_bad_axes_before_running(kwargs, match):
  _, drafts = _markov_drafts()
  axes = dict(temperatures=(1.0,), gammas=(1,), verifiers=("token",),
              batch_sizes=(1,), num_prompts=4)
  with pytest.raises(ValueError, match=match):
    sweep.plan(drafts, **{**axes, **kwargs})


@pytest.mark.parametrize("field, value, match", [
    ("gammas", (0,), "ints >= 1 or 'auto'"),
    ("num_prompts", 0, "config.num_prompts must be >= 1"),
    ("batch_sizes", (3,), "does not divide"),
])
def test_run_config_refuses_a_bad_config_before_loading_models(
    monkeypatch, tmp_path, field, value, match):
  """A bad axis fails in a second, not after the models train (minutes)."""
  def load_models(*_):
    raise AssertionError("models were loaded before the config was checked")
  monkeypatch.setattr(drafts_lib, "load_models", load_models)
  monkeypatch.setattr(sweep.data, "stdlib_corpus", load_models)
  config = reproduce.get_config("tiny")
  config[field] = value
  with pytest.raises(ValueError, match=match):
    sweep.run_config(config, str(tmp_path))


def test_run_config_refuses_a_file_as_results_dir(monkeypatch, tmp_path):
  def load_models(*_):
    raise AssertionError("models were loaded before results_dir was checked")
  monkeypatch.setattr(drafts_lib, "load_models", load_models)
  monkeypatch.setattr(sweep.data, "stdlib_corpus", load_models)
  (tmp_path / "a_file").write_text("")
  with pytest.raises(ValueError, match="is a file"):
    sweep.run_config(reproduce.get_config("tiny"), str(tmp_path / "a_file"))


def test_run_records_every_axis(monkeypatch, tmp_path):
  # The bookkeeping, not the timings: costs and the auto rule's c and r are
  # stubbed (each real timing compiles loops; the tiny-config test above
  # covers them), the decodes are real.
  from specjax.decode import draft_length  # pylint: disable=import-outside-toplevel
  from specjax.harness import autotune  # pylint: disable=import-outside-toplevel
  target, drafts = _markov_drafts()
  costs = lambda *a, gamma, batch_size, prompt_len, max_new_tokens, **k: (
      measure.LoopCosts(batch_size, prompt_len, max_new_tokens, gamma,
                        *([1e-4] * 3 + [1e-5] * 4 + [1e-3, 1e-5, 1e-4, 1e-5])))
  monkeypatch.setattr(measure, "loop_costs", costs)
  monkeypatch.setattr(measure, "null_draft_round_seconds",
                      lambda *a, costs, **k: costs.verify_s + costs.other_s)
  monkeypatch.setattr(autotune, "AUTO_GAMMA_MAX", 3)  # fewer branches to compile
  monkeypatch.setattr(autotune, "measure_goodput",
                      lambda *a, gamma_max, **k: draft_length.Goodput(
                          c=0.1, r=(1.0,) * gamma_max))
  timed_calls, timed = [], measure.timed
  def record(call):  # (decoder, gamma, verifier) of every timed call
    timed_calls.append((call.func.__name__, call.keywords.get("gamma"),
                        str(call.keywords.get("verifier"))))
    return timed(call)
  monkeypatch.setattr(measure, "timed", record)
  prompts = np.random.default_rng(0).integers(0, 8, (4, 4)).astype(np.int32)
  skipped, saved = [], []
  rows = sweep.run(target, drafts, prompts, temperatures=(1.0,),
                   gammas=(2, "auto"), max_new_tokens=8, target_name="p",
                   verifiers=("token", "lenient:0.5"), batch_sizes=(2,),
                   call_repeats=2, skipped=skipped, on_row=saved.append)
  assert saved == rows  # each row handed over as soon as it is measured
  # One baseline call per batch and repeat for the whole group, each cell's
  # call beside it: [generate, every cell] x 2 repeats x 2 batches.
  # The auto cell decodes with the rule autotune priced (stubbed here).
  auto = autotune.measure_goodput(gamma_max=3)
  turn = [("generate", None, "None")] + [
      ("speculative_generate", gamma, str(verifiers.get_verifier(v)))
      for v, gamma in (("token", 2), ("token", auto), ("lenient:0.5", 2))]
  assert timed_calls == turn * 4
  assert len({r["ar_tokens_per_s"] for r in rows}) == 1
  by = {(r["verifier"], r["gamma_mode"]): r for r in rows}
  assert set(by) == {("token", "fixed"), ("lenient:0.5", "fixed"),
                     ("token", "auto")}
  assert [s["verifier"] for s in skipped] == ["lenient:0.5"]
  for r in rows:
    assert r["batch_size"] == 2 and r["rows"] == 4
    assert r["exact"] is not r["lossy"]
    assert 1 <= r["mean_draft_length"] <= r["gamma"]
  assert by[("lenient:0.5", "fixed")]["lossy"]
  assert by[("lenient:0.5", "fixed")]["tv_per_token"] > 0.01
  assert by[("token", "fixed")]["tv_per_token"] == 0.0
  auto = by[("token", "auto")]
  # Fixed-gamma predictions only where every round drafted gamma_max.
  assert auto["gamma"] == 3
  assert (auto["predicted_speedup"] is None) == (
      auto["mean_draft_length"] != 3), auto
  assert auto["speedup"] > 0
  assert len(auto["accept_hist"]) == 4
  assert by[("token", "fixed")]["predicted_speedup"] > 0
  sweep.write(rows, {"skipped": skipped}, str(tmp_path))  # rows differ in keys
  loaded, meta = figures.load_results(str(tmp_path))
  assert len(loaded) == 3 and meta["skipped"][0]["verifier"] == "lenient:0.5"


@pytest.mark.full
def test_run_takes_a_feature_level_draft(monkeypatch):
  """An EAGLE head joins the grid like any draft (kind "eagle"), held-out
  bits per byte included (it scores text on its own features)."""
  from specjax.models import TransformerConfig, TransformerLM  # pylint: disable=import-outside-toplevel
  import specjax as sj  # pylint: disable=import-outside-toplevel
  target = TransformerLM.create(TransformerConfig(
      vocab_size=16, d_model=16, num_layers=1, num_heads=2, max_positions=32))
  draft = drafts_lib.wrap("eagle-head", "eagle", sj.EagleDraft.create(target))
  assert draft.params == draft.model.head.param_count()
  costs = lambda *a, gamma, batch_size, prompt_len, max_new_tokens, **k: (
      measure.LoopCosts(batch_size, prompt_len, max_new_tokens, gamma,
                        *([1e-4] * 3 + [1e-5] * 4 + [1e-3, 1e-5, 1e-4, 1e-5])))
  monkeypatch.setattr(measure, "loop_costs", costs)
  prompts = np.random.default_rng(0).integers(0, 16, (2, 4)).astype(np.int32)
  rows = sweep.run(target, [draft], prompts, temperatures=(1.0,),
                   gammas=(2,), max_new_tokens=6, target_name="t")
  assert [(r["draft_kind"], r["rows"]) for r in rows] == [("eagle", 2)]
  assert 0.0 <= rows[0]["alpha_hat"] <= 1.0
  bpb = sweep.heldout_bpb(draft.model, np.zeros((1, 2, 9), np.int32))
  assert np.isfinite(bpb) and bpb > 0
  assert figures.KIND_ORDER.index("eagle") > figures.KIND_ORDER.index("self")


def test_quick_draft_narrows_to_one_named_draft():
  # The benchmarks' one lookup: quick drafts and the studies' self:K.
  for name in ("bigram", "distilled-draft-0.1m@target-3m", "self:1",
               "self:2"):
    config = reproduce.quick_draft(name)
    assert [d.name for d in config.drafts] == [name]
    assert config.target == reproduce.get_config("quick").target
  with pytest.raises(ValueError, match="no quick draft is named 'draft-9m'"):
    reproduce.quick_draft("draft-9m")


def test_model_summaries_score_every_model_but_prompt_lookup():
  """metadata.json's "models": prompt lookup has no law over held-out text
  (None); the target and a count draft get their bits per byte."""
  from specjax.models.prompt_lookup import PromptLookupDraft  # pylint: disable=import-outside-toplevel
  target, drafts = _markov_drafts()
  drafts.append(drafts_lib.wrap("prompt-lookup", "prompt_lookup",
                                PromptLookupDraft(target.vocab_size)))
  windows = np.random.default_rng(0).integers(
      0, target.vocab_size, (1, 2, 9)).astype(np.int32)
  models = sweep.model_summaries("p", target, drafts, windows)
  assert list(models) == ["p", "markov-q", "prompt-lookup"]
  assert models["prompt-lookup"]["heldout_bpb"] is None
  assert models["prompt-lookup"]["kind"] == "prompt_lookup"
  for name in ("p", "markov-q"):
    bpb = models[name]["heldout_bpb"]
    assert np.isfinite(bpb) and bpb > 0, models[name]
  assert models["p"]["kind"] == "target"


# -- Refusals before any work (no models trained, nothing timed) -------------


def _named(name, kind="bigram"):
  return drafts_lib.Draft(name, kind, 0, object())  # plan reads names and kinds


@pytest.mark.parametrize("kwargs,match", [
    (dict(gammas=(2, 2)), "gammas repeats 2"),
    (dict(gammas=("auto", "auto")), "gammas repeats 'auto'"),
    (dict(temperatures=(1, 1.0)), "temperatures repeats 1.0"),
    (dict(verifiers=("lenient:0.5", "lenient:0.50")),
     "verifiers repeats 'lenient:0.5'"),
    (dict(batch_sizes=(1, 1)), "batch_sizes repeats 1"),
    (dict(drafts=[_named("a"), _named("a", "unigram")]), "drafts.*repeats 'a'"),
])
def test_plan_refuses_a_repeated_axis_value(kwargs, match):
  """A repeat would measure a cell twice and figures would refuse the file."""
  axes = dict(drafts=[_named("a")], temperatures=(1.0,), gammas=(1, "auto"),
              verifiers=("token",), batch_sizes=(1,), num_prompts=4)
  axes.update(kwargs)
  with pytest.raises(ValueError, match=match):
    sweep.plan(axes.pop("drafts"), **axes)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch_sizes=()), ValueError, "batch_sizes is empty"),
    (dict(temperatures=1.0), TypeError, "temperatures must be a sequence"),
    (dict(batch_sizes=1), TypeError, "batch_sizes must be a sequence"),
    (dict(verifiers="token"), TypeError, "verifiers must be a sequence"),
    (dict(gammas="auto"), TypeError, "gammas must be a sequence"),
    (dict(drafts=["bigram"]), TypeError, r"drafts\[0\] must be a Draft"),
    (dict(gammas=("auto",), verifiers=("block",)), ValueError,
     "would be skipped"),
])
def test_plan_names_the_bad_argument(kwargs, error, match):
  axes = dict(drafts=[], temperatures=(1.0,), gammas=(1,),
              verifiers=("token",), batch_sizes=(1,), num_prompts=4)
  axes.update(kwargs)
  with pytest.raises(error, match=match):
    sweep.plan(axes.pop("drafts"), **axes)


def test_plan_reads_a_generator_axis_once():
  cells, _ = sweep.plan([_named("a")], temperatures=(t for t in (0.0, 1.0)),
                        gammas=(1,))
  assert [c.temperature for c in cells] == [0.0, 1.0]


def test_the_verifier_axis_takes_the_tree_rules_by_name():
  """Traversal, K-SEQ, greedy drafts and the canonical verifier join the
  axis as registry strings; an "auto" cell of a tree rule is skipped, with
  its reason."""
  cells, skipped = sweep.plan(
      [_named("a")], temperatures=(1.0,), gammas=(2, "auto"),
      verifiers=("token", "traversal-wor:2,1", "spectr:2,1",
                 "greedy-draft:3,1", "canonical:2,1"))
  assert [c.verifier.spec for c in cells] == [
      "token", "token", "traversal-wor:2,1", "spectr:2,1", "greedy-draft:3,1",
      "canonical:2,1"]
  assert {s["verifier"] for s in skipped} == {
      "traversal-wor:2,1", "spectr:2,1", "greedy-draft:3,1", "canonical:2,1"}


def test_wrap_refuses_an_unknown_or_contradicted_kind():
  from specjax.models.ngram import NGramLM  # pylint: disable=import-outside-toplevel
  bigram = NGramLM.fit(np.arange(50) % 5, 8, 2)
  with pytest.raises(ValueError, match="kind must be one of"):
    drafts_lib.wrap("d", "transfomer", bigram)
  with pytest.raises(ValueError, match="contradicts its model"):
    drafts_lib.wrap("d", "unigram", bigram)
  with pytest.raises(TypeError, match="is None"):
    drafts_lib.wrap("d", "bigram", None)


def _row(draft="a"):
  return {**{k: 1 for k in figures.REQUIRED_KEYS}, "draft": draft,
          "draft_kind": "bigram"}


def test_write_reads_a_generator_of_rows_once(tmp_path):
  sweep.write((r for r in [_row("a"), _row("b")]), {}, str(tmp_path))
  with open(tmp_path / "sweep.csv") as fh:
    assert len(fh.read().splitlines()) == 3  # header and both rows


@pytest.mark.parametrize("rows,metadata,match", [
    ([{"draft": "x"}, "oops"], {}, r"rows\[0\] lacks"),
    ([_row(), "oops"], {}, r"rows\[1\] must be a dict"),
    ([], {}, "rows is empty"),
    (_row(), {}, "rows must be a sequence"),
    ([_row()], None, "metadata must be a dict"),
    # The figures refuse a repeated cell: it was written all the same.
    ([_row("a"), _row("b"), _row("a")], {}, r"rows\[2\] repeats the cell "
     r"of rows\[0\] \(draft='a'"),
    ([_row("a"), {**_row("a"), "batch_size": 1}], {},
     r"rows\[1\] repeats the cell of rows\[0\]"),
])
def test_write_checks_before_overwriting(tmp_path, rows, metadata, match):
  """A refused write leaves the good results there as they were."""
  sweep.write([_row("good")], {"a": 1}, str(tmp_path))
  before = {p.name: p.read_text() for p in tmp_path.iterdir()}
  with pytest.raises((TypeError, ValueError), match=match):
    sweep.write(rows, metadata, str(tmp_path))
  assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_write_names_a_file_given_as_results_dir(tmp_path):
  (tmp_path / "a_file").write_text("")
  with pytest.raises(ValueError, match="results_dir .* is a file"):
    sweep.write([_row()], {}, str(tmp_path / "a_file"))


def _no_loading(monkeypatch):
  def load_models(*_):
    raise AssertionError("models were loaded before the config was checked")
  monkeypatch.setattr(drafts_lib, "load_models", load_models)
  monkeypatch.setattr(sweep.data, "stdlib_corpus", load_models)


@pytest.mark.parametrize("field, value, match", [
    ("call_repeats", 0, "config.call_repeats must be >= 1"),
    ("step_repeats", 0, "config.step_repeats must be >= 1"),
    ("step_seconds", -1.0, "config.step_seconds .* must be > 0"),
    ("drafts", [], "config.drafts is empty"),
    ("drafts", [reproduce.draft("bigram", "transfomer")],
     r"config.drafts\[0\].kind must be one of"),
    ("drafts", [reproduce.draft("bigram", "unigram")],
     r"config.drafts\[0\].kind is 'unigram'.*give kind 'bigram'"),
    ("drafts", [reproduce.draft("draft-0.1m", "distilled")],
     "give kind 'transformer'"),
    ("drafts", [reproduce.draft("bigram", "bigram")] * 2,
     "config.drafts .*repeats 'bigram'"),
    ("batch_sizes", (), "config: batch_sizes is empty"),
    ("gammas", (1, 1), "config: gammas repeats 1"),
])
def test_run_config_checks_every_field_before_loading_models(
    monkeypatch, tmp_path, field, value, match):
  _no_loading(monkeypatch)
  config = reproduce.get_config("tiny")
  config[field] = value
  with pytest.raises(ValueError, match=match):
    sweep.run_config(config, str(tmp_path))


@pytest.mark.parametrize("what, match", [
    ("plain dict", "config must be a .*ConfigDict"),
    ("no results_dir", "results_dir must be a directory path"),
    ("drafts as names", r"config.drafts\[0\] must be a ConfigDict"),
])
def test_run_config_names_a_wrong_type_before_loading_models(
    monkeypatch, tmp_path, what, match):
  _no_loading(monkeypatch)
  config, results_dir = reproduce.get_config("tiny"), str(tmp_path)
  if what == "plain dict":
    config = config.to_dict()
  elif what == "no results_dir":
    results_dir = None
  else:
    config.drafts = ["bigram"]
  with pytest.raises(TypeError, match=match):
    sweep.run_config(config, results_dir)
