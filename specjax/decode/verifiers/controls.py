"""Negative controls as verifiers: deliberately wrong rules that every
exactness test must REJECT (`exact = False`; never use them to decode).

  wrong_fallback  token verification, but a rejection resamples from p
                  instead of the residual (p - q)+.
  always_accept   every draft is kept.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.decode.verifiers import base
from specjax.decode.verifiers import token


def wrong_fallback_rule(u_accept, u_residual, p, q, draft):
  """A coupling rule whose rejection draws from p, not (p - q)+."""
  accepted = u_accept * base.gather(q, draft) < base.gather(p, draft)
  resampled = sampling_lib.sample_from_probs(u_residual, p)
  return jnp.where(accepted, draft, resampled).astype(jnp.int32), accepted


def always_accept_rule(u_accept, u_residual, p, q, draft):
  """A coupling rule that keeps every draft."""
  del u_accept, u_residual, p, q
  return draft.astype(jnp.int32), jnp.ones(draft.shape, bool)


@dataclasses.dataclass(frozen=True)
class WrongFallbackControl(token.TokenVerifier):
  """Negative control: resample from p on rejection."""
  name = "wrong_fallback"
  coupling_rule: object = wrong_fallback_rule

  @property
  def spec(self) -> str:
    return self.name


@dataclasses.dataclass(frozen=True)
class AlwaysAcceptControl(token.TokenVerifier):
  """Negative control: keep every draft."""
  name = "always_accept"
  coupling_rule: object = always_accept_rule

  @property
  def spec(self) -> str:
    return self.name
