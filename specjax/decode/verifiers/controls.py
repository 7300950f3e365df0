"""Negative controls as verifiers: deliberately wrong rules that every
exactness test must REJECT (`exact = False`; never use them to decode).

  wrong_fallback  token verification, but a rejection resamples from p
                  instead of the residual (p - q)+.
  always_accept   every draft is kept.

The rules themselves are defined once, in `specjax.lab.controls`.
"""

from __future__ import annotations

import dataclasses

from specjax.decode.verifiers import token
from specjax.lab import controls


@dataclasses.dataclass(frozen=True)
class WrongFallbackControl(token.TokenVerifier):
  """Negative control: resample from p on rejection."""
  name = "wrong_fallback"
  control = True
  coupling_rule: object = controls.wrong_fallback_rule

  @property
  def spec(self) -> str:
    return self.name


@dataclasses.dataclass(frozen=True)
class AlwaysAcceptControl(token.TokenVerifier):
  """Negative control: keep every draft."""
  name = "always_accept"
  control = True
  coupling_rule: object = controls.always_accept_rule

  @property
  def spec(self) -> str:
    return self.name
