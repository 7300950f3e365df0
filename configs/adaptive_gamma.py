r"""The adaptive-gamma study's config: gamma="auto" against every fixed gamma.

  python -m experiments.adaptive_gamma                     # self_drafts
  python -m experiments.adaptive_gamma --config=configs/adaptive_gamma.py:sampled
  python -m experiments.adaptive_gamma --config=configs/adaptive_gamma.py:greedy
  python -m experiments.adaptive_gamma \
      --config=configs/adaptive_gamma.py:sampled_long

  python -m experiments.reproduce --config=configs/adaptive_gamma.py:sweep
  python -m experiments.reproduce \
      --config=configs/adaptive_gamma.py:sweep_tiny \
      --results_dir=/tmp/specjax/adaptive_sweep_tiny              # a smoke run

self_drafts   (the default) self:1 and self:2 on the quick job's trained
              target-3m, batch 1 and 8, fixed gammas 1, 2, 3, 4, 6, 8, T = 0,
              16 calls of 64 + 96 tokens a row, 3 timed repeats.
sampled       the side-by-side grid: bigram, the distilled draft and self:1,
              batch 1 and 8, fixed gammas 1, 2, 4, 8, T = 1, 16 calls of
              64 + 128 tokens, 5 repeats (results/adaptive_gamma/T1_held_out).
greedy        the same at T = 0 (results/adaptive_gamma/T0_seq).
sampled_long  as sampled, bigram and the distilled draft at batch 1, 8 calls
              of 64 + 512 tokens (results/adaptive_gamma/T1_b1_long).

sweep         gamma = auto beside every fixed gamma {1, 2, 4, 8} as a sweep
              of the main job (run by experiments.reproduce or
              experiments.sweep, not by experiments.adaptive_gamma): per
              draft (bigram, the distilled draft, self:1, self:2), at batch 1
              and 8, T = 0 and 1, 16 prompts (results/adaptive_gamma/sweep).
sweep_tiny    the same grid on the tiny models (minutes).

Fields (override any, e.g. `--config.drafts=self:1,bigram
--config.batches=1 --config.temperature=1`): target ('quick', the quick
job's trained target, or a `TransformerConfig` preset name such as
byte-85m, with RANDOM weights); drafts (comma-separated draft specs of
`specjax.harness.drafts`: self:K, self:K+adapter with the zoo's exit
adapter, quick target only, or a zoo name such as bigram or
distilled-draft-0.1m@target-3m, trained on first use); batches and gammas
(tuples of ints); threshold (the "auto+conf" variant's confidence stop, in
[0, 1]); temperature; prompts (calls per variant, each on its own held-out
prompts); prompt_len; max_new_tokens; repeats (timed repeats, each on its
own samples); prior ('a:b', also time auto from these pseudo-counts of kept
and rejected drafts; '' for none); widths (a tuple of ints: also time auto
planning these draft lengths; () for none); results_dir (or --results_dir).
"""

from __future__ import annotations

from ml_collections import config_dict

from configs import reproduce

STUDY_PRESETS = ("self_drafts", "sampled", "greedy", "sampled_long")
SWEEP_PRESETS = ("sweep", "sweep_tiny")


def _study(preset: str) -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.preset = preset
  c.target = "quick"
  c.drafts = "self:1,self:2"
  c.batches = (1, 8)
  c.gammas = (1, 2, 3, 4, 6, 8)
  c.threshold = 0.5
  c.temperature = 0.0
  # With 2, the best fixed gamma is partly a lottery of which texts come up.
  c.prompts = 16
  c.prompt_len = 64
  c.max_new_tokens = 96
  c.repeats = 3
  c.prior = ""
  c.widths = ()
  c.results_dir = "results/adaptive_gamma"
  if preset != "self_drafts":
    c.drafts = "bigram,distilled-draft-0.1m@target-3m,self:1"
    c.gammas = (1, 2, 4, 8)
    c.max_new_tokens = 128
    c.repeats = 5
    c.temperature = 0.0 if preset == "greedy" else 1.0
    c.results_dir = {"sampled": "results/adaptive_gamma/T1_held_out",
                     "greedy": "results/adaptive_gamma/T0_seq",
                     "sampled_long": "results/adaptive_gamma/T1_b1_long"
                     }[preset]
  if preset == "sampled_long":
    c.drafts = "bigram,distilled-draft-0.1m@target-3m"
    c.batches = (1,)
    c.prompts = 8
    c.max_new_tokens = 512
  return c


def _sweep(preset: str) -> config_dict.ConfigDict:
  """gamma = auto beside the fixed gammas as a sweep config
  (`configs/reproduce.py`'s fields)."""
  tiny = preset == "sweep_tiny"
  # Beside this study's results/adaptive_gamma.
  c = reproduce.sweep_config(
      f"adaptive_gamma.py:{preset}",
      "results/adaptive_tiny" if tiny else "results/adaptive_gamma/sweep")
  if tiny:
    reproduce.on_tiny_models(c)
    c.drafts = [reproduce.draft("bigram", "bigram"),
                reproduce.draft("self:1", "self")]
    c.temperatures = (1.0,)
    c.gammas = (1, 3, "auto")
    c.batch_sizes = (1, 2)
  else:
    reproduce.on_quick_models(c, num_prompts=16)
    c.drafts = [
        reproduce.draft("bigram", "bigram"),
        reproduce.draft("distilled-draft-0.1m@target-3m", "distilled",
                        reproduce.QUICK_DRAFT, reproduce.QUICK_TARGET),
        reproduce.draft("self:1", "self"), reproduce.draft("self:2", "self")]
    c.gammas = (1, 2, 4, 8, "auto")
    c.batch_sizes = (1, 8)
  return c


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  """`arg`: a preset of the module docstring (default self_drafts)."""
  preset = arg or "self_drafts"
  if preset in STUDY_PRESETS:
    return _study(preset)
  if preset in SWEEP_PRESETS:
    return _sweep(preset)
  raise ValueError(f"configs/adaptive_gamma.py argument {arg!r}: expected "
                   f"one of {', '.join(STUDY_PRESETS + SWEEP_PRESETS)}.")
