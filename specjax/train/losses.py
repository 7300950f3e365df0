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

Every loss ignores PAD targets. The trainer's corpus batches never contain
PAD (see `specjax.data.tokenizer`), but padded batches (prompts, distillation
data) must not be trained to predict padding.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specjax.data import tokenizer

LossFn = Callable[[Any, dict, jax.Array, Any],
                  tuple[jax.Array, dict[str, jax.Array]]]

_LN2 = math.log(2.0)


def target_mask(targets_BxT: jax.Array) -> jax.Array:
  """float32 `[B, T]`: 1 where the target is a real token, 0 on PAD."""
  return (targets_BxT != tokenizer.PAD_ID).astype(jnp.float32)


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
  not depend on how the batch is sharded over devices.
  """
  del rng, aux
  inputs_BxT, targets_BxT = split_inputs_targets(batch["tokens"])
  nll_BxT = token_nll(module(inputs_BxT), targets_BxT)
  mask_BxT = target_mask(targets_BxT)
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
  nll_BxT = token_nll(module(inputs_BxT), targets_BxT)
  bits = (nll_BxT * target_mask(targets_BxT)).sum() / _LN2
  num_bytes = (targets_BxT < 256).astype(jnp.float32).sum()
  return bits, num_bytes
