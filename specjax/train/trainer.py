"""Training a `TransformerLM` on a byte corpus: state, step, evaluation, loop.

`train(config, workdir)` is the whole run (the absl entry point
`experiments/train.py` only parses flags and calls it; a notebook calls it
directly). Its pieces are public so draft distillation can reuse them with
another loss: `make_train_step(graphdef, optimizer, loss_fn, mesh)` accepts
any `losses.LossFn`, and `train(..., loss_fn=..., aux=...)` runs the same
loop (batching, evaluation, checkpoints, resume) around it.

The train state is a plain dict pytree:

  params     nnx State of the Transformer (float32)
  opt_state  optax state (AdamW moments and the update count)
  step       int32 scalar: the number of updates applied

Reproducibility guarantees:
* Batch k is `specjax.data.batch_at(train_tokens, B, T, config.seed, k)`, a
  pure function of (seed, k), and the step key is
  `fold_in(key(config.seed), k)`; the learning rate reads the update count in
  `opt_state`. A run resumed from the checkpoint at step k therefore computes
  bit-for-bit the losses an uninterrupted run computes (tested).
* Held-out bits per byte is always measured on the same windows
  (`config.eval_seed`), so numbers are comparable across runs and seeds.

Files written under `workdir`:
  checkpoints/<step>/   orbax checkpoints (see `checkpoint.py`)
  metrics.jsonl         one JSON object per event: every `log_every` steps
                        {step, loss (mean over the steps since the previous
                        record), grad_norm and lr (of the last step),
                        tokens_per_s (running average of this call)}; every
                        `eval_every` steps {step, eval_bpb}. On resume, events
                        after the restored step are dropped, so the file
                        describes one consistent run (exact per-step losses
                        are in the metrics `train` returns).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from absl import logging
from flax import nnx

from specjax import _checks
from specjax import data
from specjax import sharding
from specjax.models import transformer as transformer_lib
from specjax.train import checkpoint as checkpoint_lib
from specjax.train import losses
from specjax.train import optim
from specjax.train import parallel

METRICS_FILE = "metrics.jsonl"

# Fields `train` reads; `check_config` names any that is missing.
REQUIRED_FIELDS = ("model", "corpus", "corpus_max_bytes", "heldout_fraction",
                   "seed", "batch_size", "seq_len", "num_steps", "optim",
                   "log_every", "eval_every", "eval_batches", "eval_batch_size",
                   "eval_seed", "checkpoint_every", "max_to_keep", "progress")


# -- configuration -------------------------------------------------------------


def check_config(config: Any) -> None:
  """Raises, naming `config.<field>`, if a field `train` needs is bad."""
  missing = [f for f in REQUIRED_FIELDS if f not in config]
  if missing:
    raise ValueError(f"The train config lacks the fields {missing}; start from "
                     "configs/train.py get_config().")
  missing = [f for f in optim.OPTIM_FIELDS if f not in config.optim]
  if missing:
    raise ValueError(f"config.optim lacks the fields {missing}; start from "
                     "configs/train.py get_config().")
  for name, low in (("batch_size", 1), ("seq_len", 1), ("num_steps", 1),
                    ("seed", 0), ("eval_seed", 0), ("log_every", 1),
                    ("eval_every", 0), ("eval_batches", 1),
                    ("eval_batch_size", 1), ("checkpoint_every", 0),
                    ("max_to_keep", 1)):
    _checks.check_int(f"config.{name}", config[name], low=low)
  # A string such as "False" would be truthy (progress bars on).
  _checks.check_bool("config.progress", config.progress)
  fraction = _checks.check_float("config.heldout_fraction",
                                 config.heldout_fraction)
  if not 0.0 <= fraction < 1.0:
    raise ValueError("config.heldout_fraction must be in [0, 1), got "
                     f"{fraction}; 0.05 holds out about 5% of the files.")


def check_model_config(config: Any) -> transformer_lib.TransformerConfig:
  """Every check `train` makes of a config that trains `config.model`,
  before any work and without touching a device (the mesh is checked in
  `train`): the fields, the model, its sequence length and vocabulary, the
  sharding choice and the optimizer. Returns the model's config.
  `experiments/train.py` runs it to refuse bad flags as usage errors."""
  check_config(config)
  model_config = model_config_from(config)
  check_seq_len(config.seq_len, model_config)
  losses.check_vocab_size(model_config.vocab_size, "config.model.vocab_size",
                          f"set --config.model.vocab_size="
                          f"{data.BYTE_VOCAB_SIZE}.")
  rules_from(config)
  optim.make_optimizer(config.optim, config.num_steps)
  return model_config


def model_config_from(config: Any) -> transformer_lib.TransformerConfig:
  """The `TransformerConfig` that `config.model` describes (None = default)."""
  fields = {k: v for k, v in dict(config.model).items() if v is not None}
  try:
    return transformer_lib.TransformerConfig(**fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model does not describe a valid Transformer: "
                     f"{e}") from e


def check_seq_len(seq_len: int,
                  model_config: transformer_lib.TransformerConfig) -> None:
  """Training windows must fit the model's position table."""
  if seq_len > model_config.max_positions:
    raise ValueError(
        f"config.seq_len={seq_len} is longer than the model's "
        f"max_positions={model_config.max_positions} "
        f"(config.model.max_positions). Fix: set --config.seq_len to at most "
        f"{model_config.max_positions}, or raise "
        "--config.model.max_positions (which makes a different model).")


