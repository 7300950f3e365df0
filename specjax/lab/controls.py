"""Negative controls: deliberately WRONG accept/reject rules, as the oracle
knows them.

Every exactness check in specjax must reject these (a test that cannot tell
them from the real rule proves nothing). The decoder runs them as verifiers
(`specjax.decode.verifiers.controls`); this module declares each by what it
gets wrong, in `CONTROLS`, and writes its law down with the oracle's own
code:

  wrong_fallback  accepts like the real rule (u * q(x) < p(x)), but on a
                  rejection resamples from p instead of the residual
                  (p - q)+ / sum (p - q)+. Its acceptance rate is right; its
                  output law is min(p, q) + TV(p, q) * p, which differs from
                  p unless p == q or the supports are disjoint.
  always_accept   keeps every draft token: its output law is q.

`rule_tables(name, p_xV, exact_accept_xV)` gives float64 (accept
probability, fallback law) tables, what `specjax.lab` enumerates exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax import _moved


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


# Moved names raise an error naming their new home.
__getattr__ = _moved.module_getattr(__name__, {
    "coupling_rule": "specjax.decode.verifiers.controls.RULES",
    "wrong_fallback_rule":
        "specjax.decode.verifiers.controls.wrong_fallback_rule",
    "always_accept_rule":
        "specjax.decode.verifiers.controls.always_accept_rule",
})
