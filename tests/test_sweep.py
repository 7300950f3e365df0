"""The reproduction pipeline end to end on tiny models: sweep, files, theory."""

import json
import math
import os

import numpy as np
import pytest

from configs import reproduce
from specjax import figures
from specjax import sweep


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  config = reproduce.get_config("tiny")
  config.cache_dir = str(tmp_path_factory.mktemp("zoo"))
  config.temperatures = (1.0,)
  config.gammas = (1, 2)
  out = str(tmp_path_factory.mktemp("results"))
  rows = sweep.run_config(config, out)
  return out, rows, figures.make_all(out)


def test_artifacts_exist(results):
  out, rows, written = results
  for name in ("sweep.jsonl", "sweep.csv", "metadata.json", "table3.md",
               "summary.txt"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  assert all(os.path.getsize(p) > 0 for p in written)
  assert sum(p.endswith(".png") for p in written) == 4
  with open(os.path.join(out, "metadata.json")) as fh:
    meta = json.load(fh)
  for key in ("config", "corpus", "models", "jax_version", "device", "seed",
              "git_commit"):
    assert key in meta, key
  assert meta["corpus"]["files"] > 100
  loaded, _ = figures.load_results(out)
  assert len(loaded) == len(rows) == 3 * 2  # drafts x gammas at one T


def test_alpha_hat_agrees_with_one_minus_tv(results):
  _, rows, _ = results
  accepted = sum(r["accepted"] for r in rows)
  verified = sum(r["verified"] for r in rows)
  overlap = sum(r["one_minus_tv"] * r["verified"] for r in rows) / verified
  se = math.sqrt(max(overlap * (1 - overlap), 1e-4) / verified)
  assert abs(accepted / verified - overlap) < 5 * se


def test_gamma_one_tokens_per_pass_is_one_plus_alpha(results):
  _, rows, _ = results
  for row in rows:
    if row["gamma"] != 1:
      continue
    se = max(row["tokens_per_target_call_se"], 1e-3)
    # Each round emits 1 + (accepted?) tokens; only a round cut short by the
    # budget can emit fewer.
    assert row["tokens_per_target_call"] <= 1 + row["alpha_hat"] + 1e-9
    assert abs(row["tokens_per_target_call"]
               - (1 + row["one_minus_tv"])) < 5 * se + 0.05, row


def test_rows_are_complete_and_consistent(results):
  _, rows, _ = results
  # Each distinct pass is timed once: every cell sees the same target step.
  assert len({r["target_step_s"] for r in rows}) == 1
  for row in rows:
    assert row["c"] > 0 and row["r"] > 0 and row["speedup"] > 0
    assert np.isclose(row["efficiency"], row["speedup"] / row["predicted_speedup"])
    assert len(row["accept_hist"]) == row["gamma"] + 1
    assert 0 <= row["alpha_hat"] <= 1 and 0 <= row["one_minus_tv"] <= 1 + 1e-6


def test_models_have_heldout_bits_per_byte(results):
  out, _, _ = results
  with open(os.path.join(out, "metadata.json")) as fh:
    models = json.load(fh)["models"]
  assert models["bigram"]["heldout_bpb"] < models["tiny"]["heldout_bpb"] + 5
  assert 0 < models["bigram"]["heldout_bpb"] < 8
  assert models["prompt-lookup"]["heldout_bpb"] is None
  with open(os.path.join(out, "summary.txt")) as fh:
    assert "bits/byte" in fh.read()