def load_corpus(config: Any) -> data.Corpus:
  """The corpus `config.corpus` names ("stdlib" or comma-separated paths)."""
  try:
    return data.from_flag(config.corpus,
                          heldout_fraction=config.heldout_fraction,
                          max_bytes=config.corpus_max_bytes)
  except (OSError, ValueError, TypeError) as e:
    raise type(e)(f"config.corpus={config.corpus!r}: {e}") from e


def corpus_tokens(corpus: data.Corpus, split: str, window: int,
                  what: str) -> np.ndarray:
  """The token array of one split, checked to hold at least one window.

  Raises (naming the corpus, the split and the fix) when the split is
  empty, a file is unreadable, or the split is shorter than `window` tokens.
  """
  where = (f"the {split} split of the {corpus.source} corpus "
           f"({len(corpus.files)} files, e.g. {corpus.files[0].path!r})")
  skip_eval = (" Or set --config.eval_every=0 to train without held-out "
               "evaluation." if split == "heldout" else "")
  try:
    tokens_N = corpus.tokens(split)
  except (OSError, ValueError) as e:
    raise type(e)(f"Cannot use {where}: {e}{skip_eval}") from e
  if tokens_N.shape[0] < window:
    raise ValueError(
        f"{where} holds {tokens_N.shape[0]} tokens, fewer than one {what} "
        f"window of config.seq_len + 1 = {window}. Fix: add text to the "
        f"corpus or lower --config.seq_len.{skip_eval}")
  return tokens_N


# -- state and steps -----------------------------------------------------------


def state_shardings(model: transformer_lib.TransformerLM,
                    optimizer: optax.GradientTransformation,
                    mesh: jax.sharding.Mesh, *,
                    rules: Any = None) -> dict:
  """`NamedSharding`s of the train state under the sharding `rules`.

  Parameters follow `specjax.sharding` (default `RULES`: heads, MLP width and
  vocabulary on `model`; `FSDP_RULES` also the embedding width on `data`);
  optimizer moments follow their parameter; everything else (the update
  count, the step) is replicated. `rules=None` replicates everything (plain
  data parallelism).
  """
  rep = parallel.replicated(mesh)
  if rules is None:
    params = jax.tree.map(lambda _: rep, model.state)
  else:
    params = sharding.model_shardings(model, mesh, rules=rules).state
  abstract = jax.eval_shape(optimizer.init, model.state)
  opt_state = optax.tree_map_params(
      optimizer, lambda _, s: s, abstract, params,
      transform_non_params=lambda _: rep)
  return {"params": params, "opt_state": opt_state, "step": rep}


