"""specjax.harness.figures on a small synthetic sweep.

The rows are generated from the accounting formulas plus noise, in the schema
experiments/sweep.py writes, so these tests pin the reader, the file set, the
Table 3 numbers and the best-gamma choice without running any model.
"""

import json
import os

import matplotlib.axes
import matplotlib.image
import numpy as np
import pytest

from specjax import accounting
from specjax import stats
from specjax.harness import figures
from specjax.harness.figures import plots
from specjax.harness import measure

# (name, kind, params, alpha at T=0, alpha at T=1, c). Acceptance counts are
# exact multiples so the pooled alpha of every (draft, T) is known exactly.
DRAFTS = (
    ("unigram", "unigram", 256, 0.10, 0.12, 0.01),
    ("bigram", "bigram", 65536, 0.21, 0.19, 0.01),
    ("prompt-lookup", "prompt_lookup", 0, 0.30, 0.25, 0.005),
    ("draft-0.1m", "transformer", 100_000, 0.61, 0.55, 0.05),
    ("distilled-0.1m", "distilled", 100_000, 0.74, 0.66, 0.05),
)
GAMMAS = (1, 2, 3, 4)
TARGET = "target-5m"


def _row(name, kind, params, temperature, gamma, alpha, c, rng):
  verified = 1000 * gamma
  accepted = int(round(alpha * verified))
  a = accepted / verified
  r = 1.0 + 0.1 * gamma
  tokens = float(accounting.expected_tokens_per_pass(a, gamma))
  predicted = float(accounting.walltime_improvement(a, gamma, c, r))
  speedup = predicted * (1 + rng.normal(0, 0.03))
  return {
      "draft": name, "draft_kind": kind, "draft_params": params,
      "target": TARGET, "target_params": 5_000_000,
      "temperature": temperature, "gamma": gamma, "rows": 8,
      "alpha_hat": a, "alpha_se": float(np.sqrt(a * (1 - a) / verified)),
      "one_minus_tv": float(np.clip(a + rng.normal(0, 0.01), 0, 1)),
      "verified": verified, "accepted": accepted,
      "tokens_per_target_call": tokens + rng.normal(0, 0.02),
      "tokens_per_target_call_se": 0.02,
      "predicted_tokens_per_target_call": tokens,
      "c": c, "r": r, "ar_tokens_per_s": 100.0,
      "spec_tokens_per_s": 100.0 * speedup, "speedup": speedup,
      "speedup_se": 0.03 * predicted if kind != "unigram" else None,
      "predicted_speedup": predicted, "efficiency": speedup / predicted,
      "accept_hist": [1] * (gamma + 1),
      **_decomposition(a, gamma, c, r, rng),
  }


def _decomposition(alpha, gamma, c, r, rng):
  """The cost-model fields of a row: synthetic costs, a measured round
  within noise of the predicted one."""
  costs = measure.LoopCosts(
      batch_size=1, prompt_len=64, max_new_tokens=128, gamma=gamma,
      draft_window_s=1.5 * c * 1e-3, draft_step_s=c * 1e-3,
      verify_s=r * 1e-3, other_s=1e-4, target_prefill_s=2e-3,
      draft_prefill_s=1e-4, call_s=1e-4, ar_step_s=1e-3, ar_other_s=5e-5,
      ar_prefill_s=2e-3, ar_call_s=1e-4)
  pred = measure.predict(costs, alpha)
  parts = measure.decompose(
      costs, alpha, round_s=costs.round_s * (1 + rng.normal(0, 0.02)),
      ar_round_s=costs.ar_round_s, loop_rounds=pred["loop_rounds"],
      null_draft_round_s=costs.verify_s + costs.other_s)
  factors = parts.pop("factors")
  return {**{k: v for k, v in costs.as_dict().items()
             if k not in ("c", "r", "gamma")},
          **parts, **{f"factor_{k}": v for k, v in factors.items()},
          "decode_efficiency_se": 0.02}


def _constructed(temperature, gamma, speedup):
  """A draft whose measured speedups are set by hand (best gamma known)."""
  row = _row("handmade", "transformer", 10_000, temperature, gamma, 0.5, 0.05,
             np.random.default_rng(0))
  row.update(speedup=speedup, efficiency=speedup / row["predicted_speedup"])
  return row


HANDMADE = {0.0: (1.10, 1.50, 1.30, 0.90),  # best gamma 2
            1.0: (0.80, 0.70, 0.60, 0.50)}  # loses everywhere; best gamma 1


