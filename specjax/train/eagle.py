"""Training an `EagleHead` by distillation on a frozen target's features.

At every position j of a corpus window the target gives its feature h_j
(final-norm output) and its next-token logits; the head reads the pairs
(h_{j-1}, e_j) (`specjax.models.eagle`; teacher forcing: the target's true
features) and predicts f_j. The loss is EAGLE's two terms (default weights
10 and 1, EAGLE's ratio):

  feature_weight * smooth_l1(f_j - h_j)   (mean over the width D)
  + kl_weight * KL(p_j || q_j)            (q_j = softmax(LM head(f_j)), the
                                           target's shared head; at
                                           `temperature`)

averaged over non-PAD targets. The KL term trains the head for what the
coupling pays for (distribution match, as `distill` does for token drafts);
the regression keeps f on the target's feature manifold, which is what the
head reads back as input while drafting.
`divergence` puts another of `distill.DIVERGENCES` in the KL's place, e.g.
"tv", 1 - acceptance itself, DistillSpec's choice for token drafts.

`train_head` runs `trainer.train` (same batches, optimizer, orbax
checkpoints and resume) on the head's parameters, with the target as the
frozen `aux`; `load_head` restores one. `specjax.harness.zoo.load("eagle-head@<target>")`
trains and caches one per target recipe.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
from ml_collections import config_dict
from flax import nnx

from specjax import _checks
from specjax import data
from specjax.models import eagle
from specjax.models.transformer import TransformerConfig
from specjax.models.transformer import TransformerLM
from specjax.train import checkpoint as checkpoint_lib
from specjax.train import distill
from specjax.train import losses
from specjax.train import recipes
from specjax.train import trainer

KIND = "eagle-head"  # recorded in every head checkpoint's metadata
# The default loss weights: EAGLE's 10 : 1 of regression to classification.
# Teacher-forced acceptance is flat over a wide range of the ratio around it,
# and lower with the KL term alone.
FEATURE_WEIGHT = 10.0
KL_WEIGHT = 1.0
# The head's inputs (`specjax.models.eagle`), also in the metadata. A head
# whose metadata lacks it has no input norms and reads the bare token
# embedding (no position embedding on a 'gpt2' target); `load_head` refuses it.
INPUTS = "norm(features), norm(embed_inputs)"
# The training schedule a head takes by default: a draft of about its size.
RECIPE_OF = "draft-0.5m"


def _smooth_l1(x):
  """Huber with threshold 1: x^2 / 2 inside [-1, 1], |x| - 1/2 outside."""
  a = jnp.abs(x)
  return jnp.where(a < 1.0, 0.5 * x * x, a - 0.5)


def teacher_forcing(frozen, inputs_BxT: jax.Array):
  """What a head is trained on, from the frozen target module's pass over
  `inputs_BxT` (int `[B, T]`), gradients stopped: (positions `[B, T]`,
  features h `[B, T, D]`, the target's next-token logits `[B, T, V]`)."""
  b, t = inputs_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  hidden_BxTxD, _ = frozen.features(inputs_BxT, positions_BxT, None)
  hidden_BxTxD = jax.lax.stop_gradient(hidden_BxTxD)
  teacher_BxTxV = jax.lax.stop_gradient(frozen.head(hidden_BxTxD))
  return positions_BxT, hidden_BxTxD, teacher_BxTxV


def eagle_loss(*, feature_weight: float = FEATURE_WEIGHT,
               kl_weight: float = KL_WEIGHT,
               temperature: float = 1.0,
               divergence: str = "forward_kl") -> losses.LossFn:
  """A `LossFn` for an `EagleHeadModule`; its `aux` is the frozen target.

  `kl_weight` weighs `divergence` (one of `distill.DIVERGENCES`; forward KL
  by default). Metrics: `feature_loss` (smooth L1), `kl` (forward KL) and
  `tv` (1 - acceptance of the head's first draft under teacher forcing, at
  `temperature`), whatever the divergence trained.
  """
  feature_weight = _checks.check_float("feature_weight", feature_weight)
  kl_weight = _checks.check_float("kl_weight", kl_weight)
  if feature_weight < 0 or kl_weight < 0 or feature_weight + kl_weight <= 0:
    raise ValueError("feature_weight and kl_weight must be >= 0 and not both "
                     f"0, got {feature_weight}, {kl_weight}.")
  # A tiny temperature such as 1e-38 passes a > 0 check yet makes step 0's
  # loss NaN; `check_temperature` refuses it.
  temperature = distill.check_temperature(temperature,
                                          "(it divides the logits)")
  distill.check_divergence(divergence)

  def loss_fn(module, batch, rng, target):
    del rng
    vocab_size, max_positions = losses.module_limits(target)
    # Ids only on an eager call; the train step checks a host batch's.
    tokens_BxT1 = losses.check_tokens(
        losses.batch_tokens(batch), vocab_size=vocab_size,
        max_positions=max_positions, whose="the target's ")
    inputs_BxT, targets_BxT = losses.split_inputs_targets(tokens_BxT1)
    frozen = target.module()
    positions_BxT, hidden_BxTxD, teacher_BxTxV = teacher_forcing(
        frozen, inputs_BxT)
    embeds_BxTxD = jax.lax.stop_gradient(
        frozen.embed_inputs(inputs_BxT, positions_BxT))
    predicted_BxTxD, _ = module(eagle.shift_features(hidden_BxTxD),
                                embeds_BxTxD, positions_BxT, None)
    # Gradients reach the head through the (frozen) LM head.
    student_BxTxV = frozen.head(predicted_BxTxD)
    mask_BxT = losses.target_mask(targets_BxT,
                                  losses.pad_id_for(teacher_BxTxV.shape[-1]))
    count = jnp.maximum(mask_BxT.sum(), 1.0)
    mean = lambda x_BxT: (x_BxT * mask_BxT).sum() / count
    feature = mean(jnp.mean(_smooth_l1(
        predicted_BxTxD.astype(jnp.float32)
        - hidden_BxTxD.astype(jnp.float32)), axis=-1))
    between = lambda name: mean(distill.divergence_BxT(
        name, teacher_BxTxV / temperature, student_BxTxV / temperature))
    kl, tv = between("forward_kl"), between("tv")
    trained = {"forward_kl": kl, "tv": tv}.get(divergence)
    if trained is None:
      trained = between(divergence)
    loss = feature_weight * feature + kl_weight * trained
    return loss, {"feature_loss": jax.lax.stop_gradient(feature),
                  "kl": jax.lax.stop_gradient(kl),
                  "tv": jax.lax.stop_gradient(tv)}

  return loss_fn


def train_config(target_config: TransformerConfig, *,
                 mlp_dim: int | None = recipes.EAGLE_HEAD_MLP_DIM,
                 recipe_of: str = RECIPE_OF) -> config_dict.ConfigDict:
  """A trainer config for a head of `target_config`.

  The schedule is `recipe_of`'s (a draft of about the head's size by
  default); `config.model` is the head's one-block config (`head_config`),
  and held-out evaluation is off (the head is not a language model).
  """
  config = recipes.train_config(recipe_of)
  config.model_name = KIND
  fields = dataclasses.asdict(eagle.head_config(target_config,
                                                mlp_dim=mlp_dim))
  fields.pop("rope_scaling")
  if target_config.rope_scaling:
    raise ValueError("train_config: targets with rope_scaling are not "
                     "supported by the head's config record.")
  config.model = config_dict.ConfigDict(fields)
  config.seq_len = min(config.seq_len, target_config.max_positions)
  config.eval_every = 0
  config.sharding = "dp"  # a small head: replicate it
  return config


def train_head(target: TransformerLM, config: Any, workdir: str, *,
               corpus: data.Corpus | None = None,
               extra_metadata: dict | None = None,
               loss_fn: losses.LossFn | None = None, **kwargs
               ) -> tuple[eagle.EagleDraft, dict]:
  """Trains (or resumes) a head for `target`; returns the draft and metrics.

  Args:
    target: the frozen `TransformerLM` (its features are the teacher).
    config: from `train_config(target.config)` (any field overridable).
    workdir: checkpoints and metrics.jsonl, as `trainer.train` writes them.
    corpus: default `config.corpus`.
    extra_metadata: added to the checkpoints' metadata (`kind` is set).
    loss_fn: default `eagle_loss()`.
    **kwargs: passed to `trainer.train` (e.g. `mesh`).
  """
  if not isinstance(target, TransformerLM):
    raise TypeError(f"target must be a specjax TransformerLM, got "
                    f"{type(target).__name__}.")
  head_cfg = trainer.model_config_from(config)
  want = eagle.head_config(target.config, mlp_dim=head_cfg.mlp_dim)
  if head_cfg != want:
    diff = checkpoint_lib.config_diff(dataclasses.asdict(head_cfg),
                                      dataclasses.asdict(want))
    raise ValueError("config.model is not a head for this target (start from "
                     "specjax.train.eagle.train_config(target.config)):\n  "
                     + "\n  ".join(diff))
  _check_resume_for(workdir, head_cfg, target)
  head, metrics = trainer.train(
      config, workdir, loss_fn=loss_fn or eagle_loss(), aux=target,
      corpus=corpus,
      extra_metadata=dict(extra_metadata or {}, kind=KIND, inputs=INPUTS,
                          target_config=_target_record(target.config)),
      model=eagle.EagleHead.create(head_cfg, config.seed,
                                   target_config=target.config), **kwargs)
  return eagle.EagleDraft(target=target, head=head), metrics


def _check_resume_for(workdir: Any, head_cfg: TransformerConfig,
                      target: TransformerLM) -> None:
  """Raises CheckpointError if `workdir` holds a head trained for another
  target. The head's own config is the same for a deeper target or another
  MLP width; the trainer's resume also refuses another target (its aux
  hash and the recorded `target_config`), but only after loading the corpus
  and restoring the state, and without naming the architecture's fields,
  which this check does first."""
  if not isinstance(workdir, (str, os.PathLike)):
    return  # trainer.train names a bad workdir
  directory = os.path.join(os.fspath(workdir),
                           checkpoint_lib.CHECKPOINTS_SUBDIR)
  if not os.path.isdir(directory):
    return
  ckpt = checkpoint_lib.Checkpointer(directory)
  try:
    if ckpt.latest_step() is None:
      return
    metadata = ckpt.read_metadata(None)
  finally:
    ckpt.close()
  try:
    _check_head_for(head_cfg, target,
                    (metadata.get("extra") or {}).get("target_config"))
  except ValueError as e:
    raise checkpoint_lib.CheckpointError(
        f"{directory!r} holds a head trained for another target; resuming it "
        f"for this one would mix two targets' features. Use a fresh workdir. "
        f"{e}") from None


def _target_record(config: TransformerConfig) -> dict:
  """The target's architecture as a head checkpoint records it (JSON)."""
  return json.loads(json.dumps(checkpoint_lib.model_config_dict(
      eagle.architecture(config))))


def _check_head_for(config: TransformerConfig, target: Any,
                    recorded: dict | None = None) -> None:
  """Raises unless a head of `config` was trained for `target`'s architecture.

  A head's config is its target's with one layer and its own MLP width
  (`head_config`); anything else that differs (flavour, heads, positions,
  width, vocabulary) means another target, whose features it never read.
  Dtypes may differ: a cast target is the same model.
  """
  if not isinstance(target, TransformerLM):
    raise TypeError(f"target must be a specjax TransformerLM, got "
                    f"{type(target).__name__}.")
  diff = eagle.head_mismatch(config, target.config)
  if not diff and recorded is not None:
    # Depth and MLP width are not in a head's config: the record says.
    diff = checkpoint_lib.config_diff(recorded, _target_record(target.config))
  if diff:
    raise ValueError("this head was trained for another target (a head's "
                     "config is its target's, one layer deep; train one for "
                     "this target with specjax.train.eagle.train_head):\n  "
                     + "\n  ".join(diff))


def load_head(directory: str, target: TransformerLM, step: int | None = None
              ) -> tuple[eagle.EagleDraft, dict]:
  """The `EagleDraft` of a head checkpoint (a `train_head` workdir) for `target`.

  Raises `CheckpointError` if the checkpoint is not a head (or a head of an
  earlier input layout, `INPUTS`), and ValueError if it was trained for
  another target architecture (width, vocabulary, flavour, heads, ...;
  dtypes may differ).
  """
  ckpt = checkpoint_lib.Checkpointer(
      checkpoint_lib.checkpoints_dir(os.fspath(directory)))
  try:
    metadata = ckpt.read_metadata(step)
    checkpoint_lib.check_stored_kind(metadata, KIND,
                                     ckpt.step_dir(metadata["step"]))
    config = TransformerConfig(**metadata["model_config"])
    # A head without the record (None) is checked by config.
    recorded = metadata["extra"].get("target_config")
    _check_head_for(config, target, recorded)
    inputs = metadata["extra"].get("inputs", "features, embed (no norms)")
    if inputs != INPUTS:
      raise checkpoint_lib.CheckpointError(
          f"{ckpt.step_dir(metadata['step'])!r} is a head whose inputs are "
          f"{inputs!r}, but heads now read {INPUTS!r} (input norms, and the "
          "target's position embedding with its token embedding); retrain "
          "it with specjax.train.eagle.train_head.")
    graphdef, abstract = nnx.split(nnx.eval_shape(
        lambda: eagle.EagleHeadModule(config, nnx.Rngs(0))))
    state, metadata = ckpt.restore({"params": abstract},
                                   step=metadata["step"])
  finally:
    ckpt.close()
  head = eagle.EagleHead(
      config=config, graphdef=graphdef, state=state["params"],
      target_config=None if recorded is None else eagle.architecture(
          target.config))
  return eagle.EagleDraft(target=target, head=head), metadata
