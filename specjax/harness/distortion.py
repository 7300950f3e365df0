r"""How far a lossy verifier's output is from the target: per-token TV on real models.

The lab (`specjax.lab.verifiers`) computes a lossy verifier's exact TV to the
target by enumerating every sequence, which only toy models allow. On real
models this module estimates a per-token distortion from the models' own
laws along the trajectories the lossy process actually produced.

The per-position law. At a position where the verifier judges a draft, the
draft token x was drawn from q (the draft's law given the committed text),
independently of the verdicts before it, and the emitted token has a law
L_v(p, q) that each chain verifier defines in closed form from p and q there:

  token              q min(1, p/q) + (1 - sum min(p, q)) (p - q)+ / Z  =  p
  lenient:l          min(q, p/l) + (1 - sum min(q, p/l)) (p - q)+ / Z
  typical:eps,delta  q 1[p > t] + (1 - sum q 1[p > t]) p,
                     t = min(eps, delta exp(-H(p)))
  wrong_fallback     min(p, q) + (1 - sum min(p, q)) p
  always_accept      q

(Z normalises the residual; where (p - q)+ has no mass the loop falls back to
p.) A bonus position (every draft of the round kept) is drawn from p itself.
Block verification judges a block as a whole and has no per-position law:
`has_position_law` is False for it (it is exact, `Verifier.exact`).

The estimator. For each generated token t of each row, with p_t and q_t the
target's and the draft's laws (after the sampling transform, exactly as the
loop computes them) given the committed text before t, d_t = TV(L_v(p_t, q_t),
p_t) = 1/2 sum_x |L_v - p_t|. `per_token_tv` returns the mean of d_t over
every generated token of every row, and its standard error over rows.

What it estimates. Let D_t be the TV between the process's law of token t
given the text before it and p_t. Given the text and the round's state, the
token's law is L_v (judged) or p_t (bonus), so by convexity D_t <= d_t; and
the TV between the process's and the target's laws of the first N tokens is
at most sum_t E[D_t] (the chain rule for TV). Hence

    TV(process, target; N tokens)  <=  N * E[tv_per_token],

with tv_per_token an upper bound on the per-token distortion that counts
bonus positions as if they were judged. It is computed on the process's own
samples, so it is the distortion where the lossy decoder actually goes.
`specjax.lab.verifiers.expected_position_tv` computes the same expectation
exactly on a Markov pair (tests/test_distortion.py checks the two agree).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import coupling
from specjax import sampling as sampling_lib
from specjax.decode import validation
from specjax.decode import verifiers as verifiers_lib
from specjax.decode.verifiers import base
from specjax.decode.verifiers import lossy

_LAWS = ("token", "lenient", "typical", "wrong_fallback", "always_accept")


def has_position_law(verifier) -> bool:
  """True when `position_law` knows the verifier's per-position law."""
  return verifiers_lib.get_verifier(verifier).name in _LAWS