def _write_sweep(path):
  rng = np.random.default_rng(0)
  rows = []
  for name, kind, params, a0, a1, c in DRAFTS:
    for t, a in ((0.0, a0), (1.0, a1)):
      rows += [_row(name, kind, params, t, g, a, c, rng) for g in GAMMAS]
  for t, speeds in HANDMADE.items():
    rows += [_constructed(t, g, s) for g, s in zip(GAMMAS, speeds)]
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, figures.SWEEP_FILE), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  with open(os.path.join(path, figures.METADATA_FILE), "w") as f:
    json.dump({"device": "cpu:TFRT_CPU_0", "git_commit": "0123456789abcdef01",
               "seed": 0, "jax_version": "0.4.35",
               "config": {"target": TARGET}}, f)
  return rows


@pytest.fixture(scope="module")
def made(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("sweep"))
  _write_sweep(d)
  return d, figures.make_all(d)


@pytest.mark.full
def test_make_all_writes_every_file(made):
  d, paths = made
  expected = [os.path.join(d, f"{n}.{e}") for n in figures.FIGURE_NAMES
              for e in ("png", "pdf")]
  expected += [os.path.join(d, "table3.md"), os.path.join(d, "summary.txt")]
  assert sorted(paths) == sorted(expected)
  for p in expected:
    assert os.path.getsize(p) > 0, p
  for p in expected:
    if p.endswith(".png"):
      image = matplotlib.image.imread(p)
      assert image.shape[0] > 100 and image.shape[1] > 100, p
      assert np.ptp(image) > 0, f"{p} is blank"


def test_table3_rows(made):
  d, _ = made
  text = open(os.path.join(d, "table3.md")).read()
  assert ("| GPT-like (97M) [paper] | .03 / .03 | .05 / .05 | .88 / .89 "
          "(GPT-like 6M) |") in text
  # The best Transformer draft (plain or distilled) by mean alpha is named.
  assert ("| target-5m (5M) [ours] | .10 / .12 | .21 / .19 | .74 / .66 "
          "(distilled-0.1m) |") in text
  # Provenance from metadata.json.
  assert "cpu:TFRT_CPU_0" in text and "0123456789" in text


def test_table3_missing_cells():
  rows = [r for r in _write_sweep_rows() if r["draft_kind"] != "bigram"
          and not (r["draft"] == "unigram" and r["temperature"] == 1.0)]
  text = figures.table3_markdown(rows, {})
  assert "| target-5m (5M) [ours] | .10 / – | – | .74 / .66" in text


def test_table3_interval_is_over_prompts_when_rows_are_recorded():
  """At T = 0 every gamma judges one greedy text per prompt: Table 3 pools
  the cells prompt by prompt, so two gammas of the same two texts are two
  units, not twice as many independent drafts."""
  rows = [r for r in _write_sweep_rows() if r["draft"] == "bigram"]
  header = "## Every draft (α̂ pooled over γ, "
  old = figures.table3_markdown(rows, {})
  assert header + "±95% binomial CI over judged drafts" in old
  for r in rows:  # two prompts: one accepts every draft, one none
    half = r["verified"] // 2
    r["row_verified"], r["row_accepted"] = [half, r["verified"] - half], [
        half, 0]
    r["accepted"] = half
  text = figures.table3_markdown(rows, {})
  assert header + "±95% CI over prompts)" in text
  a, se = stats.clustered_alpha(
      *[[sum(r[k][i] for r in rows if r["temperature"] == 0.0)
         for i in (0, 1)] for k in ("row_accepted", "row_verified")])
  assert f"| {a:.3f} ± {figures.Z95 * se:.3f} |" in text, text
  assert se > 0.4  # the binomial over 7,500 drafts would read .006


def test_round_decomposition_draws_a_negative_split_whole(tmp_path,
                                                           monkeypatch):
  """A measured draft part < 0 (the null-draft loop slower than the real
  one) was drawn at 0, stacking verify + other above the measured round."""
  rows = [r for r in _write_sweep_rows() if r["temperature"] == 0.0]
  cell = rows[0]
  cell["measured_draft_s"] = -1e-4
  cell["measured_verify_s"] = (cell["measured_round_s"] - cell["other_s"]
                               + 1e-4)
  bars = []
  real_bar = matplotlib.axes.Axes.bar
  def bar(self, x, height, *args, **kwargs):
    bars.append((round(float(x), 2), float(height), kwargs.get("color")))
    return real_bar(self, x, height, *args, **kwargs)
  monkeypatch.setattr(matplotlib.axes.Axes, "bar", bar)
  figures.plot_round_decomposition(rows, str(tmp_path / "f"))
  measured = [b for b in bars if b[0] == 0.2]  # the first cell's right bar
  tpr = cell["max_new_tokens"] / cell["measured_loop_rounds"]
  assert measured == [(0.2, pytest.approx(1e3 * cell["measured_round_s"]
                                          / tpr), plots._UNSPLIT)]


