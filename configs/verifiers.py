r"""The verifier study's config: which verifiers, models and gammas.

  python -m experiments.verifiers                                    # lab
  python -m experiments.verifiers --config=configs/verifiers.py:tiny
  python -m experiments.verifiers --config=configs/verifiers.py:trees
  python -m experiments.verifiers --config=configs/verifiers.py:trees_depth2
  python -m experiments.verifiers --config=configs/verifiers.py:chains
  python -m experiments.verifiers --config=configs/verifiers.py:paired
  python -m experiments.verifiers --config=configs/verifiers.py:weak_drafts
  python -m experiments.verifiers --config=configs/verifiers.py:self_drafts
  python -m experiments.verifiers --config=configs/verifiers.py:eagle

  python -m experiments.reproduce --config=configs/verifiers.py:sweep
  python -m experiments.reproduce --config=configs/verifiers.py:sweep_tiny \
      --results_dir=/tmp/specjax/verifiers_sweep_tiny            # a smoke run

Every verifier (token, block, the lossy baselines) at every gamma, on the
same draft and prompts (same draft and gamma: equal draft compute), beside
the autoregressive baseline:

lab     (the default) the lab's Markov target/draft (V = 8) as CausalLMs;
        tokens per target call is meaningful, wall-clock is not (the target
        is as cheap as the draft). Writes verifiers_lab.csv (with the
        verifier's exact TV to the target from `specjax.lab.verifiers`) and
        fig_verifiers_lab.png.
tiny    a random peaked Transformer target (d=128, 4 layers) and a bigram
        draft fitted to 16k of its own samples: verifiers_tiny.csv and
        fig_verifiers_tiny.png.

Draft trees against the chain of the same depth (same draft, depth = gamma),
on the zoo's quick target-3m (the quick job's recipe, cached by
`python -m experiments.reproduce`), held-out prompts, T = 1; each writes
trees_quick.csv (tokens per target call with a 95% interval, the ratio to
the chain with its interval, seconds of the compiled call, the fewest of 3
timed by turns with the chain's) and fig_trees_quick.png:

trees         tree-wor:3,2,1, tree:3,2,1 and tree-wor:4,1,1 with the
              distilled draft and the bigram (results/verifiers).
trees_depth2  depth-2 trees with the bigram (results/verifiers/depth2).
chains        chain verifiers at a gamma instead of trees (block and the
              lossy baselines at gamma 2 and 4; results/verifiers/block_quick).
weak_drafts   five trees of <= 16 nodes with the unigram and draft-0.1m
              (results/verifiers/weak_drafts).
self_drafts   the default trees with self:1 and self:2, the target's first
              blocks sharing its cache (results/verifiers/self_draft).
eagle         the default trees with the EAGLE head that
              `python -m experiments.eagle` trains (results/verifiers/eagle).

paired  block against token verification on the same drafts at gamma 1..8,
        Rao-Blackwellised (`specjax.harness.expected_tokens`; `samples` draft
        blocks per context): paired_quick.csv and paired_quick.md
        (results/verifiers/paired_quick).

sweep       the verifier axis as a sweep of the main job (run by
            experiments.reproduce or experiments.sweep, not by
            experiments.verifiers): token, block, lenient:0.5 and
            typical:0.09,0.3 x gamma {1, 2, 4, 8} at T = 1 on the quick
            models (bigram, draft-0.1m, its distilled twin, self:1), batch 1,
            8 prompts. Lossy rows carry an estimated per-token TV
            (`specjax.harness.distortion`). Writes results/verifiers/sweep.
sweep_tiny  the same grid on the tiny models (minutes).

Fields (override any, e.g. `--config.gammas=1,2,4 --config.rows=64`):
models ('lab', 'tiny' or 'quick'); verifiers and trees (';'-separated
registry strings of `specjax.decode.verifiers`, since a verifier's own
arguments take commas: --config.verifiers='token;typical:0.09,0.3'; a
`trees` entry is a tree, or a chain verifier at a gamma, '<verifier>@<gamma>'
such as block@4); quick_drafts (comma-separated: zoo drafts, self:k, or
eagle-head@target-3m); gammas and paired_gammas (tuples of ints); rows
(prompts decoded as one batch per cell); max_new_tokens; samples;
results_dir (or --results_dir). `models=lab` and `tiny` read verifiers and
gammas; `models=quick` reads quick_drafts, and trees or (when set)
paired_gammas and samples.
"""

