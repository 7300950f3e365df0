"""Training losses behind one pluggable interface, `LossFn`.

A loss function has the signature

    loss_fn(module, batch, rng, aux) -> (loss, metrics)

  module   the nnx `Transformer` being trained, rebuilt from the parameters
           being differentiated (call it: `module(tokens_BxT)` -> float32
           logits `[B, T, V]`).
  batch    a dict of arrays sharded over the batch axis; the trainer's batches
           hold `tokens`: int32 `[B, T + 1]` (inputs `[:, :-1]`, targets
           `[:, 1:]`).
  rng      a PRNG key unique to this step (`fold_in(rng, step)`).
  aux      any pytree handed through unchanged and NOT differentiated, e.g.
           a frozen teacher `TransformerLM` for distillation (KL / TV to the
           teacher's distribution); None for plain language modelling.
  loss     float32 scalar to minimise.
  metrics  dict of float32 scalars to log (may be empty).

`next_token_loss` is the language-modelling loss; distillation plugs in its own
function with the same signature (`trainer.train(..., loss_fn=..., aux=...)`).

Every loss ignores PAD targets where the model's vocabulary is the byte
tokenizer's (`pad_id_for`): the trainer's corpus batches never contain PAD
(see `specjax.data.tokenizer`), but padded batches (prompts, distillation
data) must not be trained to predict padding. In any other vocabulary the
byte PAD id is a real token and is scored.

Every loss checks its batch (`check_tokens`) before the forward pass: the
static facts (integer `[B, T + 1]` with B >= 1, T >= 1, T <= max_positions)
always, also while traced under jit; the ids (in [0, V)) only when the
tokens are concrete (an eager call), since a tracer holds no values. The
jitted train step checks the ids of a host (numpy) batch before it runs
(`trainer.make_train_step`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.data import tokenizer

LossFn = Callable[[Any, dict, jax.Array, Any],
                  tuple[jax.Array, dict[str, jax.Array]]]

_LN2 = math.log(2.0)


def pad_id_for(vocab_size: int) -> int | None:
  """The PAD id of data for a model over `vocab_size` tokens: the byte
  tokenizer's PAD where the vocabulary is the byte tokenizer's, else None (in
  another vocabulary, e.g. an imported one, that id is a real token)."""
  return tokenizer.PAD_ID if vocab_size == tokenizer.BYTE_VOCAB_SIZE else None


def check_vocab_size(vocab_size: Any, what: str, fix: str) -> None:
  """Refuses a vocabulary smaller than the corpus tokenizer's: corpus batches
  hold byte-tokenizer ids (up to EOS = 257), and an id past a model's table
  embeds and scores as NaN, which would train (and checkpoint) NaN params.
  Not an int (a model that does not record it): nothing to check."""
  if isinstance(vocab_size, int) and vocab_size < tokenizer.BYTE_VOCAB_SIZE:
    raise ValueError(
        f"{what}={vocab_size} is smaller than the corpus tokenizer's "
        f"vocabulary of {tokenizer.BYTE_VOCAB_SIZE} ids (256 bytes, BOS, EOS, "
        f"PAD): the corpus' ids past it would embed and score as NaN. Fix: "
        f"{fix}")


def target_mask(targets_BxT: jax.Array,
                pad_id: int | None = tokenizer.PAD_ID) -> jax.Array:
  """float32 `[B, T]`: 1 where the target is a real token, 0 on `pad_id`
  (default the byte tokenizer's; `pad_id_for(V)` for a V-token model; None
  masks nothing)."""
  if pad_id is None:
    return jnp.ones(targets_BxT.shape, jnp.float32)
  return (targets_BxT != pad_id).astype(jnp.float32)


def batch_tokens(batch: Any) -> Any:
  """`batch["tokens"]`, or a TypeError/ValueError saying what a batch is."""
  if not isinstance(batch, Mapping):
    raise TypeError("batch must be a dict holding 'tokens' (int [B, T + 1] "
                    f"windows), got {type(batch).__name__}.")
  if "tokens" not in batch:
    raise ValueError("batch must hold 'tokens' (int [B, T + 1] windows); got "
                     f"the keys {sorted(map(str, batch))}.")
  return batch["tokens"]


def check_tokens(tokens_BxT1: Any, *, vocab_size: int | None = None,
                 max_positions: int | None = None,
                 read_ids: bool | None = None,
                 name: str = "batch['tokens']", whose: str = "the model's "):
  """Checks `[B, T + 1]` training windows; returns them (a numpy array if
  they were a list).

  Always (static facts, so also on tracers): an integer dtype, rank 2, at
  least one row, T + 1 >= 2 (a window needs a target) and T <= max_positions
  (the model clamps a position past its table and would train on it
  silently). With `read_ids` every id must lie in [0, vocab_size): a larger
  one embeds and scores as NaN, a negative one wraps to another token. None
  (the losses' default) reads them when they are concrete, an eager call (a
  tracer holds no values); a caller that must not fetch a device array (the
  train step, a sync per step) passes a bool.
  """
  if read_ids is None:
    read_ids = _checks.is_concrete(tokens_BxT1)
  tokens_BxT1 = _checks.check_array(name, tokens_BxT1, rank=2, kind="i")
  rows, width = tokens_BxT1.shape
  if rows < 1 or width < 2:
    raise ValueError(
        f"{name} has shape {(rows, width)}: it must hold at least one window "
        "of T + 1 >= 2 tokens (inputs [:, :-1], next-token targets [:, 1:]), "
        "or there is nothing to train on.")
  if max_positions is not None and width - 1 > max_positions:
    raise ValueError(
        f"{name} has shape {(rows, width)}: windows of T + 1 = {width} tokens "
        f"feed T = {width - 1} input positions, more than {whose}"
        f"max_positions={max_positions}. Fix: windows of at most "
        f"{max_positions + 1} tokens (config.seq_len <= max_positions).")
  if read_ids and vocab_size is not None:
    _checks.check_token_range(name, tokens_BxT1, vocab_size, whose=whose)
  return tokens_BxT1


def module_limits(module: Any) -> tuple[int | None, int | None]:
  """(vocab_size, max_positions) of a module or model that records them (an
  nnx `Transformer` in its `config`, a `TransformerLM` itself); None where it
  does not (e.g. a bare logits function)."""
  config = getattr(module, "config", None)
  out = []
  for field in ("vocab_size", "max_positions"):
    value = getattr(config, field, None)
    if value is None:
      value = getattr(module, field, None)
    out.append(value if isinstance(value, int) else None)
  return out[0], out[1]


def token_nll(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """float32 `[B, T]` negative log-likelihood (nats) of each target token.

  Computed from float32 logits with a log-softmax, so it is finite for any
  finite logits.
  """
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp_BxTxV, targets_BxT[..., None],
                              axis=-1)[..., 0]


def split_inputs_targets(tokens_BxT1: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
  """`[B, T + 1]` windows -> (inputs `[B, T]`, next-token targets `[B, T]`)."""
  return tokens_BxT1[:, :-1], tokens_BxT1[:, 1:]


def next_token_loss(module, batch: dict, rng: jax.Array, aux: Any = None
                    ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean next-token cross-entropy (nats) over the non-PAD targets.

  A `LossFn` (see the module docstring); `rng` and `aux` are unused. The mean
  is over every non-PAD target of the whole (global) batch, so the value does
  not depend on how the batch is sharded over devices. Raises (naming
  batch['tokens']) on a batch `check_tokens` refuses.
  """
  del rng, aux
  vocab_size, max_positions = module_limits(module)
  # Ids only when concrete (an eager call); under jit the step checks them.
  tokens_BxT1 = check_tokens(batch_tokens(batch), vocab_size=vocab_size,
                             max_positions=max_positions)
  inputs_BxT, targets_BxT = split_inputs_targets(tokens_BxT1)
  logits_BxTxV = module(inputs_BxT)
  if vocab_size is None:  # a bare logits function: V is the logits' width
    vocab_size = logits_BxTxV.shape[-1]
    check_tokens(tokens_BxT1, vocab_size=vocab_size)
  nll_BxT = token_nll(logits_BxTxV, targets_BxT)
  mask_BxT = target_mask(targets_BxT, pad_id_for(vocab_size))
  count = jnp.maximum(mask_BxT.sum(), 1.0)
  return (nll_BxT * mask_BxT).sum() / count, {}


def bits_and_bytes(module, tokens_BxT1: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """Held-out totals for bits per byte: `(sum of bits, number of bytes)`.

  Bits are summed over every non-PAD target (BOS/EOS included: predicting a
  document boundary is part of modelling the text); bytes count the targets
  that are bytes (ids < 256). Their ratio is bits per byte of the text, the
  usual byte-level compression measure; summing totals over batches before
  dividing makes the mean exact for any number of batches.

  Returns:
    Two float32 scalars.
  """
  inputs_BxT, targets_BxT = split_inputs_targets(tokens_BxT1)
  logits_BxTxV = module(inputs_BxT)
  nll_BxT = token_nll(logits_BxTxV, targets_BxT)
  mask_BxT = target_mask(targets_BxT, pad_id_for(logits_BxTxV.shape[-1]))
  bits = (nll_BxT * mask_BxT).sum() / _LN2
  num_bytes = (targets_BxT < 256).astype(jnp.float32).sum()
  return bits, num_bytes