def _write_sweep_rows():
  rng = np.random.default_rng(1)
  return [_row(n, k, p, t, g, a, c, rng)
          for n, k, p, a0, a1, c in DRAFTS
          for t, a in ((0.0, a0), (1.0, a1)) for g in GAMMAS]


def _summary_line(summary, draft, temperature):
  for line in summary.splitlines():
    parts = line.split()
    if parts[:2] == [draft, f"{temperature:g}"]:
      return parts
  raise AssertionError(f"no summary line for {draft} T={temperature}")


def test_summary_best_gamma(made):
  d, _ = made
  summary = open(os.path.join(d, "summary.txt")).read()
  parts = _summary_line(summary, "handmade", 0.0)
  assert parts[2] == "2" and parts[5] == "1.50"
  assert _summary_line(summary, "handmade", 1.0)[2] == "1"
  assert "LOSES" in summary and "handmade at T=1" in summary
  best = figures.best_cells(figures.load_results(d)[0])
  assert best[("handmade", 0.0)]["gamma"] == 2


def test_summary_all_win():
  rows = [r for r in _write_sweep_rows() if r["draft"] == "distilled-0.1m"]
  for r in rows:
    r["speedup"] = 1.2
  assert "Speculation wins" in figures.summary_table(rows)


def test_load_results_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="sweep.jsonl"):
    figures.load_results(str(tmp_path))
  path = tmp_path / figures.SWEEP_FILE
  path.write_text('{"draft": "unigram"\n')
  with pytest.raises(ValueError, match=r"sweep\.jsonl:1: not valid JSON"):
    figures.load_results(str(tmp_path))
  path.write_text(json.dumps({"draft": "unigram"}) + "\n")
  with pytest.raises(ValueError, match=r"sweep\.jsonl:1: missing key"):
    figures.load_results(str(tmp_path))
  path.write_text("\n")
  with pytest.raises(ValueError, match=r"sweep\.jsonl: empty"):
    figures.load_results(str(tmp_path))
  row = json.dumps(_write_sweep_rows()[0])
  path.write_text(row + "\n" + row + "\n")
  with pytest.raises(ValueError, match=r"sweep\.jsonl:2: .* repeats line 1"):
    figures.load_results(str(tmp_path))


def _efficiency_line(rows, key, alpha_min, lo, hi):
  """The report's summary line for `key`, computed here from the rows."""
  eff = np.array([r[key] for r in rows if r["alpha_hat"] >= alpha_min])
  share = np.mean((eff >= lo) & (eff <= hi))
  return (f"median {np.median(eff):.3f}, {share:.0%} of {eff.size} cells in "
          f"[{lo:g}, {hi:g}] (range {eff.min():.2f}-{eff.max():.2f})")


def test_efficiency_report_states_median_share_and_range():
  rows = _write_sweep_rows()
  report = figures.efficiency_report(rows)
  assert "over the cells with alpha_hat >= 0.5" in report
  lines = report.splitlines()
  assert lines[1] == "  decode only: " + _efficiency_line(
      rows, "decode_efficiency", 0.5, 0.9, 1.1)
  assert lines[2] == "  end to end : " + _efficiency_line(
      rows, "efficiency", 0.5, 0.9, 1.1)
  assert "Every cell outside [0.9, 1.1] has a 95% interval covering 1." \
      in report
  # The cells and the band are the caller's: every cell, a narrow band.
  wide = figures.efficiency_report(rows, alpha_min=0.0, band=(0.99, 1.01))
  assert "alpha_hat >= 0" in wide
  assert wide.splitlines()[1] == "  decode only: " + _efficiency_line(
      rows, "decode_efficiency", 0.0, 0.99, 1.01)
  assert f"of {len(rows)} cells in [0.99, 1.01]" in wide
  with pytest.raises(ValueError, match="band must be"):
    figures.efficiency_report(rows, band=(1.1, 0.9))


def test_efficiency_report_names_the_component_off():
  rows = _write_sweep_rows()
  bad = dict(rows[3])
  costs_round = bad["predicted_round_s"]
  bad.update(decode_efficiency=0.7, decode_efficiency_se=0.01, off="verify",
             factor_verify=0.7, measured_verify_s=bad["predicted_verify_s"]
             + 0.43 * costs_round, alpha_hat=0.9)
  report = figures.efficiency_report(rows[:3] + [bad] + rows[4:])
  assert ("Cells outside [0.9, 1.1] whose 95% interval excludes 1 (decode "
          "only)") in report
  line = next(l for l in report.splitlines() if "decode 0.70" in l)
  assert f"{bad['draft']} T={bad['temperature']:g} g={bad['gamma']}" in line
  assert "verify:" in line and "in the loop vs" in line
  # Sweeps written before the cost model have no report and no figure (f).
  old = [{k: v for k, v in r.items() if "round" not in k} for r in rows]
  assert figures.efficiency_report(old) == ""