def init_state(model: transformer_lib.TransformerLM,
               optimizer: optax.GradientTransformation,
               mesh: jax.sharding.Mesh, *, rules: Any = None) -> dict:
  """A fresh train state (step 0) for `model`, placed by `state_shardings`.

  The parameters are copied, so donating the state to the train step never
  invalidates `model`'s own arrays.
  """
  shardings = state_shardings(model, optimizer, mesh, rules=rules)
  params = sharding.place(model.state, shardings["params"])
  params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
  opt_state = jax.jit(optimizer.init, out_shardings=shardings["opt_state"])(
      params)
  return {"params": params, "opt_state": opt_state,
          "step": sharding.place(jnp.zeros((), jnp.int32), shardings["step"])}


def make_train_step(graphdef: nnx.GraphDef,
                    optimizer: optax.GradientTransformation,
                    loss_fn: losses.LossFn = losses.next_token_loss, *,
                    mesh: jax.sharding.Mesh,
                    schedule: Any = None,
                    shardings: dict | None = None,
                    aux_shardings: Any = None):
  """The jitted update `step(state, batch, rng, aux) -> (state, metrics)`.

  Args:
    graphdef: the nnx GraphDef of the trained module (`model.graphdef`).
    optimizer: from `optim.make_optimizer`.
    loss_fn: a `losses.LossFn`; gradients flow to `state["params"]` only.
    mesh: the data-parallel mesh; `batch` is sharded over `data`, the state,
      `rng` and `aux` are replicated.
    schedule: optional learning-rate schedule, to report `lr`.
    shardings: the state's shardings (`state_shardings`); None replicates
      the state (data parallel only).
    aux_shardings: shardings of `aux` (e.g. a teacher placed by
      `sharding.shard_model`); None replicates it.

  Returns:
    A function that checks its inputs, then runs the jitted update. `state`
    is donated (its buffers are reused for the new state; do not use it
    after the call). The loss of the step uses the parameters before the
    update and the key `fold_in(rng, state["step"])`. `metrics` holds
    float32 scalars: `loss`, `grad_norm` (before clipping), `lr` when a
    schedule is given, and whatever `loss_fn` returns.

  Before anything runs, `batch` must be a dict whose `tokens` pass
  `losses.check_tokens` against the trained module's (and a model `aux`'s)
  vocab_size and max_positions, and `rng` a PRNG key: an id outside the
  vocabulary would give a NaN loss and NaN parameters (or train on another
  token), a window past max_positions would train on clamped positions.
  Dtype and shape are checked always; the ids only when `tokens` is a numpy
  array (already on the host, a cheap scan), never by fetching a device
  array (a sync per step). `train` checks its corpus' ids once instead.
  """
  if not isinstance(graphdef, nnx.GraphDef):
    raise TypeError(f"graphdef must be an nnx GraphDef (model.graphdef), got "
                    f"{type(graphdef).__name__}.")
  if not all(callable(getattr(optimizer, f, None)) for f in ("init", "update")):
    raise TypeError("optimizer must be an optax GradientTransformation (from "
                    f"optim.make_optimizer), got {type(optimizer).__name__}.")
  if not callable(loss_fn):
    raise TypeError("loss_fn must be a losses.LossFn, a function (module, "
                    f"batch, rng, aux) -> (loss, metrics), got {loss_fn!r}. "
                    "For distillation use distill.distillation_loss(...).")
  if not isinstance(mesh, jax.sharding.Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh (parallel.make_mesh()),"
                    f" got {type(mesh).__name__}.")
  if schedule is not None and not callable(schedule):
    raise TypeError("schedule must be None or a function of the update "
                    f"count, got {type(schedule).__name__}.")

  def step_fn(state, batch, rng, aux):
    step_rng = jax.random.fold_in(rng, state["step"])

    def objective(params):
      return loss_fn(nnx.merge(graphdef, params), batch, step_rng, aux)

    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(
        state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"],
                                          state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
    if schedule is not None:
      metrics["lr"] = jnp.asarray(schedule(state["step"]), jnp.float32)
    return {"params": params, "opt_state": opt_state,
            "step": state["step"] + 1}, metrics

  rep, sharded = parallel.replicated(mesh), parallel.batch_sharded(mesh)
  state_sh = rep if shardings is None else shardings
  aux_sh = rep if aux_shardings is None else aux_shardings
  jitted = jax.jit(step_fn, in_shardings=(state_sh, sharded, rep, aux_sh),
                   out_shardings=(state_sh, rep), donate_argnums=0)
  limits = []  # the trained module's (vocab_size, max_positions), found once

  def step(state, batch, rng, aux):
    if not limits:  # read off the module's config; merging reads no values
      limits.append(losses.module_limits(nnx.merge(graphdef,
                                                   state["params"])))
    tokens = losses.batch_tokens(batch)
    on_host = isinstance(tokens, np.ndarray)
    for (vocab_size, max_positions), whose in (
        (limits[0], "the trained model's "),
        (losses.module_limits(aux), "aux's ")):
      tokens = losses.check_tokens(tokens, vocab_size=vocab_size,
                                   max_positions=max_positions,
                                   read_ids=on_host, whose=whose)
    _checks.as_key("rng", rng)  # validated only: the step folds it as given
    # The checked array (numpy where `tokens` was a list), as the jit expects.
    batch = dict(batch, tokens=tokens)
    return jitted(state, batch, rng, aux)

  return step


def make_eval_step(graphdef: nnx.GraphDef, *, mesh: jax.sharding.Mesh,
                   param_shardings: Any = None):
  """Jitted `(params, tokens_BxT1) -> (bits, bytes)` (see `losses`)."""

  def eval_fn(params, tokens_BxT1):
    return losses.bits_and_bytes(nnx.merge(graphdef, params), tokens_BxT1)

  rep, sharded = parallel.replicated(mesh), parallel.batch_sharded(mesh)
  params_sh = rep if param_shardings is None else param_shardings
  return jax.jit(eval_fn, in_shardings=(params_sh, sharded),
                 out_shardings=rep)


def eval_windows(heldout_N: np.ndarray, config: Any) -> np.ndarray:
  """int32 `[eval_batches, eval_batch_size, seq_len + 1]` held-out windows."""
  return np.stack([
      data.batch_at(heldout_N, config.eval_batch_size, config.seq_len,
                    config.eval_seed, i) for i in range(config.eval_batches)])


def evaluate(eval_step, params, windows: list) -> float:
  """Held-out bits per byte over `windows` (device batches of `[B, T + 1]`)."""
  totals = [eval_step(params, w) for w in windows]
  bits, nbytes = (float(sum(x)) for x in zip(*jax.device_get(totals)))
  return bits / max(nbytes, 1.0)


# -- the loop ------------------------------------------------------------------


# Checkpoint metadata: the losses since the last metrics record (`_loop`).
_UNLOGGED = "unlogged_losses"


class _MetricsLog:
  """`metrics.jsonl`, truncated on (re)start to the events up to `step`."""

  def __init__(self, path: str, keep_through_step: int):
    self.path = path
    kept = []
    if os.path.exists(path):
      with open(path) as fh:
        for line in fh:
          try:
            record = json.loads(line)
          except json.JSONDecodeError:
            continue  # a line cut short by a crash
          if record.get("step", 0) <= keep_through_step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if jax.process_index() == 0:
      with open(path, "w") as fh:
        fh.writelines(kept)

  def write(self, **record) -> None:
    if jax.process_index() != 0:  # one writer in multi-process runs
      return
    with open(self.path, "a") as fh:
      fh.write(json.dumps(record) + "\n")


def train(config: Any, workdir: str, *,
          loss_fn: losses.LossFn = losses.next_token_loss, aux: Any = None,
          corpus: data.Corpus | None = None,
          extra_metadata: dict | None = None,
          mesh: jax.sharding.Mesh | None = None,
          model: Any = None
          ) -> tuple[transformer_lib.TransformerLM, dict]:
  """Trains (or resumes) the model `config` describes; returns it and metrics.

  Args:
    config: a ConfigDict like `configs/train.py` builds (`check_config`
      lists the fields).
    workdir: where checkpoints and metrics.jsonl go. If it holds a
      checkpoint, training resumes from the latest one (after checking that
      it is of the same model, trained with the same `aux` and
      `extra_metadata`) and continues to `config.num_steps`.
    loss_fn: the objective (a `losses.LossFn`); default next-token
      cross-entropy. Evaluation always reports held-out bits per byte.
    aux: passed to `loss_fn` unchanged (e.g. a frozen teacher model); a
      `loss_fn` with a `check_aux(model_config, aux)` attribute has it
      checked before any work.
    corpus: a `data.Corpus` to use instead of building `config.corpus`.
    extra_metadata: JSON dict stored in every checkpoint's metadata.
    mesh: the device mesh, a `Mesh` with a `data` axis or a spec such as
      "data:2,model:4"; default `config.mesh` (a spec; absent or None: all
      devices on axis `data`).
      Parameters and optimizer state are sharded by `config.sharding`:
      "tp" (default: heads, MLP width and vocabulary on `model`), "fsdp"
      (also every parameter's embedding width on `data`) or "dp"
      (replicated). The batch is always split over `data`; losses equal the
      one-device run's up to float summation order. A teacher `aux` that
      names its axes (a `TransformerLM`) is sharded by the same rules.
    model: the freshly initialised model to train instead of
      `TransformerLM.create(config.model, config.seed)`: any pytree with a
      dataclass `config` (stored in, and checked against, the checkpoints),
      an nnx `graphdef` and its `state` (e.g. an `ExitAdapter`, trained with
      a frozen target in `aux`). `config.model` is then ignored. Held-out
      bits per byte needs a model that maps tokens to logits, so
      `config.eval_every` must be 0.

  Returns:
    `(model, metrics)`: the trained `TransformerLM` (or `model`'s type), and
      a dict with
      steps:        int64 `[n]`, the steps run by this call;
      train_loss:   float32 `[n]`, the loss of batch `steps[i]` under the
                    parameters before that update;
      eval_bpb:     {step: held-out bits per byte};
      tokens_per_s: training throughput of this call, excluding the first
                    (compiling) step, evaluation and checkpointing;
      start_step, final_step, param_count, resumed (bool).

  Raises before any work on a bad config (naming the field), e.g. a model
  vocab_size below the corpus tokenizer's 259 ids; and FloatingPointError,
  naming the step, at the first non-finite training loss (seen when losses
  are logged, and before every checkpoint, which is never written with
  non-finite parameters).
  """
  check_config(config)
  # Else a file there would surface as a raw FileExistsError, after the
  # corpus loads and the model initialises.
  if not _checks.dir_or_creatable(workdir):
    raise ValueError(f"workdir={workdir!r} must be a directory, or a path "
                     "where one can be created (not a file, nor under one); "
                     "pass another --workdir.")
  if model is None:
    model_config = model_config_from(config)
  else:
    model_config = getattr(model, "config", None)
    if not dataclasses.is_dataclass(model_config) or not all(
        hasattr(model, f) for f in ("graphdef", "state")):
      raise TypeError("model must be a pytree with a dataclass `config`, an "
                      "nnx `graphdef` and its `state` (like TransformerLM), "
                      f"got {type(model).__name__}.")
    if config.eval_every:
      raise ValueError(
          f"config.eval_every={config.eval_every}: held-out bits per byte "
          f"needs a model that maps tokens to logits, and a given "
          f"{type(model).__name__} is trained through its loss only. Set "
          "config.eval_every=0.")
  check_seq_len(config.seq_len, model_config)
  losses.check_vocab_size(
      getattr(model_config, "vocab_size", None),
      "config.model.vocab_size" if model is None else "model.config.vocab_size",
      f"set --config.model.vocab_size={data.BYTE_VOCAB_SIZE}.")
  losses.check_vocab_size(
      losses.module_limits(aux)[0], "aux's vocab_size",
      "give aux (e.g. the teacher or target) the byte vocabulary.")
  aux_positions = losses.module_limits(aux)[1]
  if aux_positions is not None and config.seq_len > aux_positions:
    # Else the first step would refuse the batch, after the workdir is made.
    raise ValueError(
        f"config.seq_len={config.seq_len} is longer than aux's "
        f"max_positions={aux_positions} (the teacher or target reads every "
        f"training window). Fix: set --config.seq_len to at most "
        f"{aux_positions}.")
  # A loss may say what its aux must be (`distill.distillation_loss`: a
  # teacher of the student's vocabulary), checked here before any work.
  check_aux = getattr(loss_fn, "check_aux", None)
  if check_aux is not None:
    check_aux(model_config, aux)
  if corpus is not None and not isinstance(corpus, data.Corpus):
    raise TypeError("corpus must be a specjax.data.Corpus (e.g. "
                    "data.text_corpus(path)) or None for config.corpus, got "
                    f"{type(corpus).__name__}.")
  if mesh is None:
    spec = config.get("mesh")
    mesh = parallel.make_mesh() if spec is None else sharding.make_mesh(spec)
  mesh = sharding.as_mesh(mesh)  # a spec string too, as elsewhere
  if parallel.DATA_AXIS not in mesh.axis_names:
    raise ValueError(f"mesh has axes {mesh.axis_names}; training splits the "
                     f"batch over a '{parallel.DATA_AXIS}' axis (e.g. mesh="
                     f"'{parallel.DATA_AXIS}:-1' or '{parallel.DATA_AXIS}:2,"
                     "model:4').")
  rules = rules_from(config)
  parallel.check_batch_size("config.batch_size", config.batch_size, mesh)
  if config.eval_every:
    parallel.check_batch_size("config.eval_batch_size", config.eval_batch_size,
                              mesh)
  optimizer, schedule = optim.make_optimizer(config.optim, config.num_steps)

  corpus = load_corpus(config) if corpus is None else corpus
  window = config.seq_len + 1
  train_N = corpus_tokens(corpus, "train", window, "training")
  heldout_N = (corpus_tokens(corpus, "heldout", window, "evaluation")
               if config.eval_every else None)

  if model is None:
    model = transformer_lib.TransformerLM.create(model_config, config.seed)
  template = model.replace(state=None)  # the structure, to wrap the result
  graphdef = model.graphdef
  shardings = state_shardings(model, optimizer, mesh, rules=rules)
  state = init_state(model, optimizer, mesh, rules=rules)
  del model  # the state holds copies of its arrays
  metadata = checkpoint_lib.make_metadata(
      model_config=model_config, train_config=config,
      corpus=corpus.fingerprint(), extra=extra_metadata, aux=aux)

  workdir = os.path.abspath(os.fspath(workdir))
  os.makedirs(workdir, exist_ok=True)
  with checkpoint_lib.Checkpointer(
      os.path.join(workdir, checkpoint_lib.CHECKPOINTS_SUBDIR),
      max_to_keep=config.max_to_keep, create=True) as ckpt:
    return _loop(config, workdir, ckpt, state, template, model_config,
                 metadata, optimizer, schedule, loss_fn, aux, mesh, train_N,
                 heldout_N, shardings, rules)


SHARDING_CHOICES = ("tp", "fsdp", "dp")


def rules_from(config: Any):
  """The sharding rules `config.sharding` names (see `train`)."""
  choice = config.get("sharding") or "tp"
  if choice not in SHARDING_CHOICES:
    raise ValueError(f"config.sharding must be one of {SHARDING_CHOICES}, got "
                     f"{choice!r}.")
  return {"tp": sharding.RULES, "fsdp": sharding.FSDP_RULES, "dp": None}[
      choice]


def _loop(config, workdir, ckpt, state, template, model_config, metadata,
          optimizer, schedule, loss_fn, aux, mesh, train_N, heldout_N,
          shardings, rules):
  """`train` once the checkpoint directory is open: resume, steps, saves."""
  graphdef = template.graphdef
  resumed = ckpt.latest_step() is not None
  if resumed:
    state, stored = ckpt.restore(state, model_config=model_config)
    _check_same_run(stored, metadata, ckpt.step_dir(int(state["step"])))
    state = sharding.place(state, shardings)
    _warn_config_changes(stored, metadata, ckpt.step_dir(int(state["step"])))
    logging.info("Resumed from %s", ckpt.step_dir(int(state["step"])))
  start_step = int(state["step"])
  # Losses of the steps before the checkpoint that no metrics record holds
  # yet: the first record after the resume averages them too, as the
  # uninterrupted run's did (checkpoint_every need not be a multiple of
  # log_every).
  carried = list(stored.get(_UNLOGGED, ())) if resumed else []
  if start_step > config.num_steps:
    raise ValueError(
        f"The checkpoint in {ckpt.directory!r} is at step {start_step}, past "
        f"config.num_steps={config.num_steps}. Raise --config.num_steps or "
        "use a fresh --workdir.")
  log = _MetricsLog(os.path.join(workdir, METRICS_FILE), start_step)

  rep, batch_sh = parallel.replicated(mesh), parallel.batch_sharded(mesh)
  aux_sh = None
  if aux is not None:
    if rules is not None and hasattr(aux, "logical_axes"):
      aux_sh = sharding.model_shardings(aux, mesh, rules=rules)
    else:
      aux_sh = jax.tree.map(lambda _: rep, aux)
    aux = sharding.place(aux, aux_sh)
  train_step = make_train_step(graphdef, optimizer, loss_fn, mesh=mesh,
                               schedule=schedule, shardings=shardings,
                               aux_shardings=aux_sh)
  rng = sharding.place(jax.random.key(config.seed), rep)
  if config.eval_every:
    eval_step = make_eval_step(graphdef, mesh=mesh,
                               param_shardings=shardings["params"])
    # Each process copies only the rows its own devices hold.
    windows = [sharding.place(w, batch_sh)
               for w in eval_windows(heldout_N, config)]
  tokens_per_step = config.batch_size * config.seq_len

  steps, step_losses, pending, eval_bpb = [], [], [], {}
  train_time, timed_steps = 0.0, 0
  clock = [time.perf_counter()]  # start of the current timing interval

  def sync(count: bool) -> None:
    """Waits for queued work; books the elapsed time as training if `count`."""
    nonlocal train_time
    jax.block_until_ready(state)
    now = time.perf_counter()
    if count:
      train_time += now - clock[0]
    clock[0] = now

  all_finite = jax.jit(lambda params: jnp.all(jnp.stack(
      [jnp.isfinite(x).all() for x in jax.tree.leaves(params)])))

  def diverged(what: str) -> FloatingPointError:
    return FloatingPointError(
        f"{what}: the run diverged, so it stops before saving non-finite "
        f"parameters. Fix: lower config.optim.lr (now {config.optim.lr}) or "
        "raise config.optim.warmup_steps, then resume from the last "
        "checkpoint or use a fresh --workdir.")

  def check_finite(step: int, loss: float) -> None:
    if not np.isfinite(loss):
      raise diverged(f"The training loss of step {step} is {loss}")

  def flush(done: int, bar) -> None:
    nonlocal timed_steps
    fetched = jax.device_get([m for _, m in pending])
    for (s, _), m in zip(pending, fetched):
      check_finite(s, float(m["loss"]))
      steps.append(s)
      step_losses.append(float(m["loss"]))
    last = fetched[-1]
    rate = (timed_steps * tokens_per_step / train_time) if train_time else None
    window = carried + [float(m["loss"]) for m in fetched]
    carried.clear()
    log.write(step=done, loss=float(np.mean(window)),
              grad_norm=float(last["grad_norm"]), lr=float(last["lr"]),
              tokens_per_s=rate)
    bar.set_postfix(loss=f"{step_losses[-1]:.4f}",
                    tok_s="-" if rate is None else f"{rate:,.0f}")
    pending.clear()

  bar = tqdm.tqdm(total=config.num_steps, initial=start_step,
                  disable=not config.progress, unit="step", dynamic_ncols=True,
                  desc=os.path.basename(workdir) or "train")
  try:
    for step in range(start_step, config.num_steps):
      batch = sharding.place(
          {"tokens": data.batch_at(train_N, config.batch_size, config.seq_len,
                                   config.seed, step)}, {"tokens": batch_sh})
      state, step_metrics = train_step(state, batch, rng, aux)
      pending.append((step, step_metrics))
      done = step + 1
      bar.update(1)
      if step == start_step:
        sync(count=False)  # the first step compiles; keep it out of tokens/s
      else:
        timed_steps += 1
      if done % config.log_every == 0 or done == config.num_steps:
        sync(count=True)
        flush(done, bar)
      if config.eval_every and (done % config.eval_every == 0
                                or done == config.num_steps):
        sync(count=True)
        eval_bpb[done] = evaluate(eval_step, state["params"], windows)
        log.write(step=done, eval_bpb=eval_bpb[done])
        logging.info("step %d: held-out bits per byte %.4f", done,
                     eval_bpb[done])
        sync(count=False)
      if ((config.checkpoint_every and done % config.checkpoint_every == 0)
          or done == config.num_steps):
        sync(count=True)
        # The losses not yet flushed, and the parameters themselves (the
        # last update may diverge after a finite loss): one fetch per save.
        unlogged = [float(loss) for loss in jax.device_get(
            [m["loss"] for _, m in pending])]
        for (s, _), loss in zip(pending, unlogged):
          check_finite(s, loss)
        if not bool(all_finite(state["params"])):
          raise diverged(f"The parameters after {done} updates are not finite")
        ckpt.save(done, state, {**metadata, _UNLOGGED: carried + unlogged})
        sync(count=False)
  finally:
    bar.close()

  model = template.replace(state=state["params"])
  metrics = {
      "steps": np.asarray(steps, np.int64),
      "train_loss": np.asarray(step_losses, np.float32),
      "eval_bpb": eval_bpb,
      "tokens_per_s": (timed_steps * tokens_per_step / train_time
                       if train_time else float("nan")),
      "start_step": start_step,
      "final_step": int(state["step"]),
      "param_count": model.param_count(),
      "resumed": resumed,
  }
  return model, metrics


def _check_same_run(stored: dict, current: dict, where: str) -> None:
  """Refuses a resume whose `aux` or `extra_metadata` differ from the run's.

  The model config alone does not identify a run: a student distilled from
  one teacher, resumed with another, would mix two teachers' targets in one
  set of weights without a word. `extra_metadata` (e.g. the zoo's teacher
  name and key) must be equal, and `aux` (e.g. the teacher) must be present
  in both runs or neither, with equal array bytes where both were hashed.
  Checkpoints written before these records lack them and are not checked.
  """
  fix = ("Pass the run's own aux and extra_metadata to resume it, or use a "
         "fresh --workdir for the new run.")
  was, now = stored.get("aux"), current["aux"]
  if "aux" in stored and (was is None) != (now is None):
    raise checkpoint_lib.CheckpointError(
        f"Checkpoint {where!r} was trained "
        + ("without an aux (e.g. a teacher) and is now given one"
           if was is None else f"with an aux ({was.get('type')}) and is now "
           "given none") + f". {fix}")
  hashes = (was or {}).get("sha256"), (now or {}).get("sha256")
  if None not in hashes and hashes[0] != hashes[1]:
    raise checkpoint_lib.CheckpointError(
        f"Checkpoint {where!r} was trained with another aux: the given "
        f"{now['type']}'s arrays differ from the run's (sha256 "
        f"{hashes[1][:12]}... vs {hashes[0][:12]}...), e.g. another teacher, "
        f"or the same one cast to another dtype. {fix}")
  if "extra" in stored:
    diff = checkpoint_lib.config_diff(
        stored["extra"] or {}, json.loads(json.dumps(current["extra"])))
    if diff:
      raise checkpoint_lib.CheckpointError(
          f"Checkpoint {where!r} was trained with other extra_metadata:\n  "
          + "\n  ".join(diff) + f"\n{fix}")


def _warn_config_changes(stored: dict, current: dict, where: str) -> None:
  """Logs (does not refuse) train-config or corpus changes across a resume.

  The model must match (checked in restore); a different batch size, step
  count or corpus is allowed, but the run is then no longer reproducible
  from its config alone, so it is worth a warning.
  """
  for key in ("train_config", "corpus"):
    a, b = stored.get(key) or {}, current.get(key) or {}
    diff = checkpoint_lib.config_diff(a, b) if isinstance(a, dict) else []
    if diff:
      logging.warning("Resuming %s with a changed %s:\n  %s", where, key,
                      "\n  ".join(diff))
