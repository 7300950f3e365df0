"""Negative controls as verifiers: deliberately wrong rules that every
exactness test must REJECT (`exact = False`; never use them to decode).

  wrong_fallback  token verification, but a rejection resamples from p
                  instead of the residual (p - q)+. Its acceptance rate is
                  right; its output law is min(p, q) + TV(p, q) * p, which
                  differs from p unless p == q or the supports are disjoint.
  always_accept   every draft is kept: its output law is q.

The oracle (`specjax.lab.controls`) writes their laws down with its own
code; a test that cannot tell these from the real rule proves nothing.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax import sampling
from specjax.decode.verifiers import token


def _gather(probs_xV, token_x):
  if probs_xV.ndim == 1:
    return probs_xV[token_x]
  return jnp.take_along_axis(probs_xV, token_x[..., None], axis=-1)[..., 0]


def _fallback_to_p(accepted_x, u_residual_x, p_xV, draft_x):
  fallback_x = sampling.sample_from_probs(u_residual_x, p_xV)  # not (p - q)+
  return jnp.where(accepted_x, draft_x, fallback_x).astype(jnp.int32), accepted_x


def wrong_fallback_rule(u_accept_x, u_residual_x, p_xV, q_xV, draft_x):
  """WRONG on purpose: accepts as the real rule (u q(x) < p(x)), but a
  rejection resamples from p. The signature of the loop's `coupling_rule`
  (`coupling._coupling`'s shapes: p and q `[..., V]` or one shared `[V]`)."""
  draft_x = draft_x.astype(jnp.int32)
  accepted_x = u_accept_x * _gather(q_xV, draft_x) < _gather(p_xV, draft_x)
  return _fallback_to_p(accepted_x, u_residual_x, p_xV, draft_x)


def always_accept_rule(u_accept_x, u_residual_x, p_xV, q_xV, draft_x):
  """WRONG on purpose: keeps every draft (signature of `wrong_fallback_rule`)."""
  del u_accept_x, q_xV
  draft_x = draft_x.astype(jnp.int32)
  return _fallback_to_p(jnp.ones(draft_x.shape, bool), u_residual_x, p_xV,
                        draft_x)


@dataclasses.dataclass(frozen=True)
class WrongFallbackControl(token.TokenVerifier):
  """Negative control: resample from p on rejection."""
  name = "wrong_fallback"
  control = True
  coupling_rule: object = wrong_fallback_rule

  @property
  def spec(self) -> str:
    return self.name


@dataclasses.dataclass(frozen=True)
class AlwaysAcceptControl(token.TokenVerifier):
  """Negative control: keep every draft."""
  name = "always_accept"
  control = True
  coupling_rule: object = always_accept_rule

  @property
  def spec(self) -> str:
    return self.name


# name -> the jnp rule: module-level functions, so hashable and usable as
# the loop's static `coupling_rule`.
RULES = {"wrong_fallback": wrong_fallback_rule,
         "always_accept": always_accept_rule}
