"""Named model sizes and their training recipes: targets and drafts.

`configs/train.py` and `specjax.harness.zoo` both read this table, so a size means
the same model and the same training run everywhere.

Every size is a byte-level (vocabulary 259) GPT-2-flavour Transformer
(learned positions, LayerNorm, GELU, tied embeddings) with max_positions=1024,
so any draft pairs with any target over the same context. Parameter counts are
exact (`TransformerLM.param_count()`, position table included; at 1024
positions it is a large share of the smallest drafts).

  name         d_model layers heads   parameters
  draft-0.1m        48      2     3      118,224
  draft-0.5m       128      2     4      561,024
  draft-2m         192      4     6    2,026,176
  target-3m        256      4     4    3,488,000
  target-20m       512      6     8   19,572,224
  target-85m       768     12    12   86,041,344
  tiny              32      2     2       35,808   (tests and smoke runs)

'target-3m' and 'target-85m' are the model module's presets 'byte-3m' and
'byte-85m' (GPT-2 small's trunk over bytes).
"""

from __future__ import annotations

import dataclasses

from ml_collections import config_dict

from specjax.models import transformer

SIZES = {
    "draft-0.1m": dict(vocab_size=259, d_model=48, num_layers=2, num_heads=3,
                       max_positions=1024, flavour="gpt2"),
    "draft-0.5m": dict(vocab_size=259, d_model=128, num_layers=2, num_heads=4,
                       max_positions=1024, flavour="gpt2"),
    "draft-2m": dict(vocab_size=259, d_model=192, num_layers=4, num_heads=6,
                     max_positions=1024, flavour="gpt2"),
    "target-3m": dict(transformer.PRESETS["byte-3m"]),
    "target-20m": dict(vocab_size=259, d_model=512, num_layers=6, num_heads=8,
                       max_positions=1024, flavour="gpt2"),
    "target-85m": dict(transformer.PRESETS["byte-85m"]),
    # Seconds to train; for tests and `:tiny` smoke runs, not for results.
    "tiny": dict(vocab_size=259, d_model=32, num_layers=2, num_heads=2,
                 max_positions=64, flavour="gpt2"),
}

# The exact parameter counts in the table above (checked by tests).
PARAM_COUNTS = {
    "draft-0.1m": 118_224,
    "draft-0.5m": 561_024,
    "draft-2m": 2_026_176,
    "target-3m": 3_488_000,
    "target-20m": 19_572_224,
    "target-85m": 86_041_344,
    "tiny": 35_808,
}

# Rough training throughput (tokens/s) of each size's full train step on a
# small CPU host, float32; `specjax.harness.zoo` divides a recipe's tokens
# by it to announce about how long a missing model will take to train. An
# estimate for that message only: nothing else reads it.
TRAIN_TOKENS_PER_S = {
    "draft-0.1m": 28_700,
    "draft-0.5m": 13_900,
    "draft-2m": 4_500,
    "target-3m": 3_400,
    "target-20m": 1_130,
    "target-85m": 160,
    "tiny": 60_000,
}

# The MLP width of the zoo's EAGLE head (`specjax.models.eagle`): with it, a
# head for target-3m (D = 256) has 560,960 parameters of its own, the size
# of draft-0.5m (561,024), so the two compare at equal size.
EAGLE_HEAD_MLP_DIM = 320

_FIELD_TYPES = {"num_kv_heads": int, "head_dim": int, "mlp_dim": int,
                "tie_embeddings": bool}
# TransformerConfig fields a byte-level recipe never sets: RoPE rescaling is
# a Hugging Face import setting (sorted name/value pairs), not a flag.
_NOT_IN_RECIPES = ("rope_scaling",)


def _check_name(name: str) -> None:
  if name not in SIZES:
    raise ValueError(f"Unknown model size {name!r}; choose from "
                     f"{sorted(SIZES)}.")


def transformer_config(name: str) -> transformer.TransformerConfig:
  """The `TransformerConfig` of a named size."""
  _check_name(name)
  return transformer.TransformerConfig(**SIZES[name])


def model_config(name: str) -> config_dict.ConfigDict:
  """`config.model` for a named size: every `TransformerConfig` field.

  Fields the size leaves to the model's defaults are typed placeholders
  (None), so any field can be overridden on the command line, e.g.
  `--config.model.num_kv_heads=2`, and derived fields (head_dim, mlp_dim)
  follow an overridden d_model.
  """
  _check_name(name)
  fields = {}
  for f in dataclasses.fields(transformer.TransformerConfig):
    if f.name in _NOT_IN_RECIPES:
      continue
    if f.name in SIZES[name]:
      fields[f.name] = SIZES[name][f.name]
    elif f.default is None:
      fields[f.name] = config_dict.placeholder(_FIELD_TYPES[f.name])
    else:
      fields[f.name] = f.default
  return config_dict.ConfigDict(fields)


