"""`python -m experiments.generate` on the committed tiny checkpoints."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
import specjax as sj
from specjax.harness import autotune
from specjax.harness import drafts
from specjax.harness import textgen
from specjax.models import hf

DATA = REPO / "tests" / "data" / "hf"


@pytest.mark.full
def test_generate_command_prints_text_and_statistics(tmp_path):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the quick brown fox\ndef main():\n")
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.generate",
       f"--target={DATA / 'qwen2'}", f"--draft={DATA / 'qwen2_draft'}",
       f"--prompts_file={prompts}", "--gamma=3", "--max_new_tokens=12",
       "--compare"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  for line in ("--- row 0: 'the quick brown fox'", "--- row 1: 'def main():'",
               "alpha_hat", "tokens per target call", "tokens/s",
               "speedup vs generate", "identical text: True"):
    assert line in out.stdout, out.stdout


def test_gamma_flag_takes_an_int_or_auto():
  assert textgen.parse_gamma("3") == 3
  assert textgen.parse_gamma("auto") == "auto"
  for bad in ("0", "-2", "2.5", "Auto", "", "²"):
    with pytest.raises(ValueError, match="int >= 1"):
      textgen.parse_gamma(bad)
  with pytest.raises(TypeError, match="reads a flag's text"):
    textgen.parse_gamma(3)


def test_texts_leave_out_the_eos_that_ended_a_row():
  """An EOS id need not be a special token (Llama 3 stops on byte 119 too),
  so decoding it would add junk to the text."""
  class Tok:
    eos_ids = (7,)
    decode = staticmethod(lambda ids: ",".join(map(str, ids)))
  result = sj.GenerationResult(
      tokens=np.array([[3, 4, 7, 0], [3, 7, 5, 6], [5, 6, 7, 7]]),
      lengths=np.array([3, 4, 0]), stats=None)
  assert textgen._texts(Tok(), result) == ["3,4", "3,7,5,6", ""]


def test_speedup_is_per_generated_token():
  """Sampled rows stopped by EOS need not emit as many tokens as the
  baseline: the speedup compares tokens/s, not seconds."""
  run = textgen.TextRun(texts=[], summary={}, seconds=1.0, tokens_per_s=194.0,
                        baseline_seconds=0.636, baseline_tokens_per_s=402.5)
  assert run.speedup == pytest.approx(194.0 / 402.5)
  assert textgen.TextRun(texts=[], summary={}, seconds=1.0,
                         tokens_per_s=1.0).speedup is None


def test_compared_calls_take_turns():
  """--compare timed every speculative call, then every generate call: a
  slow spell of the machine during one block went into the speedup."""
  order = []
  fns = {name: (lambda name=name: order.append(name) or np.zeros(()))
         for name in ("speculative", "generate")}
  outs, seconds = textgen._timed(fns, min_seconds=0.0, max_calls=3)
  # One untimed call each, then turns until each ran min_seconds (here one).
  assert order == ["speculative", "generate"] * 2
  assert set(outs) == set(seconds) == set(fns)
  order.clear()
  textgen._timed(fns, min_seconds=1e9, max_calls=3)
  assert order == ["speculative", "generate"] * 4


@pytest.mark.full
def test_gamma_auto_measures_first_and_says_so(monkeypatch):
  """`run(gamma="auto")` prices a Goodput rule through autotune (stubbed
  here: the real one times the loop for tens of seconds), says so before and
  after, and decodes with the rule: greedy, the target's own text."""
  from specjax.harness import autotune  # pylint: disable=import-outside-toplevel
  asked = []
  monkeypatch.setattr(autotune, "measure_goodput", lambda *a, **k: (
      asked.append(k) or sj.Goodput(c=0.1, r=(1.0, 1.1), gamma_max=2)))
  target, tok = hf.load(DATA / "gpt2")
  draft = drafts.make_draft("self:1", target).model
  lines = []
  auto = textgen.run(target, draft, tok, ["the quick"], gamma="auto",
                     max_new_tokens=6, progress=lines.append, compare=True)
  assert len(asked) == 1 and asked[0]["batch_size"] == 1
  assert "measuring" in lines[0] or "timing" in lines[0], lines
  assert len(lines) == 2 and "draft lengths" in lines[1], lines
  assert auto.texts == auto.baseline_texts
  with pytest.raises(ValueError, match="'auto'"):
    textgen.run(target, draft, tok, ["the quick"], gamma="fast")