# -- The verifier and adaptive-gamma axes -------------------------------------


def _axis_row(draft, verifier, gamma, tokens, speedup, *, alpha=0.6,
              mode="fixed", batch=1, lossy=False, tv=0.0):
  row = _row(draft, "self" if draft.startswith("self") else "bigram", 1000,
             1.0, gamma, alpha, 0.05, np.random.default_rng(gamma))
  row.update(verifier=verifier, exact=not lossy, lossy=lossy,
             gamma_mode=mode, batch_size=batch, tokens_per_target_call=tokens,
             tokens_per_target_call_se=0.01, speedup=speedup,
             spec_tokens_per_s=100.0 * speedup,
             speedup_se=0.01, tv_per_token=tv, tv_per_token_se=0.001,
             mean_draft_length=min(gamma, 3.5))
  return row


def _axis_rows():
  rows = []
  # bigram: block +10% at gamma 2, +2% at gamma 4 (fails +5%), = at gamma 1.
  for g, tok, blk in ((1, 1.6, 1.6), (2, 2.0, 2.2), (4, 2.5, 2.55)):
    rows.append(_axis_row("bigram", "token", g, tok, 1.0 + g / 10))
    rows.append(_axis_row("bigram", "block", g, blk, 1.0 + g / 10))
    rows.append(_axis_row("bigram", "lenient:0.5", g, tok + 0.5, 1.5,
                          lossy=True, tv=0.123))
  # auto vs fixed: at batch 1 auto beats the best (1.4) by 10%; at batch 8 it
  # is 1% below the best (matches); self:1 misses.
  rows.append(_axis_row("bigram", "token", 8, 2.6, 1.54, mode="auto"))
  for g, s in ((1, 1.0), (4, 1.2)):
    rows.append(_axis_row("bigram", "token", g, 1.5, s, batch=8))
  rows.append(_axis_row("bigram", "token", 8, 1.5, 1.188, mode="auto",
                        batch=8))
  for g, s in ((1, 1.3), (4, 1.0)):
    rows.append(_axis_row("self:1", "token", g, 1.5, s))
  rows.append(_axis_row("self:1", "token", 8, 1.5, 1.1, mode="auto"))
  return rows


@pytest.fixture(scope="module")
def axes_made(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("axes"))
  with open(os.path.join(d, figures.SWEEP_FILE), "w") as f:
    for r in _axis_rows():
      f.write(json.dumps(r) + "\n")
  with open(os.path.join(d, figures.METADATA_FILE), "w") as f:
    json.dump({"skipped": [{"draft": "bigram", "temperature": 1.0,
                            "verifier": "block", "gamma": "auto",
                            "batch_size": 1, "reason": "judges as a whole"}]},
              f)
  rows, meta = figures.load_results(d)
  paths = (figures.plot_verifiers(rows, os.path.join(d, "fig_verifiers"), meta)
           + figures.plot_adaptive_gamma(
               rows, os.path.join(d, "fig_adaptive_gamma"), meta))
  return d, paths


def test_axis_figures_are_drawn(axes_made):
  _, paths = axes_made
  assert len(paths) == 4
  for p in paths:
    if p.endswith(".png"):
      image = matplotlib.image.imread(p)
      assert image.shape[0] > 100 and np.ptp(image) > 0, f"{p} is blank"


def test_make_all_routes_each_axis(axes_made, monkeypatch):
  # Which rows each figure gets and which files appear, without drawing
  # (test_make_all_writes_every_file draws the main figures).
  d, _ = axes_made
  seen = {}

  def stub(name):
    def plot(rows, path_stem, metadata=None):
      seen[name] = rows
      return [path_stem + ".png"]
    return plot
  for name in ("plot_alpha_vs_overlap", "plot_tokens_per_pass",
               "plot_speedup_vs_gamma", "plot_speedup_vs_draft_size",
               "plot_round_decomposition", "plot_verifiers",
               "plot_adaptive_gamma"):
    monkeypatch.setattr(plots, name, stub(name))
  paths = figures.make_all(d)
  for name in ("fig_verifiers.png", "fig_adaptive_gamma.png", "verifiers.md",
               "summary.txt", "table3.md", "fig_alpha_vs_overlap.png"):
    assert os.path.join(d, name) in paths, name
  assert {(r["verifier"], r["gamma_mode"], r["batch_size"])
          for r in seen["plot_tokens_per_pass"]} == {("token", "fixed", 1)}
  assert len(seen["plot_verifiers"]) == len(_axis_rows())  # filtered inside
  table = open(os.path.join(d, "verifiers.md")).read()
  assert "| bigram | 1 | 1 | lenient:0.5 | LOSSY | 2 |" in table
  assert "0.1230 ± 0.0020" in table  # TV beside the speedup, 95% interval
  assert "| bigram | 1 | 1 | block | no | 2 |" in table
  summary = open(os.path.join(d, "summary.txt")).read()
  assert "Skipped cells:" in summary and "judges as a whole" in summary
  assert "Block vs token" in summary and "gamma = auto vs" in summary