from __future__ import annotations

from ml_collections import config_dict

from configs import reproduce

# The study's presets (the sweep presets are run by experiments.sweep).
STUDY_PRESETS = ("lab", "tiny", "trees", "trees_depth2", "chains", "paired",
                 "weak_drafts", "self_drafts", "eagle")
SWEEP_PRESETS = ("sweep", "sweep_tiny")

# The quick drafts of the tree presets, and of the study's defaults.
_DRAFTS = "distilled-draft-0.1m@target-3m,bigram"
_THREE_DRAFTS = "bigram,draft-0.1m,distilled-draft-0.1m@target-3m"
# The verifier axis: exact, then the lossy baselines.
_VERIFIERS = ("token", "block", "lenient:0.5", "typical:0.09,0.3")


def _study(preset: str) -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.preset = preset
  c.models = "lab"
  c.verifiers = ";".join(_VERIFIERS)
  c.gammas = (1, 2, 3, 4, 6)
  c.trees = "tree-wor:3,2,1;tree:3,2,1;tree-wor:4,1,1"
  c.quick_drafts = _DRAFTS
  c.paired_gammas = ()
  c.samples = 4
  c.rows = 256
  c.max_new_tokens = 48
  c.results_dir = "results/verifiers"
  if preset == "tiny":
    c.models = "tiny"
  elif preset != "lab":  # on the quick models
    c.models = "quick"
    c.rows = 64
    c.max_new_tokens = 64
    c.results_dir = {
        "trees": "results/verifiers",
        "trees_depth2": "results/verifiers/depth2",
        "chains": "results/verifiers/block_quick",
        "paired": "results/verifiers/paired_quick",
        "weak_drafts": "results/verifiers/weak_drafts",
        "self_drafts": "results/verifiers/self_draft",
        "eagle": "results/verifiers/eagle"}[preset]
  if preset == "trees_depth2":
    c.quick_drafts = "bigram"
    c.trees = "tree-wor:4,3;tree-wor:8,1"
  elif preset == "chains":
    c.quick_drafts = _THREE_DRAFTS
    c.trees = "block@2;block@4;lenient:0.5@4;typical:0.09,0.3@4"
  elif preset == "paired":
    c.quick_drafts = _THREE_DRAFTS
    c.paired_gammas = (1, 2, 3, 4, 6, 8)
  elif preset == "weak_drafts":
    c.quick_drafts = "unigram,draft-0.1m"
    c.trees = ("tree-wor:4,3;tree-wor:2,2,2;tree-wor:3,2,1;tree-wor:2,2,1,1;"
               "tree-wor:4,1,1,1")
  elif preset == "self_drafts":
    c.quick_drafts = "self:1,self:2"
  elif preset == "eagle":
    c.quick_drafts = "eagle-head@target-3m"
  return c


def _sweep(preset: str) -> config_dict.ConfigDict:
  """The verifier axis as a sweep config (`configs/reproduce.py`'s fields)."""
  tiny = preset == "sweep_tiny"
  # Beside this study's results/verifiers.
  c = reproduce.sweep_config(
      f"verifiers.py:{preset}",
      "results/verifiers_tiny" if tiny else "results/verifiers/sweep")
  c.temperatures = (1.0,)
  c.verifiers = _VERIFIERS
  if tiny:
    reproduce.on_tiny_models(c)
    c.drafts = [reproduce.draft("bigram", "bigram"),
                reproduce.draft("self:1", "self")]
    c.gammas = (1, 3)
  else:
    reproduce.on_quick_models(c, num_prompts=8)
    c.drafts = [
        reproduce.draft("bigram", "bigram"),
        reproduce.draft("draft-0.1m", "transformer", reproduce.QUICK_DRAFT),
        reproduce.draft("distilled-draft-0.1m@target-3m", "distilled",
                        reproduce.QUICK_DRAFT, reproduce.QUICK_TARGET),
        reproduce.draft("self:1", "self")]
    c.gammas = (1, 2, 4, 8)
  return c


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: a preset of the module docstring (default lab)."""
  preset = arg or "lab"
  if preset in STUDY_PRESETS:
    return _study(preset)
  if preset in SWEEP_PRESETS:
    return _sweep(preset)
  raise ValueError(f"configs/verifiers.py argument {arg!r}: expected one of "
                   f"{', '.join(STUDY_PRESETS + SWEEP_PRESETS)}.")