def test_run_refuses_a_bare_string_and_a_bad_seed():
  """list("hello") would make five one-character prompts."""
  tok = sj.data.ByteTokenizer()
  with pytest.raises(TypeError, match=r"bare str: pass \[texts\]"):
    textgen.run(None, None, tok, "hello")
  with pytest.raises(TypeError, match="seed"):
    textgen.run(None, None, tok, ["hello"], seed="a")
  for seed in (-1, 2**32):  # jax would wrap both onto other seeds
    with pytest.raises(ValueError, match="seed must be"):
      textgen.run(None, None, tok, ["hello"], seed=seed)


def test_a_budget_past_the_context_is_refused_before_anything_runs(
    monkeypatch):
  """check_context names max_new_tokens and the largest that fits (the
  decode loop's own bound: 91 runs, 92 does not), and `run` checks it
  before gamma="auto" times the loop."""
  target, tok = hf.load(DATA / "qwen2")  # 96 positions; "hi" is 2 tokens
  draft = drafts.make_draft("self:1", target).model
  textgen.check_context(target, draft, tok, ["hi"], gamma=4,
                        max_new_tokens=91)
  with pytest.raises(ValueError, match=r"max_new_tokens=92 does not fit the "
                     r"target's context of 96 positions.*<= 91"):
    textgen.check_context(target, draft, tok, ["hi"], gamma=4,
                          max_new_tokens=92)
  monkeypatch.setattr(autotune, "auto_rule", lambda *a, **k: pytest.fail(
      "timed the loop before checking the budget"))
  with pytest.raises(ValueError, match="gamma='auto' drafts up to it"):
    textgen.run(target, draft, tok, ["hi"], gamma="auto", max_new_tokens=90)


@pytest.mark.full
def test_a_sliding_window_checkpoint_loads_with_max_positions(tmp_path):
  """A Mistral whose window is shorter than its context loads only capped
  at the window: the command line said to pass load()'s argument, which it
  had no flag for, under a traceback."""
  import json  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  ckpt = tmp_path / "mistral"
  shutil.copytree(DATA / "mistral", ckpt)
  config = json.loads((ckpt / "config.json").read_text())
  (ckpt / "config.json").write_text(json.dumps(config | {"sliding_window": 16}))
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.generate", f"--target={ckpt}",
       "--draft=self:1", "--prompt=the quick", "--max_new_tokens=4"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
  assert "(On this command line: --max_positions.)" in out.stderr
  target, tok = textgen.load_target(str(ckpt), max_positions=16)
  assert target.max_positions == 16
  # A checkpoint draft keeps its own context where it is shorter than the cap.
  draft = drafts.make_draft(str(DATA / "mistral"), target, tokenizer=tok,
                            max_positions=10**6).model
  assert draft.max_positions == config["max_position_embeddings"]


@pytest.mark.full
def test_plan_device_prices_gamma_auto_without_timing(monkeypatch):
  """`run(gamma="auto", plan_device=...)` takes the roofline's rule and
  times nothing; plan_device without gamma "auto" is refused first."""
  with pytest.raises(ValueError, match="plan_device prices gamma='auto'"):
    textgen.run(None, None, sj.data.ByteTokenizer(), ["hi"], gamma=3,
                plan_device="TPU v6e")
  monkeypatch.setattr(autotune, "measure_goodput", lambda *a, **k: (
      pytest.fail("plan_device must not time this machine")))
  target, tok = hf.load(DATA / "gpt2")
  draft = drafts.make_draft("self:1", target).model
  lines = []
  auto = textgen.run(target, draft, tok, ["the quick"], gamma="auto",
                     max_new_tokens=6, plan_device="H100 SXM",
                     progress=lines.append)
  assert auto.texts[0]  # the loop ran with the rule
  assert len(lines) == 1 and "draft lengths" in lines[0], lines


@pytest.mark.full
def test_plan_device_flag(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  run = lambda *flags: subprocess.run(
      [sys.executable, "-m", "experiments.generate",
       f"--target={DATA / 'gpt2'}", "--draft=self:1", "--prompt=the quick",
       "--max_new_tokens=6", *flags],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  out = run("--gamma=auto", "--plan_device=TPU v5e")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "draft lengths" in out.stdout and "timing" not in out.stdout
  bad = run("--gamma=3", "--plan_device=TPU v5e")
  assert bad.returncode != 0 and "--plan_device prices --gamma=auto" in (
      bad.stderr)
  bad = run("--gamma=auto", "--plan_device=A100")
  assert bad.returncode != 0 and "H100 SXM" in bad.stderr