def test_main_figures_read_token_fixed_smallest_batch_rows(axes_made):
  d, _ = axes_made
  rows, _ = figures.load_results(d)
  main = figures.main_rows(rows)
  assert main and all(r["verifier"] == "token" and r["gamma_mode"] == "fixed"
                      and r["batch_size"] == 1 for r in main)
  # A row written before the axes existed reads as token, fixed, batch 1.
  old = {k: v for k, v in _row("u", "unigram", 1, 0.0, 1, 0.5, 0.01,
                               np.random.default_rng(0)).items()}
  path = os.path.join(d, "old")
  os.makedirs(path)
  with open(os.path.join(path, figures.SWEEP_FILE), "w") as f:
    f.write(json.dumps(old) + "\n")
  (loaded,), _ = figures.load_results(path)
  assert (loaded["verifier"], loaded["gamma_mode"], loaded["batch_size"],
          loaded["lossy"]) == ("token", "fixed", 1, False)


def _gain_interval(token, block, se=0.01):
  """block / token - 1 and its 95% interval, as the report prints them:
  the delta method with both se 0.01 (`_axis_row`) taken as independent."""
  gain = block / token
  half = figures.Z95 * gain * np.hypot(se / block, se / token)
  return f"{gain - 1:+.1%}", f"[{gain - half - 1:+.1%}, {gain + half - 1:+.1%}]"


def _block_lines(report):
  return {l.split()[3]: l.split() for l in report.splitlines()
          if l.startswith("bigram")}


def test_block_vs_token_gain_and_interval(axes_made):
  d, _ = axes_made
  rows = figures.load_results(d)[0]
  lines = _block_lines(figures.block_vs_token_report(rows))
  for g, tok, blk in ((1, 1.6, 1.6), (2, 2.0, 2.2), (4, 2.5, 2.55)):
    gain, interval = _gain_interval(tok, blk)
    # alpha, token, block, gain, the interval's two ends, >= token.
    assert lines[f"g={g}"][4:11] == [
        "0.600", f"{tok:.2f}", f"{blk:.2f}", gain, *interval.split(),
        "yes"], lines[f"g={g}"]
  assert lines["g=2"][7] == "+10.0%"
  assert " ".join(lines["g=1"][11:]) == "(gamma=1: block is token)"
  report = figures.block_vs_token_report(rows)
  assert ("block >= token within 95%: 3 of 3 cells; block > token beyond 95% "
          "(interval above 0): 2 of 2 cells with gamma > 1.") in report
  block_g4 = next(r for r in rows if (r["verifier"], r["gamma"],
                                       r["gamma_mode"]) == ("block", 4,
                                                            "fixed"))
  # Block level with token at gamma 4: the interval covers 0.
  block_g4["tokens_per_target_call"] = 2.5
  report = figures.block_vs_token_report(rows)
  assert _block_lines(report)["g=4"][10] == "yes"
  assert ("block >= token within 95%: 3 of 3 cells; block > token beyond 95% "
          "(interval above 0): 1 of 2 cells with gamma > 1.") in report
  # Block measurably behind token at gamma 4: below 0 beyond the interval.
  block_g4["tokens_per_target_call"] = 2.4
  report = figures.block_vs_token_report(rows)
  gain, interval = _gain_interval(2.5, 2.4)
  assert _block_lines(report)["g=4"][7:11] == [gain, *interval.split(),
                                               "no"]
  assert interval.split()[1].startswith("-"), interval  # the upper end
  assert ("block >= token within 95%: 2 of 3 cells; block > token beyond 95% "
          "(interval above 0): 1 of 2 cells with gamma > 1.") in report


def _speedup_interval(auto, best, se=0.01):
  """auto / best and its 95% interval, as the report prints them (both
  speedup se 0.01, `_axis_row`, taken as independent)."""
  ratio = auto / best
  half = figures.Z95 * ratio * np.hypot(se / auto, se / best)
  return [f"{ratio:.3f}", f"[{ratio - half:.3f},", f"{ratio + half:.3f}]"]


