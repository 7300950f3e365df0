"""What every chain verifier is: a static, hashable rule the loop calls once a round.

A verifier judges gamma draft tokens against the target in one round. The
loop (`specjax.decode.steps._verify_step`) runs the target's single forward
pass, turns logits into p with the sampling transform, draws the row's
uniforms and hands everything to the verifier, which decides how many drafts
to keep and which token to emit after them. Everything around that decision
(the forward pass, the uniforms, the bonus sampler, the stats, the commit) is
shared, so a new verifier is one module plus one line in the registry.

A verifier is a frozen dataclass: hashable, so the loop takes it as a static
`jax.jit` argument and compiles once per verifier.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax import coupling
from specjax import sampling

# sample(u_x, probs_xV) -> int32 [...]: the loop's sampler (inverse CDF, with
# the greedy shortcut), so every verifier samples exactly as the baseline.
Sampler = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Verifier:
  """Base class of chain verifiers (subclass it, then register the subclass).

  Class attributes:
    name: registry name ("token", "block", "lenient", ...).
    exact: True when the emitted text is distributed exactly as the target's
      (proved on the lab, `specjax.lab.verifiers`); False for lossy
      baselines, whose distortion the lab measures and prints.
    supports_draft_length: True when each position is judged on its own, left
      to right, and a kept draft is emitted as drafted, so a row that stopped
      drafting after d tokens can keep min(kept, d) (adaptive draft lengths,
      `specjax.decode.draft_length`). Block verification judges the block as
      a whole and cannot.
    keeps_with_overlap: True when a judged draft is kept with probability
      exactly sum_x min(p, q), so that `Goodput(estimator="overlap")` may
      count that overlap in place of the draft's fate.
    control: True for the exactness tests' negative controls, wrong on
      purpose; `speculative_generate` warns when one decodes.
  """
  name: ClassVar[str] = ""
  exact: ClassVar[bool] = True
  control: ClassVar[bool] = False
  supports_draft_length: ClassVar[bool] = False

  @property
  def keeps_with_overlap(self) -> bool:
    return False

  @property
  def spec(self) -> str:
    """The registry string that rebuilds this verifier (e.g. "lenient:0.5")."""
    return self.name

  def num_uniforms(self, gamma: int) -> int:
    """How many uniforms per row a round needs (the loop draws them)."""
    raise NotImplementedError

  def verify(self, u_BxN: jax.Array, p_BxG1xV: jax.Array,
             q_BxGxV: jax.Array, drafts_BxG: jax.Array,
             sample: Sampler) -> tuple[jax.Array, jax.Array]:
    """Judges one round of gamma >= 1 drafts per row.

    Args:
      u_BxN: float32 `[B, num_uniforms(G)]` uniforms in [0, 1), row b's own.
      p_BxG1xV: float32 `[B, G+1, V]`, the target's law after the last
        committed token and after each draft (row G: the bonus position).
      q_BxGxV: float32 `[B, G, V]`, the laws the drafts were drawn from.
      drafts_BxG: int32 `[B, G]`.
      sample: the loop's sampler.

    Returns:
      (emitted_BxG1 int32 `[B, G+1]`, num_accepted_B int32 `[B]` in [0, G]):
      the row emits its first num_accepted drafts, then
      emitted[b, num_accepted[b]]; entries past that are ignored.
    """
    raise NotImplementedError

  def expected_accepted(self, p_BxG1xV: jax.Array, q_BxGxV: jax.Array,
                        drafts_BxG: jax.Array) -> jax.Array:
    """E[num_accepted | drafts, p, q], float32 `[B]`: the round's drafts kept,
    averaged over its uniforms in closed form (a Rao-Blackwellised count).

    Same arguments as `verify` (checked by `check_round`). Two verifiers
    judged on the same drafts compare without the noise of the accept/reject
    draws (`specjax.harness.expected_tokens`). Verifiers without a closed form raise
    NotImplementedError.
    """
    raise NotImplementedError(
        f"verifier {self.spec!r} has no closed-form expected acceptance; "
        "'token' and 'block' have one.")

  def __str__(self) -> str:
    return self.spec


def check_round(p_BxG1xV, q_BxGxV, drafts_BxG) -> None:
  """Refuses a round whose arrays disagree: p `[B, G+1, V]`, q `[B, G, V]`,
  integer drafts `[B, G]` (shapes always, so also under jit), and draft ids
  off the vocabulary when they are concrete. Broadcasting would otherwise
  price a p without its bonus row, or one row's p for every row, and an id
  past V gathers NaN (-1 wraps to V - 1)."""
  shapes = tuple(getattr(x, "shape", None) for x in (p_BxG1xV, q_BxGxV,
                                                      drafts_BxG))
  if None in shapes or len(shapes[2]) != 2 or len(shapes[1]) != 3:
    raise ValueError(f"p, q and drafts must be arrays [B, G+1, V], [B, G, V] "
                     f"and [B, G]; got shapes {shapes}.")
  (batch, gamma), vocab = shapes[2], shapes[1][-1]
  if shapes[1] != (batch, gamma, vocab) or shapes[0] != (batch, gamma + 1,
                                                         vocab):
    raise ValueError(
        f"p {shapes[0]}, q {shapes[1]} and drafts {shapes[2]} disagree: a "
        f"round of G = {gamma} drafts over V = {vocab} tokens needs p "
        f"{(batch, gamma + 1, vocab)} (the bonus position last) and q "
        f"{(batch, gamma, vocab)}.")
  if not jnp.issubdtype(drafts_BxG.dtype, jnp.integer):
    raise TypeError(f"drafts must hold integer token ids, got dtype "
                    f"{drafts_BxG.dtype}.")
  if _checks.is_concrete(drafts_BxG):
    _checks.check_token_range("drafts", drafts_BxG, vocab)
  # Values too, where concrete: logits passed as p priced a negative
  # expected count.
  for name, probs in (("p", p_BxG1xV), ("q", q_BxGxV)):
    sampling.check_probs(name, probs, normalised=True)


def gather(probs_xV: jax.Array, token_x: jax.Array) -> jax.Array:
  """probs_xV[..., token_x]: the probability of each drafted token."""
  return jnp.take_along_axis(probs_xV, token_x[..., None], axis=-1)[..., 0]


def prefix_length(accepted_BxG: jax.Array) -> jax.Array:
  """Index of the first False per row, or G if none: int32 `[B]`."""
  gamma = accepted_BxG.shape[1]
  return jnp.where(jnp.all(accepted_BxG, axis=1), gamma,
                   jnp.argmax(~accepted_BxG, axis=1)).astype(jnp.int32)


def take_position(x_BxGx: jax.Array, index_B: jax.Array) -> jax.Array:
  """x[b, index[b]] for `[B, G, ...]` arrays."""
  idx = index_B.reshape((-1,) + (1,) * (x_BxGx.ndim - 1))
  return jnp.take_along_axis(x_BxGx, idx, axis=1)[:, 0]


def emit(drafts_BxG: jax.Array, num_accepted_B: jax.Array,
         last_token_B: jax.Array) -> jax.Array:
  """`[B, G+1]`: the drafts with `last_token` written at num_accepted."""
  gamma = drafts_BxG.shape[1]
  emitted_BxG1 = jnp.concatenate([drafts_BxG, last_token_B[:, None]], axis=1)
  return jnp.where(jnp.arange(gamma + 1) == num_accepted_B[:, None],
                   last_token_B[:, None], emitted_BxG1).astype(jnp.int32)


def residual(p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """Unnormalised (p - q)+, or p itself where it has no mass.

  `sample` reads the total off the CDF, so no division is needed; a zero
  residual means no rejection can happen except by rounding, and p is then
  the right law to fall back to.
  """
  return coupling._unnormalised_residual(p_xV, q_xV)  # pylint: disable=protected-access
