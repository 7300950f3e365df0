r"""The paper-figure reproduction: which models, which grid, how much text.

  python -m experiments.reproduce                                   # quick
  python -m experiments.reproduce --config=configs/reproduce.py:full
  python -m experiments.reproduce --config=configs/reproduce.py:verifiers
  python -m experiments.reproduce --config=configs/reproduce.py:adaptive
  python -m experiments.sweep --config=configs/reproduce.py:quick \
      --results_dir=results/quick                  # the sweep alone

quick  (the README's main job; 8-11 min on 2 CPU cores from an empty cache):
       trains target-3m for 150 steps of 16 x 256 bytes, draft-0.1m for 300,
       and draft-0.1m distilled from that target (forward KL) for 300; fits the
       unigram and bigram; then sweeps gamma in {1, 2, 4, 8} at T = 0 and 1
       over 8 held-out prompts of 64 bytes, 128 new bytes each.
full   the recipes' 2,000-step target-3m and drafts 0.1m / 0.5m / 2m, their
       distilled twins, gamma 1..8, 16 prompts of 128 new bytes. Training is
       about 1.3 h (target) + 10 min to 1 h per draft on 2 CPU cores; the sweep
       about 30 min. Models are cached (see `specjax.harness.zoo`), so reruns skip
       training.
verifiers  issue 11: the verifier axis (token, block, and the LOSSY baselines
       lenient:0.5 and typical:0.09,0.3) x gamma {1, 2, 4, 8} at T = 1 on the
       quick models (bigram, draft-0.1m, its distilled twin, self:1), batch 1.
       Same draft and gamma = equal draft compute. Lossy rows carry an
       estimated per-token TV (`specjax.harness.distortion`).
adaptive   issue 12: gamma = auto (the Goodput rule) beside every fixed gamma
       {1, 2, 4, 8}, per draft (bigram, the distilled draft, self:1, self:2),
       at batch 1 and 8, T = 0 and 1, 16 prompts.
tiny   seconds; for tests of the pipeline only. verifiers_tiny and
       adaptive_tiny: the two grids above on the tiny models (smoke runs).

Axes beyond drafts x temperatures x gammas (defaults in brackets): verifiers
[("token",)], any registry string of `specjax.decode.verifiers`; gammas may
hold "auto"; batch_sizes [(1,)], each dividing num_prompts. Drafts named
`self:k` (kind "self") are the target's first k blocks (`SelfDraft`, sharing
its cache); one named `eagle-head@<target>` (kind "eagle") is the zoo's
EAGLE head for the target (give it the target's overrides as
teacher_overrides). Cells that cannot run (block or lossy verifier with
gamma = auto) are skipped and listed in metadata.json's "skipped".

Every model comes from `specjax.harness.zoo`, trained on the interpreter's standard
library when missing; prompts are cut from its held-out split.
"""

from __future__ import annotations

from ml_collections import config_dict

# Held-out bits per byte once, at the end: an evaluation reads 8 x 32 x 256
# bytes, about 6 s of the target's forward passes on 2 cores. (Evaluation
# and checkpointing are not part of a zoo key: the weights are the same.)
_QUICK_TARGET = {"num_steps": 150, "batch_size": 16, "eval_every": 150,
                 "checkpoint_every": 50, "optim.warmup_steps": 15}


