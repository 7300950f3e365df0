r"""The main job's config: which models, which grid, how much text.

  python -m experiments.reproduce                                   # quick
  python -m experiments.reproduce --config=configs/reproduce.py:full
  python -m experiments.reproduce --config=configs/reproduce.py:tiny \
      --results_dir=/tmp/specjax/tiny                   # a smoke run
  python -m experiments.sweep --config=configs/reproduce.py:quick \
      --results_dir=results/quick                  # the sweep alone

quick  (the default; the README's main job, 8-11 min on 2 CPU cores from an
       empty cache): trains target-3m for 150 steps of 16 x 256 bytes,
       draft-0.1m for 300, and draft-0.1m distilled from that target
       (forward KL) for 300; fits the unigram and bigram; then sweeps gamma
       in {1, 2, 4, 8} at T = 0 and 1 over 8 held-out prompts of 64 bytes,
       128 new bytes each.
full   the recipes' 2,000-step target-3m and drafts 0.1m / 0.5m / 2m, their
       distilled twins, gamma 1..8, 16 prompts of 128 new bytes. Training is
       about 1.3 h (target) + 10 min to 1 h per draft on 2 CPU cores; the
       sweep about 30 min. Models are cached (see `specjax.harness.zoo`), so
       reruns skip training.
tiny   seconds; for tests of the pipeline only.

The studies' sweep grids on these models are their own configs' presets:
configs/verifiers.py:sweep (the verifier axis) and
configs/adaptive_gamma.py:sweep (gamma = auto beside fixed gammas), each
with a `sweep_tiny` smoke run. Any field can be overridden, e.g.
`--config.num_prompts=4`.

Axes beyond drafts x temperatures x gammas (defaults in brackets): verifiers
[("token",)], any registry string of `specjax.decode.verifiers`; gammas may
hold "auto"; batch_sizes [(1,)], each dividing num_prompts. Drafts named
`self:k` (kind "self") are the target's first k blocks (`SelfDraft`, sharing
its cache); one named `eagle-head@<target>` (kind "eagle") is the zoo's
EAGLE head for the target (give it the target's overrides as
teacher_overrides). Cells that cannot run (block or lossy verifier with
gamma = auto) are skipped and listed in metadata.json's "skipped".

Every model comes from `specjax.harness.zoo`, trained on the interpreter's
standard library when missing; prompts are cut from its held-out split.

The recipes every config on the quick models shares live here, once:
`QUICK_TARGET`, `draft_budget`, `head_budget`, and the builders `draft`,
`sweep_config`, `on_quick_models` and `on_tiny_models`.
"""

from __future__ import annotations

from ml_collections import config_dict

# Held-out bits per byte once, at the end: an evaluation reads 8 x 32 x 256
# bytes, about 6 s of the target's forward passes on 2 cores. (Evaluation
# and checkpointing are not part of a zoo key: the weights are the same.)
QUICK_TARGET = {"num_steps": 150, "batch_size": 16, "eval_every": 150,
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


QUICK_DRAFT = draft_budget(300)
PRESETS = ("quick", "full", "tiny")

# The tiny presets' recipe: minutes on 2 cores, for smoke runs and tests.
TINY_FAST = {"num_steps": 20, "eval_every": 10, "checkpoint_every": 0,
             "progress": False}


def pairs(overrides) -> tuple:
  """Recipe overrides as a config holds them: sorted (key, value) pairs,
  since dotted keys (optim.warmup_steps) cannot be ConfigDict keys."""
  return tuple(sorted((overrides or {}).items()))


def draft(name, kind, overrides=None, teacher_overrides=None
          ) -> config_dict.ConfigDict:
  """One entry of a sweep config's `drafts`: a registry name, its kind and
  (for zoo models) its recipe overrides and its teacher's."""
  return config_dict.ConfigDict({
      "name": name, "kind": kind, "overrides": pairs(overrides),
      "teacher_overrides": pairs(teacher_overrides)})


def sweep_config(preset: str, results_dir: str) -> config_dict.ConfigDict:
  """The fields every sweep config holds, at their defaults; a preset then
  sets its models (`on_quick_models`, `on_tiny_models`) and its grid."""
  c = config_dict.ConfigDict()
  c.preset = preset
  c.cache_dir = config_dict.placeholder(str)  # None: $SPECJAX_CACHE or ~/.cache
  c.results_dir = results_dir
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
  return c


def on_quick_models(c, num_prompts: int) -> None:
  """The quick job's target and its prompt sizes, in place (drafts: the
  preset's own)."""
  c.target = "target-3m"
  c.target_overrides = pairs(QUICK_TARGET)
  c.num_prompts = num_prompts
  c.prompt_len = 64
  c.max_new_tokens = 128


def on_tiny_models(c) -> None:
  """The tiny target and the tiny presets' prompt, budget and timing sizes,
  in place."""
  c.target = "tiny"
  c.target_overrides = pairs(TINY_FAST)
  c.num_prompts = 2
  c.prompt_len = 16
  c.max_new_tokens = 24
  c.step_seconds = 0.01
  c.step_repeats = 2
  c.call_repeats = 1


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: one of PRESETS (default quick); see the module docstring."""
  preset = arg or "quick"
  if preset not in PRESETS:
    raise ValueError(f"configs/reproduce.py argument {arg!r}: expected one of "
                     f"{', '.join(PRESETS)} (the studies' sweeps are "
                     "configs/verifiers.py:sweep and "
                     "configs/adaptive_gamma.py:sweep).")
  c = sweep_config(preset, f"results/{preset}")
  if preset == "quick":
    on_quick_models(c, num_prompts=8)
    c.drafts = [
        draft("unigram", "unigram"),
        draft("bigram", "bigram"),
        draft("prompt-lookup", "prompt_lookup"),
        draft("draft-0.1m", "transformer", QUICK_DRAFT),
        # The same budget as draft-0.1m: distilled vs corpus-trained, fairly.
        draft("distilled-draft-0.1m@target-3m", "distilled", QUICK_DRAFT,
              QUICK_TARGET),
    ]
    c.gammas = (1, 2, 4, 8)
  elif preset == "full":
    on_quick_models(c, num_prompts=16)
    c.target_overrides = ()  # the recipe's 2,000 steps
    c.drafts = [draft("unigram", "unigram"), draft("bigram", "bigram"),
                draft("prompt-lookup", "prompt_lookup")]
    for size in ("draft-0.1m", "draft-0.5m", "draft-2m"):
      c.drafts.append(draft(size, "transformer"))
      c.drafts.append(draft(f"distilled-{size}@target-3m", "distilled"))
    c.gammas = tuple(range(1, 9))
  else:  # tiny
    on_tiny_models(c)
    c.drafts = [draft("bigram", "bigram"),
                draft("prompt-lookup", "prompt_lookup"),
                draft("distilled-tiny@tiny", "distilled", TINY_FAST,
                      TINY_FAST)]
    c.gammas = (1, 3)
  return c


def quick_draft(name: str) -> config_dict.ConfigDict:
  """The quick preset with `drafts` narrowed to the one named `name`: a
  quick draft, or `self:K` (the quick target's first K blocks, as the
  studies' sweeps run them): what the benchmarks load with
  `drafts.load_models`."""
  config = get_config("quick")
  drafts = [d for d in config.drafts if d.name == name]
  if not drafts and name.startswith("self:"):
    drafts = [draft(name, "self")]
  if not drafts:
    raise ValueError(f"no quick draft is named {name!r} (the quick drafts: "
                     f"{', '.join(d.name for d in config.drafts)}; or "
                     "self:K).")
  config.drafts = drafts
  return config
