"""Token verification (Leviathan et al. 2023; Chen et al. 2023): the default.

Drafts are judged left to right; x_i is kept with probability
min(1, p(x_i) / q(x_i)); the first rejection emits one draw from the residual
(p - q)+ and ends the round; if all are kept a bonus token is drawn from p.
Exact for any draft.

The per-position rule is a `coupling_rule(u_accept, u_residual, p, q, x) ->
(token, accepted)` (default `specjax.coupling._coupling`, the maximal
coupling), so tests can build negative controls by swapping in a wrong rule
(see `specjax.decode.verifiers.controls`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from specjax import coupling
from specjax.decode.verifiers import base


@dataclasses.dataclass(frozen=True)
class TokenVerifier(base.Verifier):
  """Token-level verification with a per-position coupling rule.

  Uniform layout per row (kept from the original loop so seeds reproduce):
  `[accept_1..accept_G, residual_1..residual_G, bonus]`.
  """
  name = "token"
  supports_draft_length = True
  coupling_rule: Callable = coupling._coupling

  @property
  def exact(self) -> bool:  # a swapped-in rule is a control, not exact
    return self.coupling_rule is coupling._coupling

  @property
  def keeps_with_overlap(self) -> bool:  # the maximal coupling's keep law
    return self.exact

  @property
  def spec(self) -> str:
    if self.coupling_rule is coupling._coupling:
      return "token"
    return f"token[{getattr(self.coupling_rule, '__name__', 'custom')}]"

  def num_uniforms(self, gamma: int) -> int:
    return 2 * gamma + 1

  def verify(self, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG, sample):
    gamma = drafts_BxG.shape[1]
    if self.coupling_rule is coupling._coupling:
      # The maximal coupling judged left to right on the same uniforms, with
      # one residual-or-bonus draw per row at its first rejection instead of
      # a residual and its CDF at every position: the same tokens.
      num_accepted_B, last_B = coupling._first_rejection(
          u_BxN[:, :gamma], u_BxN[:, gamma:2 * gamma], u_BxN[:, 2 * gamma],
          p_BxG1xV, q_BxGxV, drafts_BxG)
      return base.emit(drafts_BxG, num_accepted_B, last_B), num_accepted_B
    bonus_B = sample(u_BxN[:, 2 * gamma], p_BxG1xV[:, gamma])
    # Every position gets its own coupling draw; only those up to the first
    # rejection are used, which is what judging left to right produces.
    coupled_BxG, accepted_BxG = self.coupling_rule(
        u_BxN[:, :gamma], u_BxN[:, gamma:2 * gamma], p_BxG1xV[:, :gamma],
        q_BxGxV, drafts_BxG)
    num_accepted_B = base.prefix_length(accepted_BxG)
    rejected_B = base.take_position(coupled_BxG,
                                    jnp.minimum(num_accepted_B, gamma - 1))
    last_B = jnp.where(num_accepted_B < gamma, rejected_B, bonus_B)
    return base.emit(drafts_BxG, num_accepted_B, last_B), num_accepted_B

  def expected_accepted(self, p_BxG1xV, q_BxGxV, drafts_BxG):
    """sum_k prod_{i <= k} P(keep x_i): draft i is kept when u q(x_i) <
    p(x_i), so with probability min(1, p/q) (1 if q = 0 < p)."""
    if not self.exact:
      return super().expected_accepted(p_BxG1xV, q_BxGxV, drafts_BxG)
    base.check_round(p_BxG1xV, q_BxGxV, drafts_BxG)
    gamma = drafts_BxG.shape[1]
    p_at_BxG = base.gather(p_BxG1xV[:, :gamma], drafts_BxG)
    q_at_BxG = base.gather(q_BxGxV, drafts_BxG)
    over_BxG = p_at_BxG >= q_at_BxG
    keep_BxG = jnp.where(over_BxG, (p_at_BxG > 0).astype(jnp.float32),
                         p_at_BxG / jnp.where(over_BxG, 1.0, q_at_BxG))
    return jnp.sum(jnp.cumprod(keep_BxG, axis=1), axis=1)