def _adaptive_lines(report):
  return {" ".join(l.split()[:3]): l.split() for l in report.splitlines()
          if l.startswith(("bigram", "self"))}


def test_auto_vs_best_fixed_ratios_and_intervals(axes_made):
  d, _ = axes_made
  report = figures.adaptive_report(figures.load_results(d)[0])
  lines = _adaptive_lines(report)
  # (cell, auto's speedup, best fixed gamma and speedup); tokens/s are
  # 100 x speedup, so both ratios agree here.
  for cell, auto, (g, best) in (("bigram T=1 B=1", 1.54, (4, 1.4)),
                                ("bigram T=1 B=8", 1.188, (4, 1.2)),
                                ("self:1 T=1 B=1", 1.1, (1, 1.3))):
    line = lines[cell]
    assert line[4:8] == [f"{100 * auto:.0f}", f"{min(8, 3.5):.2f}",
                         f"g={g}", f"{100 * best:.0f}"], line
    assert line[8] == f"{auto / best:.3f}", line
    assert line[9:12] == _speedup_interval(auto, best), line
  # The three cells' intervals: above 1, covering 1, below 1.
  ends = [[float(x.strip("[],")) for x in _speedup_interval(*c)[1:]]
          for c in ((1.54, 1.4), (1.188, 1.2), (1.1, 1.3))]
  assert ends[0][0] > 1 and ends[1][0] < 1 < ends[1][1] and ends[2][1] < 1
  assert ("auto/best on tokens/s: median 0.990 (range 0.846-1.100) over 3 "
          "cells.") in report
  assert ("speedup ratio's 95% interval: above 1 in 1, covers 1 in 1, below "
          "1 in 1 of 3 cells.") in report
  # auto/best is on tokens/s, the speedup ratio on speedups: each moves
  # with its own measurement only.
  rows = figures.load_results(d)[0]
  for r in rows:
    if r["draft"] == "self:1" and r["gamma_mode"] == "auto":
      r["spec_tokens_per_s"] = 200.0  # faster than every fixed gamma's
  line = _adaptive_lines(figures.adaptive_report(rows))["self:1 T=1 B=1"]
  assert line[8:10] == [f"{200 / 130:.3f}", "0.846"], line


def test_repeated_cell_includes_the_new_axes(tmp_path):
  a = _axis_row("bigram", "token", 2, 2.0, 1.2)
  b = dict(a, verifier="block")
  path = tmp_path / figures.SWEEP_FILE
  path.write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
  assert len(figures.load_results(str(tmp_path))[0]) == 2
  path.write_text(json.dumps(a) + "\n" + json.dumps(a) + "\n")
  with pytest.raises(ValueError, match="verifier='token'.*repeats line 1"):
    figures.load_results(str(tmp_path))


# -- Audit: mixed settings, load-time validation, honest counts ---------------


def test_one_setting_functions_refuse_mixed_rows(axes_made, tmp_path):
  # _axis_rows mix verifiers, gamma = auto and batch 8: a best gamma or a
  # pooled alpha over them would silently pick a lossy or auto cell.
  rows, meta = figures.load_results(axes_made[0])
  calls = {
      "best_cells": lambda r: figures.best_cells(r),
      "summary_table": lambda r: figures.summary_table(r),
      "table3_markdown": lambda r: figures.table3_markdown(r, meta),
      "efficiency_report": lambda r: figures.efficiency_report(r),
      "plot_speedup_vs_gamma": lambda r: figures.plot_speedup_vs_gamma(
          r, str(tmp_path / "c")),
      "plot_round_decomposition": lambda r: figures.plot_round_decomposition(
          r, str(tmp_path / "f")),
  }
  for name, call in calls.items():
    with pytest.raises(ValueError, match=rf"rows: {name} .*main_rows"):
      call(rows)
  assert not list(tmp_path.iterdir())  # refused before drawing anything


def _write_rows(path, rows):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, figures.SWEEP_FILE), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(path)


@pytest.mark.parametrize("change, key", [
    ({"gamma": 7.9}, "gamma"), ({"gamma": 0}, "gamma"),
    ({"gamma": -3}, "gamma"), ({"gamma": True}, "gamma"),
    ({"temperature": "nan"}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"exact": "false"}, "exact"),
    ({"batch_size": None}, "batch_size"),
    ({"batch_size": "abc"}, "batch_size"),
    ({"batch_size": 0}, "batch_size"),
    ({"verified": None}, "verified"),
    ({"accepted": float("nan")}, "accepted"),
    ({"accepted": 10**6}, "accepted"),  # more than verified
    # Plotted as written: an impossible rate, or NaN with drafts judged.
    ({"alpha_hat": 1.5}, "alpha_hat"), ({"alpha_hat": float("nan")},
                                        "alpha_hat"),
    ({"draft_params": 5}, "draft"),  # line 1 says another size
])
def test_load_results_refuses_values_that_relabel_cells(tmp_path, change,
                                                        key):
  rows = _write_sweep_rows()[:2]
  rows[1].update(change)
  d = _write_rows(tmp_path, rows)
  with pytest.raises(ValueError, match=rf"sweep\.jsonl:2: {key}"):
    figures.load_results(d)


