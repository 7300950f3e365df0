"""Training a `SelfDraft`'s exit adapter by distillation from its own target.

The student is `SelfDraft(target, layers, adapter=a)`: the target's frozen
embeddings and kept blocks, the trainable adapter `a`, the target's frozen
final norm and head. The teacher is the same target at full depth. The loss
is `distill.distillation_loss` (forward KL by default, as for the zoo's
distilled drafts) and the loop is `trainer.train` with the adapter as the
trained model and the target as the frozen `aux`: the same batches, AdamW
recipe, orbax checkpoints (validated against the adapter's config) and
resume. Only the adapter's parameters receive gradients; the target's arrays
are read, never copied or updated.

`train_exit_adapter` runs it and reports the held-out mean TV(p, q) (one
minus the acceptance rate of a draft token at temperature 1) of the draft
with the untrained (identity) and the trained adapter, on the windows the
trainer's evaluation fields select. `load_exit_adapter` reads one back.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from flax import nnx

from specjax import data
from specjax.models import exit_adapter as exit_adapter_lib
from specjax.models import self_draft as self_draft_lib
from specjax.models import transformer as transformer_lib
from specjax.train import checkpoint as checkpoint_lib
from specjax.train import distill
from specjax.train import losses
from specjax.train import recipes
from specjax.train import trainer


def exit_adapter_loss(layers: Any, divergence: str = "forward_kl", *,
                      temperature: float = 1.0) -> losses.LossFn:
  """A `LossFn` for the trainer: `module` is the `ExitAdapterModule`, `aux`
  the frozen target; the student is the adapted `SelfDraft(target, layers)`.

  `layers` is checked here but for its bound, the target's depth, which the
  first call checks (it is the first to see the target)."""
  self_draft_lib.normalise_layers(layers, None, "exit_adapter_loss layers")
  base = distill.distillation_loss(divergence, temperature=temperature)

  def loss_fn(module, batch, rng, target):
    adapter = exit_adapter_lib.ExitAdapter.from_module(module)
    student = self_draft_lib.SelfDraft(target, layers=layers, adapter=adapter)
    return base(student.logits, batch, rng, target)

  return loss_fn


def _check_target(target) -> None:
  if not isinstance(target, transformer_lib.TransformerLM):
    raise TypeError(f"target must be a specjax TransformerLM, got "
                    f"{type(target).__name__}.")


def train_exit_adapter(target: transformer_lib.TransformerLM, layers: Any,
                       workdir: str, *, config: Any = None,
                       mlp_dim: int | None = None,
                       divergence: str = "forward_kl",
                       corpus: data.Corpus | None = None,
                       extra_metadata: dict | None = None
                       ) -> tuple[exit_adapter_lib.ExitAdapter, dict]:
  """Trains (or resumes, from `workdir`) an exit adapter for `target`.

  Args:
    target: the frozen `TransformerLM` (teacher and trunk).
    layers: the kept blocks, as `SelfDraft` takes them (an int k or indices).
    workdir: checkpoints and metrics.jsonl, as `trainer.train`.
    config: a training ConfigDict; default
      `recipes.exit_adapter_config(layers, mlp_dim)`.
      `config.eval_every` must be 0 (see `trainer.train`); the evaluation
      fields choose the held-out windows of the final TV report.
      `config.model` (layers, mlp_dim), where set, must agree with `layers`
      and `mlp_dim`, so that the checkpoints' record is the adapter's.
    mlp_dim: the adapter's hidden width (default `config.model.mlp_dim`, or
      else d_model).
    divergence: one of `distill.DIVERGENCES`.
    corpus: default the config's (`config.corpus`).
    extra_metadata: stored in every checkpoint.

  Returns:
    `(adapter, metrics)`: the trainer's metrics plus `heldout_tv` and
    `heldout_tv_untrained` (mean TV between the target's and the draft's
    next-token distributions at temperature 1, over held-out windows).
  """
  _check_target(target)
  distill.check_divergence(divergence)
  if config is None:
    config = recipes.exit_adapter_config(layers, mlp_dim)
  trainer.check_config(config)
  mlp_dim = _reconciled(config, target, layers, mlp_dim)
  adapter = exit_adapter_lib.ExitAdapter.create(target, layers,
                                                mlp_dim=mlp_dim,
                                                seed=config.seed)
  corpus = trainer.load_corpus(config) if corpus is None else corpus
  adapter, metrics = trainer.train(
      config, workdir, loss_fn=exit_adapter_loss(adapter.config.layers,
                                                 divergence),
      aux=target, corpus=corpus, model=adapter,
      extra_metadata=dict(extra_metadata or {}, divergence=divergence))
  windows = heldout_windows(corpus, config)
  layers = adapter.config.layers
  metrics["heldout_tv"] = distill.mean_tv(
      target, self_draft_lib.SelfDraft(target, layers=layers, adapter=adapter),
      windows)
  metrics["heldout_tv_untrained"] = distill.mean_tv(
      target, self_draft_lib.SelfDraft(target, layers=layers), windows)
  return adapter, metrics


def _reconciled(config, target, layers, mlp_dim):
  """The adapter's mlp_dim: `config.model`'s layers and mlp_dim, where set,
  must be the arguments' (`layers` normalised as `SelfDraft` takes them); an
  unset `mlp_dim` argument takes the config's."""
  model = config.get("model") or {}
  num_layers = target.config.num_layers
  kept = self_draft_lib.normalise_layers(layers, num_layers)
  if (model.get("layers") is not None and self_draft_lib.normalise_layers(
      model["layers"], num_layers, "config.model.layers") != kept):
    raise ValueError(f"config.model.layers is {model['layers']!r} but layers "
                     f"is {layers!r}; they name the adapter's kept blocks and "
                     "must agree (recipes.exit_adapter_config(layers)).")
  if model.get("mlp_dim") is not None:
    if mlp_dim is not None and mlp_dim != model["mlp_dim"]:
      raise ValueError(f"config.model.mlp_dim is {model['mlp_dim']} but "
                       f"mlp_dim is {mlp_dim}; pass one, or the same.")
    mlp_dim = model["mlp_dim"]
  return mlp_dim


