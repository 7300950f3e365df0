"""Lossy verifiers: faster than exact ones, and NOT distributed as the target.

They are baselines, labelled `exact = False` everywhere they appear (the
registry, results tables' "lossy" column); `specjax.lab.verifiers` measures
their exact TV to the target's law on the lab.

  lenient:l          keep x with probability min(1, p(x) / (l q(x))), 0 < l <= 1
                     (the "lenience" of Leviathan et al. 2023, App. A.5); on
                     rejection draw the usual residual (p - q)+. l = 1 is token
                     verification (exact); smaller l keeps more and distorts
                     more.
  typical:eps,delta  Medusa's typical acceptance (Cai et al. 2024): keep x iff
                     p(x) > min(eps, delta exp(-H(p))), H the entropy of the
                     target's law there; at the first rejection emit a sample
                     from p (there is no residual). Deterministic acceptance.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax.numpy as jnp
import numpy as np

from specjax.decode.verifiers import base


def _chain(accepted_BxG, corrections_BxG, bonus_B, drafts_BxG):
  """Keep the accepted prefix; emit the correction at the first rejection."""
  gamma = drafts_BxG.shape[1]
  num_accepted_B = base.prefix_length(accepted_BxG)
  rejected_B = base.take_position(corrections_BxG,
                                  jnp.minimum(num_accepted_B, gamma - 1))
  last_B = jnp.where(num_accepted_B < gamma, rejected_B, bonus_B)
  return base.emit(drafts_BxG, num_accepted_B, last_B), num_accepted_B


@dataclasses.dataclass(frozen=True)
class LenientVerifier(base.Verifier):
  """Lenient acceptance min(1, p / (l q)); lossy for l < 1."""
  name = "lenient"
  supports_draft_length = True
  exact = False
  lenience: float = 0.5

  def __post_init__(self):
    l = self.lenience
    # numbers.Real, not float: numpy scalars such as np.float32(0.5) are
    # numbers too.
    if isinstance(l, (bool, np.bool_)) or not isinstance(l, numbers.Real) or (
        not 0.0 < float(l) <= 1.0):
      raise ValueError(f"lenient: the lenience l must be a number in (0, 1] "
                       f"(1 = token verification), got {l!r}; e.g. "
                       "'lenient:0.5'.")
    object.__setattr__(self, "lenience", float(l))

  @property
  def spec(self) -> str:
    return f"lenient:{self.lenience:g}"

  def num_uniforms(self, gamma: int) -> int:
    return 2 * gamma + 1

  def verify(self, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG, sample):
    gamma = drafts_BxG.shape[1]
    p_BxGxV = p_BxG1xV[:, :gamma]
    accepted_BxG = (u_BxN[:, :gamma] * self.lenience
                    * base.gather(q_BxGxV, drafts_BxG)
                    < base.gather(p_BxGxV, drafts_BxG))
    corrections_BxG = sample(u_BxN[:, gamma:2 * gamma],
                             base.residual(p_BxGxV, q_BxGxV))
    bonus_B = sample(u_BxN[:, 2 * gamma], p_BxG1xV[:, gamma])
    return _chain(accepted_BxG, corrections_BxG, bonus_B, drafts_BxG)


def typical_threshold(p_xV, epsilon: float, delta: float):
  """min(eps, delta exp(-H(p))), `[...]`; 0 log 0 counts as 0."""
  logp_xV = jnp.log(jnp.where(p_xV > 0, p_xV, 1.0))
  entropy_x = -jnp.sum(p_xV * logp_xV, axis=-1)
  return jnp.minimum(epsilon, delta * jnp.exp(-entropy_x))


@dataclasses.dataclass(frozen=True)
class TypicalVerifier(base.Verifier):
  """Medusa's typical acceptance p(x) > min(eps, delta exp(-H(p))); lossy."""
  name = "typical"
  supports_draft_length = True
  exact = False
  epsilon: float = 0.09
  delta: float = 0.3

  def __post_init__(self):
    for field, value in (("epsilon", self.epsilon), ("delta", self.delta)):
      if (isinstance(value, (bool, np.bool_))
          or not isinstance(value, numbers.Real)
          or not 0.0 < float(value) <= 1.0):
        raise ValueError(f"typical: {field} must be a number in (0, 1], got "
                         f"{value!r}; e.g. 'typical:0.09,0.3' (Medusa's "
                         "posterior_threshold, posterior_alpha).")
      object.__setattr__(self, field, float(value))

  @property
  def spec(self) -> str:
    return f"typical:{self.epsilon:g},{self.delta:g}"

  def num_uniforms(self, gamma: int) -> int:
    return gamma + 1

  def verify(self, u_BxN, p_BxG1xV, q_BxGxV, drafts_BxG, sample):
    del q_BxGxV  # typical acceptance never looks at the draft's law
    gamma = drafts_BxG.shape[1]
    p_BxGxV = p_BxG1xV[:, :gamma]
    accepted_BxG = base.gather(p_BxGxV, drafts_BxG) > typical_threshold(
        p_BxGxV, self.epsilon, self.delta)
    corrections_BxG = sample(u_BxN[:, :gamma], p_BxGxV)
    bonus_B = sample(u_BxN[:, gamma], p_BxG1xV[:, gamma])
    return _chain(accepted_BxG, corrections_BxG, bonus_B, drafts_BxG)