def test_summary_names_drafts_without_a_measured_speedup():
  rows = _write_sweep_rows()
  for r in rows:
    r["speedup"] = None if r["draft"] == "bigram" else 1.2
  text = figures.summary_table(rows)
  assert "No measured speedup" in text
  assert "bigram at T=0; bigram at T=1" in text
  assert "every draft and temperature with a measured speedup" in text
  assert f"0 of {len(rows) - 8} (draft, T, gamma) cells with a measured" \
      in text


def _stub_plots(monkeypatch):
  for name in ("plot_alpha_vs_overlap", "plot_tokens_per_pass",
               "plot_speedup_vs_gamma", "plot_speedup_vs_draft_size",
               "plot_round_decomposition", "plot_verifiers",
               "plot_adaptive_gamma"):
    monkeypatch.setattr(plots, name,
                        lambda rows, stem, metadata=None: [stem + ".png"])


def test_make_all_states_the_rows_main_figures_leave_out(axes_made,
                                                         monkeypatch,
                                                         tmp_path):
  _stub_plots(monkeypatch)
  d, _ = axes_made
  figures.make_all(d)
  summary = open(os.path.join(d, "summary.txt")).read()
  assert ("read 5 of 16 rows (token verifier, fixed gamma, batch 1); left "
          "out:") in summary
  assert "6 rows of other verifiers (block, lenient:0.5)" in summary
  assert "3 token rows with gamma = auto" in summary
  assert "2 token fixed-gamma rows at batch 8" in summary
  # A draft that ran only at a larger batch is named, not silently dropped.
  rows = ([_axis_row("bigram", "token", g, 2.0, 1.2) for g in (1, 2)]
          + [_axis_row("self:1", "token", g, 2.0, 1.2, batch=8)
             for g in (1, 2)])
  d = _write_rows(tmp_path / "batch", rows)
  figures.make_all(d)
  summary = open(os.path.join(d, "summary.txt")).read()
  assert "drafts with no row in them: self:1" in summary
  # Nothing to draw at all (one verifier, not token): an error, not a
  # summary with the models table only.
  d = _write_rows(tmp_path / "block",
                  [dict(r, verifier="block") for r in rows])
  with pytest.raises(ValueError, match="no figure to draw"):
    figures.make_all(d)


def test_adaptive_report_unmeasured_auto_is_na(axes_made):
  rows = figures.load_results(axes_made[0])[0]
  for r in rows:
    if r["draft"] == "self:1" and r["gamma_mode"] == "auto":
      r["spec_tokens_per_s"] = None
  report = figures.adaptive_report(rows)
  line = next(l for l in report.splitlines() if l.startswith("self:1"))
  assert line.endswith("(auto's tokens/s not measured)"), line
  assert line.split()[4] == line.split()[8] == "n/a", line
  assert ("auto/best on tokens/s: median 1.045 (range 0.990-1.100) over 2 "
          "cells (1 more: tokens/s not measured).") in report
  # Its speedups were measured: the speedup ratio still counts.
  assert line.split()[9] == "0.846", line
  assert "below 1 in 1 of 3 cells." in report


def test_adaptive_speedup_ratio_skips_a_missing_fixed_speedup(axes_made):
  rows = figures.load_results(axes_made[0])[0]
  for r in rows:
    if (r["draft"], r["verifier"], r["gamma_mode"], r["batch_size"],
        r["gamma"]) == ("bigram", "token", "fixed", 1, 1):
      r["speedup"] = None  # the first fixed gamma: max() would return NaN
  line = next(l for l in figures.adaptive_report(rows).splitlines()
              if l.startswith("bigram T=1 B=1"))
  assert line.split()[9:12] == _speedup_interval(1.54, 1.4), line


def _two_verifier_auto_rows(axes_made):
  rows = figures.load_results(axes_made[0])[0]
  # A second exact verifier with its own auto and fixed gammas, 3x faster:
  # token's auto must not be judged against its fixed gammas.
  extra = [dict(r, verifier="tree", spec_tokens_per_s=3 * r[
      "spec_tokens_per_s"], speedup=3 * r["speedup"]) for r in rows
           if (r["draft"], r["verifier"], r["batch_size"])
           == ("bigram", "token", 1)]
  return rows + extra


