"""Block verification (Sun et al., "Block Verification Accelerates Speculative
Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2).

Token verification judges each draft on its own; block verification judges
the block jointly and keeps the longest prefix it can while still emitting an
exact sample of the target. It needs nothing the token verifier does not
have (the same p at G+1 positions and q at G), costs no extra target compute,
and keeps at least as many drafts in expectation, for every p and q (the
paper's Theorem 2; checked on every lab setting by `specjax.lab.verifiers`).

With r_i = p(x_i | x_<i) / q(x_i | x_<i) the algorithm is, per row:

  w_0 = 1,  w_i = min(1, w_{i-1} r_i)                     (i = 1..G)
  h_i = R_i / (R_i + 1 - w_i),  R_i = sum_x (w_i p_i(x) - q_i(x))+   (i < G)
  h_G = w_G
  tau = the largest i with eta_i < h_i (eta_i ~ U[0, 1)), else 0
  emit x_1..x_tau, then one token from
      (w_tau p_tau - q_tau)+ normalised   if tau < G
      p_G                                  if tau = G (the bonus)

where p_i, q_i are the target and draft laws after x_1..x_i (p_0, q_0: after
the last committed token). h_i = 0 where R_i + 1 - w_i = 0 (then R_i = 0: a
stop there has no residual to draw from and never happens).

Stats: num_accepted = tau and num_verified = min(tau + 1, G), as for token
verification, so `alpha_hat` (accepted / verified) can exceed `one_minus_tv`
under block verification: it keeps drafts token verification would reject.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.decode.verifiers import base


def block_weights(p_at_BxG, q_at_BxG):
  """w_1..w_G, float32 `[B, G]`: w_i = min(1, w_{i-1} p(x_i) / q(x_i)).

  Divides only where the ratio is below 1 (so q > 0 there); a draft with
  q(x) = 0 keeps the weight iff p(x) > 0, the convention of the token
  coupling (u q < p), and a weight of 0 stays 0.
  """
  gamma = p_at_BxG.shape[1]
  w_B = jnp.ones(p_at_BxG.shape[:1], jnp.float32)
  weights = []
  for i in range(gamma):  # gamma is small and static
    num_B, q_B = w_B * p_at_BxG[:, i], q_at_BxG[:, i]
    over_B = num_B >= q_B
    w_B = jnp.where(over_B, (num_B > 0).astype(jnp.float32),
                    num_B / jnp.where(over_B, 1.0, q_B))
    weights.append(w_B)
  return jnp.stack(weights, axis=1)


def stop_probabilities(w_BxG, p_BxG1xV, q_BxGxV):
  """h_1..h_G, float32 `[B, G]` (see the module docstring)."""
  w_mid_BxM = w_BxG[:, :-1]  # M = G - 1 positions followed by another draft
  excess_BxM = jnp.sum(jnp.maximum(
      w_mid_BxM[..., None] * p_BxG1xV[:, 1:-1] - q_BxGxV[:, 1:], 0.0), axis=-1)
  denom_BxM = excess_BxM + (1.0 - w_mid_BxM)
  h_mid_BxM = jnp.where(denom_BxM > 0,
                        excess_BxM / jnp.where(denom_BxM > 0, denom_BxM, 1.0),
                        0.0)
  return jnp.concatenate([h_mid_BxM, w_BxG[:, -1:]], axis=1)


@dataclasses.dataclass(frozen=True)
class BlockVerifier(base.Verifier):
  """Sun et al.'s block verification: exact, and never fewer tokens than token.

  Uniform layout per row: `[eta_1..eta_G, residual, bonus]`.
  """
  name = "block"

  def num_uniforms(self, gamma: int) -> int:
    return gamma + 2

  def verify(self, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG, sample):
    gamma = drafts_BxG.shape[1]
    w_BxG = block_weights(base.gather(p_BxG1xV[:, :gamma], drafts_BxG),
                          base.gather(q_BxGxV, drafts_BxG))
    h_BxG = stop_probabilities(w_BxG, p_BxG1xV, q_BxGxV)
    stop_BxG = u_BxN[:, :gamma] < h_BxG
    tau_B = jnp.max(jnp.where(stop_BxG, jnp.arange(1, gamma + 1), 0),
                    axis=1).astype(jnp.int32)
    w_tau_B = base.take_position(
        jnp.concatenate([jnp.ones_like(w_BxG[:, :1]), w_BxG], axis=1), tau_B)
    p_tau_BxV = base.take_position(p_BxG1xV, tau_B)
    q_tau_BxV = base.take_position(q_BxGxV, jnp.minimum(tau_B, gamma - 1))
    excess_BxV = jnp.maximum(w_tau_B[:, None] * p_tau_BxV - q_tau_BxV, 0.0)
    # No residual mass: a stop here has probability 0 and can only come from
    # rounding; fall back to p (the law the position should follow).
    has_mass_Bx1 = jnp.sum(excess_BxV, axis=-1, keepdims=True) > 0
    residual_BxV = jnp.where(has_mass_Bx1, excess_BxV, p_tau_BxV)
    corrected_B = sample(u_BxN[:, gamma], residual_BxV)
    bonus_B = sample(u_BxN[:, gamma + 1], p_BxG1xV[:, gamma])
    last_B = jnp.where(tau_B < gamma, corrected_B, bonus_B)
    return base.emit(drafts_BxG, tau_B, last_B), tau_B

  def expected_accepted(self, p_BxG1xV, q_BxGxV, drafts_BxG):
    """sum_k P(tau >= k) = sum_k (1 - prod_{i >= k} (1 - h_i)): tau is the
    largest i whose independent eta_i falls below h_i."""
    base.check_round(p_BxG1xV, q_BxGxV, drafts_BxG)
    gamma = drafts_BxG.shape[1]
    if not gamma:  # no drafts, none kept
      return jnp.zeros(drafts_BxG.shape[:1], jnp.float32)
    w_BxG = block_weights(base.gather(p_BxG1xV[:, :gamma], drafts_BxG),
                          base.gather(q_BxGxV, drafts_BxG))
    miss_BxG = 1.0 - stop_probabilities(w_BxG, p_BxG1xV, q_BxGxV)
    # prod_{i >= k} (1 - h_i) for every k: a cumulative product from the end.
    none_after_BxG = jnp.flip(jnp.cumprod(jnp.flip(miss_BxG, 1), axis=1), 1)
    return jnp.sum(1.0 - none_after_BxG, axis=1)