def position_law(verifier, p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """L_v(p, q): the law of the token emitted where a draft x ~ q is judged.

  Args:
    verifier: a registry string or `Verifier` with `has_position_law`.
    p_xV, q_xV: float `[..., V]` target and draft laws at one position (one
      V; leading axes broadcast). Concrete values must be laws
      (`coupling.check_laws`).

  Returns:
    float32 `[..., V]`, a probability vector per position (module docstring).
  """
  v = verifiers_lib.get_verifier(verifier)
  if v.name not in _LAWS:
    raise ValueError(f"verifier {v.spec!r} has no per-position law (it judges "
                     f"a block as a whole); known: {_LAWS}.")
  p_xV, q_xV = coupling.check_laws(p_xV, q_xV, names=("p_xV", "q_xV"))
  p_xV = jnp.asarray(p_xV, jnp.float32)
  q_xV = jnp.asarray(q_xV, jnp.float32)
  if v.name == "always_accept":
    return q_xV
  if v.name == "typical":
    kept_xV = q_xV * (p_xV > lossy.typical_threshold(
        p_xV, v.epsilon, v.delta)[..., None])
    fallback_xV = p_xV
  else:
    # q min(1, p / (l q)) = min(q, p / l); l = 1 for token verification.
    lenience = v.lenience if v.name == "lenient" else 1.0
    kept_xV = jnp.minimum(q_xV, p_xV / lenience)
    if v.name == "wrong_fallback":
      fallback_xV = p_xV
    else:
      excess_xV = base.residual(p_xV, q_xV)
      fallback_xV = excess_xV / jnp.sum(excess_xV, -1, keepdims=True)
  rejected_x1 = jnp.clip(1.0 - jnp.sum(kept_xV, -1, keepdims=True), 0.0, 1.0)
  return kept_xV + rejected_x1 * fallback_xV


def position_tv(verifier, p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """d = TV(L_v(p, q), p), float32 `[...]`: a judged position's distortion."""
  law_xV = position_law(verifier, p_xV, q_xV)
  return 0.5 * jnp.sum(jnp.abs(law_xV - jnp.asarray(p_xV, jnp.float32)), -1)


@functools.partial(jax.jit, static_argnames=("sampling",))
def _laws(model, tokens_BxT: jax.Array, sampling) -> jax.Array:
  """The model's sampled law after every position, float32 `[B, T, V]`."""
  cache = model.init_cache(*tokens_BxT.shape)
  return sampling_lib.probabilities(model(tokens_BxT, cache)[0], sampling)


def per_token_tv(target, draft, verifier, sampling: sampling_lib.SamplingConfig,
                 *, prompts_BxP, prompt_lengths_B, tokens_BxN, lengths_B
                 ) -> dict[str, Any]:
  """Mean per-token distortion of a lossy decoder along its own output.

  Args:
    target, draft: the `CausalLM`s the output was decoded with.
    verifier: the verifier it was decoded with (`has_position_law`).
    sampling: the decode's sampling config (applied to both models' logits).
    prompts_BxP: int `[B, P]` right-padded prompts; prompt_lengths_B: `[B]`.
    tokens_BxN, lengths_B: the generation (`GenerationResult.tokens`,
      `.lengths`); row b generated lengths_B[b] tokens.

  Returns:
    {"tv_per_token": mean of d_t over all generated tokens (module
    docstring; NaN when no row generated a token, a mean over nothing),
    "tv_per_token_se": its standard error over rows (None for one row),
    "positions": the number of tokens}. Each model scores every row's
    prompt + generation in one teacher-forced pass.
  """
  validation.check_pair(target, draft)  # else errors from inside tracing
  v = verifiers_lib.get_verifier(verifier)
  if not has_position_law(v):
    raise ValueError(f"verifier {v.spec!r} has no per-position law; "
                     f"per_token_tv knows {_LAWS}.")
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError("sampling must be a specjax.SamplingConfig, got "
                    f"{type(sampling).__name__}.")
  seq_BxT, p_len, n_len = _checks.check_texts(
      prompts_BxP, prompt_lengths_B, tokens_BxN, lengths_B,
      {"target": target, "draft": draft})
  rows, new = seq_BxT.shape[0], np.shape(tokens_BxN)[1]
  # The law of generated token j of row b sits after position p_len + j - 1.
  index_BxN = (p_len[:, None] - 1 + np.arange(new)[None]).astype(np.int32)
  take = lambda laws_BxTxV: jnp.take_along_axis(
      laws_BxTxV, jnp.asarray(index_BxN)[..., None], axis=1)
  p_BxNxV = take(_laws(target, jnp.asarray(seq_BxT), sampling=sampling))
  q_BxNxV = take(_laws(draft, jnp.asarray(seq_BxT), sampling=sampling))
  d_BxN = np.asarray(position_tv(v, p_BxNxV, q_BxNxV), np.float64)
  mask_BxN = np.arange(new)[None] < n_len[:, None]
  positions = int(mask_BxN.sum())
  if positions == 0:
    return {"tv_per_token": float("nan"), "tv_per_token_se": None,
            "positions": 0}
  mean = float((d_BxN * mask_BxN).sum() / positions)
  # Ratio estimator over rows (rows differ in length): se of sum d / sum n.
  sums_B, counts_B = (d_BxN * mask_BxN).sum(1), mask_BxN.sum(1)
  se = None
  if rows > 1:
    resid_B = sums_B - mean * counts_B
    se = float(np.sqrt(np.sum(resid_B ** 2) / (rows - 1) / rows)
               / counts_B.mean())
  return {"tv_per_token": mean, "tv_per_token_se": se, "positions": positions}