def load_exit_adapter(directory: str, target: transformer_lib.TransformerLM,
                      step: int | None = None
                      ) -> tuple[exit_adapter_lib.ExitAdapter, dict]:
  """The adapter saved in `directory` (a workdir or its checkpoints/ dir).

  Refuses (ValueError naming the fields) an adapter made for another target
  architecture; restores bitwise, verified against the stored checksum.
  """
  _check_target(target)
  ckpt = checkpoint_lib.Checkpointer(
      checkpoint_lib.checkpoints_dir(os.fspath(directory)))
  try:
    metadata = ckpt.read_metadata(step)
    checkpoint_lib.check_stored_kind(metadata, "exit-adapter",
                                     ckpt.step_dir(metadata["step"]))
    try:
      config = exit_adapter_lib.ExitAdapterConfig(**metadata["model_config"])
    except (TypeError, ValueError, KeyError) as e:
      raise checkpoint_lib.CheckpointError(
          f"{ckpt.step_dir(metadata['step'])!r} does not hold an exit "
          f"adapter this version of specjax can read: {e}") from e
    graphdef, abstract = nnx.split(nnx.eval_shape(
        lambda: exit_adapter_lib.ExitAdapterModule(config, nnx.Rngs(0))))
    adapter = exit_adapter_lib.ExitAdapter(config=config, graphdef=graphdef,
                                           state=abstract)
    adapter.check_target(target.config, config.layers)
    state, metadata = ckpt.restore({"params": abstract},
                                   step=metadata["step"], model_config=config)
  finally:
    ckpt.close()
  return adapter.replace(state=state["params"]), metadata


def heldout_windows(corpus: data.Corpus, config: Any) -> np.ndarray:
  """int32 `[N, B, seq_len]` held-out windows (the final TV report's)."""
  heldout_N = trainer.corpus_tokens(corpus, "heldout", config.seq_len + 1,
                                    "evaluation")
  return trainer.eval_windows(heldout_N, config)[..., :-1]