def test_adaptive_report_compares_within_one_verifier(axes_made):
  report = figures.adaptive_report(_two_verifier_auto_rows(axes_made))
  lines = {" ".join(l.split()[:4]): l.split() for l in report.splitlines()
           if l.startswith("bigram")}
  # Each auto against its own verifier's best fixed gamma: 1.54 / 1.4 both
  # times (token's auto against tree's 3x faster fixed gammas would be 0.37).
  for v in ("token", "tree"):
    assert lines[f"bigram T=1 B=1 {v}"][8:10] == ["1.100", "1.100"], lines
  assert "over 4 cells." in report
  assert ("above 1 in 2, covers 1 in 1, below 1 in 1 of 4 cells."
          in report)


def test_adaptive_figure_has_a_column_per_verifier(axes_made, monkeypatch):
  figs = []
  monkeypatch.setattr(plots, "_finish",
                      lambda fig, *a, **k: figs.append(fig) or [])
  figures.plot_adaptive_gamma(_two_verifier_auto_rows(axes_made), "unused")
  titles = [ax.get_title() for ax in figs[0].axes]
  plots.plt.close(figs[0])
  assert "bigram, T = 1, batch 1, tree" in titles, titles
  assert len(titles) == 2 * 3  # batches 1, 8 x (bigram token/tree, self:1)


@pytest.mark.parametrize("tokens", [None, 0.0])
def test_block_vs_token_unmeasured_cell_is_na(axes_made, tokens):
  rows = figures.load_results(axes_made[0])[0]
  for r in rows:
    if (r["verifier"], r["gamma"], r["gamma_mode"]) == ("token", 2, "fixed"):
      r["tokens_per_target_call"] = tokens
  report = figures.block_vs_token_report(rows)
  line = next(l for l in report.splitlines() if l.startswith("bigram")
              and " g=2 " in l + " ")
  assert line.endswith("n/a  (tokens per call not measured)"), line
  assert ("block >= token within 95%: 2 of 2 cells (1 more without tokens "
          "per call); block > token beyond 95% (interval above 0): 1 of 1 "
          "cells with gamma > 1.") in report


def test_adaptive_figure_says_when_auto_was_not_measured(axes_made,
                                                          monkeypatch):
  """A null auto speedup drew a line labelled "auto nan×"."""
  figs = []
  monkeypatch.setattr(plots, "_finish",
                      lambda fig, *a, **k: figs.append(fig) or [])
  rows = figures.load_results(axes_made[0])[0]
  for r in rows:
    if r["gamma_mode"] == "auto":
      r["speedup"] = None
  figures.plot_adaptive_gamma(rows, "unused")
  texts = [t.get_text() for ax in figs[0].axes for t in ax.texts]
  plots.plt.close(figs[0])
  assert texts and all(t == "auto: no measured speedup" for t in texts
                       if t.startswith("auto")), texts


def test_adaptive_rows_keep_exact_verifiers_only(axes_made):
  rows = figures.load_results(axes_made[0])[0]
  lossy = [dict(r, verifier="lenient:0.5", exact=False, lossy=True)
           for r in rows if r["gamma_mode"] == "auto"]
  kept = figures.adaptive_rows(rows + lossy)
  assert kept and all(r["exact"] for r in kept)


def test_batch_scaling_marks_the_crossover_and_skips_unmeasured(monkeypatch):
  """plot_batch_scaling (benchmarks/decode.py --batches) had no test: the
  crossover line sits where the measured decode speedup falls to 1, and a
  batch without a measurement has no say in it."""
  rows = [{"batch_size": b, "decode_speedup": s, "speedup": s,
           "predicted_decode_speedup": s, "predicted_speedup": s,
           "decode_speedup_se": 0.01, "speedup_se": 0.01, "c": 0.1, "r": 1.1,
           "other_s": 1e-4, "ar_step_s": 1e-3}
          for b, s in ((1, 2.0), (2, 1.5), (4, 1.2), (8, 0.8))]
  rows.append(dict(rows[0], batch_size=16, decode_speedup=None))
  figs = []
  monkeypatch.setattr(plots, "_save", lambda fig, *a: figs.append(fig) or [])
  plots.plot_batch_scaling(rows, "unused", {"target": "t"})
  labels = figs[0].axes[0].get_legend_handles_labels()[1]
  plots.plt.close(figs[0])
  cross = accounting.crossover_batch([1, 2, 4, 8], [2.0, 1.5, 1.2, 0.8])
  assert 4 < cross < 8
  assert f"speculation stops paying: B ≈ {cross:.1f}" in labels, labels