def draft_budget(num_steps: int) -> dict:
  """Recipe overrides of a quick-job draft trained `num_steps` steps of 16 x
  256 bytes (the quick job's drafts: 300)."""
  return {"num_steps": num_steps, "batch_size": 16, "eval_every": 100,
          "checkpoint_every": 100, "optim.warmup_steps": max(1, num_steps // 10)}


def head_budget(num_steps: int) -> dict:
  """`draft_budget` for an EAGLE head (no held-out evaluation: it is not a
  language model). `python -m experiments.eagle` trains the quick target's
  at 300 steps."""
  return {k: v for k, v in draft_budget(num_steps).items()
          if k != "eval_every"}


_QUICK_DRAFT = draft_budget(300)
_PRESETS = ("quick", "full", "tiny", "verifiers", "adaptive", "verifiers_tiny",
            "adaptive_tiny")


# The tiny presets' recipe: minutes on 2 cores, for smoke runs and tests.
_TINY_FAST = {"num_steps": 20, "eval_every": 10, "checkpoint_every": 0,
              "progress": False}
# The verifier axis of the verifiers presets (exact, then lossy baselines).
_VERIFIERS = ("token", "block", "lenient:0.5", "typical:0.09,0.3")


def _tiny_run(c):
  """The tiny target and the tiny presets' prompt, budget and timing sizes."""
  c.target = "tiny"
  c.target_overrides = _pairs(_TINY_FAST)
  c.num_prompts = 2
  c.prompt_len = 16
  c.max_new_tokens = 24
  c.step_seconds = 0.01
  c.step_repeats = 2
  c.call_repeats = 1


def _pairs(overrides):
  # Dotted keys (optim.warmup_steps) cannot be ConfigDict keys: keep pairs.
  return tuple(sorted((overrides or {}).items()))


def _draft(name, kind, overrides=None, teacher_overrides=None):
  return config_dict.ConfigDict({
      "name": name, "kind": kind, "overrides": _pairs(overrides),
      "teacher_overrides": _pairs(teacher_overrides)})


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: one of _PRESETS (default quick); see the module docstring."""
  preset = arg or "quick"
  if preset not in _PRESETS:
    raise ValueError(f"configs/reproduce.py argument {arg!r}: expected one of "
                     f"{', '.join(_PRESETS)}.")
  c = config_dict.ConfigDict()
  c.preset = preset
  c.cache_dir = config_dict.placeholder(str)  # None: $SPECJAX_CACHE or ~/.cache
  c.results_dir = f"results/{preset}"
  c.seed = 0
  c.temperatures = (0.0, 1.0)
  # Per timed loop of forward passes (each also run at twice the length);
  # every pass of every loop shape is timed once per sweep.
  c.step_seconds = 0.05
  c.step_repeats = 5
  # Timed calls per prompt and decoder (the fewest seconds count): one slow
  # spell of a shared machine then cannot decide a cell.
  c.call_repeats = 2
  c.verifiers = ("token",)
  c.batch_sizes = (1,)
  if preset in ("verifiers", "adaptive"):
    c.target = "target-3m"
    c.target_overrides = _pairs(_QUICK_TARGET)
    bigram = _draft("bigram", "bigram")
    small = _draft("draft-0.1m", "transformer", _QUICK_DRAFT)
    distilled = _draft("distilled-draft-0.1m@target-3m", "distilled",
                       _QUICK_DRAFT, dict(_QUICK_TARGET))
    c.prompt_len = 64
    c.max_new_tokens = 128
    # Beside the separate experiments' results/verifiers and adaptive_gamma.
    c.results_dir = f"results/{preset}_sweep"
    if preset == "verifiers":
      c.drafts = [bigram, small, distilled, _draft("self:1", "self")]
      c.temperatures = (1.0,)
      c.verifiers = _VERIFIERS
      c.gammas = (1, 2, 4, 8)
      c.num_prompts = 8
    else:
      c.drafts = [bigram, distilled, _draft("self:1", "self"),
                  _draft("self:2", "self")]
      c.gammas = (1, 2, 4, 8, "auto")
      c.batch_sizes = (1, 8)
      c.num_prompts = 16
  elif preset in ("verifiers_tiny", "adaptive_tiny"):
    _tiny_run(c)
    c.drafts = [_draft("bigram", "bigram"), _draft("self:1", "self")]
    c.temperatures = (1.0,)
    if preset == "verifiers_tiny":
      c.verifiers = _VERIFIERS
      c.gammas = (1, 3)
    else:
      c.gammas = (1, 3, "auto")
      c.batch_sizes = (1, 2)
  elif preset == "quick":
    c.target = "target-3m"
    c.target_overrides = _pairs(_QUICK_TARGET)
    c.drafts = [
        _draft("unigram", "unigram"),
        _draft("bigram", "bigram"),
        _draft("prompt-lookup", "prompt_lookup"),
        _draft("draft-0.1m", "transformer", _QUICK_DRAFT),
        # The same budget as draft-0.1m: distilled vs corpus-trained, fairly.
        _draft("distilled-draft-0.1m@target-3m", "distilled", _QUICK_DRAFT,
               dict(_QUICK_TARGET)),
    ]
    c.gammas = (1, 2, 4, 8)
    c.num_prompts = 8
    c.prompt_len = 64
    c.max_new_tokens = 128
  elif preset == "full":
    c.target = "target-3m"
    c.target_overrides = ()
    c.drafts = [_draft("unigram", "unigram"), _draft("bigram", "bigram"),
                _draft("prompt-lookup", "prompt_lookup")]
    for size in ("draft-0.1m", "draft-0.5m", "draft-2m"):
      c.drafts.append(_draft(size, "transformer"))
      c.drafts.append(_draft(f"distilled-{size}@target-3m", "distilled"))
    c.gammas = tuple(range(1, 9))
    c.num_prompts = 16
    c.prompt_len = 64
    c.max_new_tokens = 128
  else:  # tiny
    _tiny_run(c)
    c.drafts = [_draft("bigram", "bigram"),
                _draft("prompt-lookup", "prompt_lookup"),
                _draft("distilled-tiny@tiny", "distilled", dict(_TINY_FAST),
                       dict(_TINY_FAST))]
    c.gammas = (1, 3)
  return c


def quick_draft(name: str) -> config_dict.ConfigDict:
  """The quick preset with `drafts` narrowed to the one named `name`, from
  the quick drafts or the adaptive preset's (which add self:1 and self:2 on
  the same target): what the benchmarks load with `drafts.load_models`."""
  config = get_config("quick")
  drafts = [d for d in config.drafts + get_config("adaptive").drafts
            if d.name == name][:1]
  if not drafts:
    raise ValueError(f"no quick or adaptive draft is named {name!r}.")
  config.drafts = drafts
  return config