# Per-size recipe: (batch_size, seq_len, peak lr, num_steps, warmup_steps).
# Smaller models take larger learning rates.
_RECIPES = {
    "draft-0.1m": (32, 256, 3e-3, 2000, 100),
    "draft-0.5m": (32, 256, 3e-3, 2000, 100),
    "draft-2m": (32, 256, 2e-3, 2000, 100),
    "target-3m": (32, 256, 1e-3, 2000, 100),
    "target-20m": (32, 256, 6e-4, 2000, 100),
    "target-85m": (32, 256, 3e-4, 2000, 100),
    "tiny": (8, 64, 3e-3, 30, 5),
}


def train_config(size: str, *, runlocal: bool = False) -> config_dict.ConfigDict:
  """The training ConfigDict of a named size (`runlocal`: a 10-step smoke run)."""
  if size not in _RECIPES:
    raise ValueError(f"Unknown model size {size!r}; choose from "
                     f"{sorted(_RECIPES)}.")
  batch_size, seq_len, lr, num_steps, warmup = _RECIPES[size]

  config = config_dict.ConfigDict()
  config.model_name = size
  config.model = model_config(size)

  # "stdlib" or comma-separated files / directories / globs of your own text.
  config.corpus = "stdlib"
  config.corpus_max_bytes = config_dict.placeholder(int)  # None: all ~30 MB
  config.heldout_fraction = 0.05

  config.seed = 0
  config.batch_size = batch_size
  config.seq_len = seq_len
  config.num_steps = num_steps

  config.optim = config_dict.ConfigDict()
  config.optim.lr = lr
  config.optim.warmup_steps = warmup
  config.optim.end_lr_ratio = 0.1
  config.optim.weight_decay = 0.1
  config.optim.b1 = 0.9
  config.optim.b2 = 0.95
  config.optim.eps = 1e-8
  config.optim.clip_norm = 1.0

  config.log_every = 10
  config.eval_every = 250           # 0 disables held-out evaluation
  config.eval_batches = 8
  config.eval_batch_size = 32
  config.eval_seed = 0              # same held-out windows for every run
  config.checkpoint_every = 250     # 0: only at the end
  config.max_to_keep = 3
  config.progress = True

  # Devices: a mesh spec such as "data:2,model:4" (None: every device on
  # `data`), and how parameters are sharded on it: "tp" (heads, MLP width
  # and vocabulary on `model`), "fsdp" (also the embedding width on `data`)
  # or "dp" (replicated). See specjax/sharding.py.
  config.mesh = config_dict.placeholder(str)
  config.sharding = "tp"

  if size == "tiny":
    config.log_every = 5
    config.eval_every = 10
    config.eval_batches = 2
    config.eval_batch_size = 8
    config.checkpoint_every = 10
  if runlocal:
    config.num_steps = 10
    config.optim.warmup_steps = 2
    config.batch_size = min(config.batch_size, 8)
    config.log_every = 2
    config.eval_every = 5
    config.eval_batches = 1
    config.eval_batch_size = 8
    config.checkpoint_every = 5
  return config


# An exit adapter's recipe (`specjax.train.exit_adapter`): the adapter is
# small and its target frozen, so short windows and few steps suffice.
_EXIT_ADAPTER_RECIPE = (16, 128, 1e-3, 300, 20)


def exit_adapter_config(layers: int | tuple[int, ...] = 1,
                        mlp_dim: int | None = None, *,
                        runlocal: bool = False) -> config_dict.ConfigDict:
  """The training ConfigDict of an exit adapter after `layers`.

  `config.model` records the adapter (layers, mlp_dim; the trainer takes the
  adapter itself). Held-out bits per byte does not apply (`eval_every=0`);
  the evaluation fields choose the windows of the final held-out TV.
  """
  batch_size, seq_len, lr, num_steps, warmup = _EXIT_ADAPTER_RECIPE
  config = train_config("tiny", runlocal=runlocal)
  config.model_name = "exit-adapter"
  config.model = config_dict.ConfigDict(
      {"layers": layers, "mlp_dim": config_dict.placeholder(int)})
  config.model.mlp_dim = mlp_dim
  config.batch_size = batch_size
  config.seq_len = seq_len
  config.num_steps = 10 if runlocal else num_steps
  config.optim.lr = lr
  config.optim.warmup_steps = 2 if runlocal else warmup
  config.log_every = 10
  config.eval_every = 0
  config.eval_batches = 4
  config.eval_batch_size = 16
  config.checkpoint_every = 100
  return config
