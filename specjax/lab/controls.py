"""Negative controls: deliberately WRONG accept/reject rules, defined once.

Every exactness check in specjax must reject these (a test that cannot tell
them from the real rule proves nothing). Each control is declared once, in
`CONTROLS`, by what it gets wrong; the forms the project uses all derive from
that declaration:

  wrong_fallback  accepts like the real rule (u * q(x) < p(x)), but on a
                  rejection resamples from p instead of the residual
                  (p - q)+ / sum (p - q)+. Its acceptance rate is right; its
                  output law is min(p, q) + TV(p, q) * p, which differs from
                  p unless p == q or the supports are disjoint.
  always_accept   keeps every draft token: its output law is q.

Forms:
  `coupling_rule(name)`  jnp rule `(u_accept_x, u_residual_x, p_xV, q_xV,
      draft_x) -> (token_x int32, accepted_x bool)`, the signature of the
      decode loop's static `coupling_rule` (tests/test_exactness.py runs the
      whole compiled loop with it); `specjax.testing`'s key-based
      `wrong_fallback_coupling` / `always_accept_coupling` wrap it.
  `rule_tables(name, p_xV, exact_accept_xV)`  float64 (accept probability,
      fallback law) tables, what `specjax.lab` enumerates exactly.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from specjax import sampling


@dataclasses.dataclass(frozen=True)
class Control:
  """What a negative control gets wrong (both fall back to p, not (p - q)+)."""
  keeps_every_draft: bool
  description: str


CONTROLS = {
    "wrong_fallback": Control(
        keeps_every_draft=False,
        description="on rejection resamples from p instead of (p - q)+"),
    "always_accept": Control(
        keeps_every_draft=True,
        description="keeps every draft token (output law q)"),
}
NAMES = tuple(CONTROLS)


def _check_name(name: str) -> Control:
  if name not in CONTROLS:
    raise ValueError(f"negative control must be one of {NAMES}, got {name!r}.")
  return CONTROLS[name]


def _gather(probs_xV, token_x):
  if probs_xV.ndim == 1:
    return probs_xV[token_x]
  return jnp.take_along_axis(probs_xV, token_x[..., None], axis=-1)[..., 0]


def _control_rule(name, u_accept_x, u_residual_x, p_xV, q_xV, draft_x):
  """The control `name` on pre-drawn uniforms; shapes as `coupling._coupling`
  (p and q `[..., V]` or one shared `[V]`, the rest `[...]`)."""
  draft_x = draft_x.astype(jnp.int32)
  if CONTROLS[name].keeps_every_draft:
    accepted_x = jnp.ones(draft_x.shape, bool)
  else:
    accepted_x = u_accept_x * _gather(q_xV, draft_x) < _gather(p_xV, draft_x)
  fallback_x = sampling.sample_from_probs(u_residual_x, p_xV)  # not (p - q)+
  return jnp.where(accepted_x, draft_x, fallback_x).astype(jnp.int32), accepted_x


def wrong_fallback_rule(u_accept_x, u_residual_x, p_xV, q_xV, draft_x):
  """WRONG on purpose: see `CONTROLS["wrong_fallback"]`."""
  return _control_rule("wrong_fallback", u_accept_x, u_residual_x, p_xV, q_xV,
                       draft_x)


def always_accept_rule(u_accept_x, u_residual_x, p_xV, q_xV, draft_x):
  """WRONG on purpose: see `CONTROLS["always_accept"]`."""
  return _control_rule("always_accept", u_accept_x, u_residual_x, p_xV, q_xV,
                       draft_x)


_RULES = {"wrong_fallback": wrong_fallback_rule,
          "always_accept": always_accept_rule}


def coupling_rule(name: str):
  """The jnp rule of control `name`: a module-level function, so hashable
  and usable as the decode loop's static `coupling_rule`."""
  _check_name(name)
  return _RULES[name]


def rule_tables(name: str, p_xV: np.ndarray, exact_accept_xV: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
  """float64 `(accept_xV, fallback_xV)` of control `name` for exact enumeration.

  `exact_accept_xV` is the real rule's min(1, p/q) (how the control accepts
  unless it keeps every draft); the fallback law is p.
  """
  control = _check_name(name)
  accept_xV = (np.ones_like(exact_accept_xV) if control.keeps_every_draft
               else exact_accept_xV)
  return accept_xV, np.asarray(p_xV)

