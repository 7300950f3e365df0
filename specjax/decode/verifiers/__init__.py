"""The verifier registry: a verifier is a static choice of the decode loop.

`speculative_generate(..., verifier="block")` and `verify_step(...,
verifier=...)` take a registry string or a `Verifier` instance. Strings are
"name" or "name:args":

  token              token-level verification (default; exact)
  block              Sun et al.'s block verification (exact, >= token)
  lenient:l          lossy: accept with min(1, p / (l q))
  typical:eps,delta  lossy: Medusa's typical acceptance
  tree:3,2,1,1       exact draft tree, children i.i.d. (SpecInfer);
                     gamma = its depth (see `trees`)
  tree-wor:3,2,1,1   the same tree drafted without replacement (RSD)
  traversal:3,2,1,1, traversal-wor:3,2,1,1
                     the same trees judged by Traversal Verification
                     (Weng et al. 2025; exact, keeps >= tree)
  spectr:3,2,1       the i.i.d. tree judged node by node by SpecTr's K-SEQ
                     (Sun et al. 2023; exact)
  greedy-draft:3,1,1 Hu et al.'s greedy drafts (top k - 1 of q and one draw
                     from the rest) and their verifier (ICLR 2025; exact,
                     the scheme's optimal acceptance at every node)
  canonical:2,1,1    the i.i.d. tree (at most 2 children per node) judged
                     by Khisti et al.'s canonical importance-sampling
                     verifier (ICLR 2025; exact; O(V^2) per node, V <= 8192)
  wrong_fallback, always_accept, tree-skip-residual,
  traversal-no-final-residual, spectr-wrong-residual,
  greedy-draft-residual-outside-drafts, canonical-draft-law-q
                     negative controls

Adding a verifier: subclass `Verifier` in its own module under this package,
then add one `register_verifier` line below. The loop is not touched.
"""

from __future__ import annotations

import re
from typing import Callable

from specjax import _checks
from specjax.decode.verifiers.base import Verifier
from specjax.decode.verifiers.block import BlockVerifier
from specjax.decode.verifiers.canonical import CanonicalDraftLawQControl
from specjax.decode.verifiers.canonical import CanonicalVerifier
from specjax.decode.verifiers.controls import AlwaysAcceptControl
from specjax.decode.verifiers.controls import WrongFallbackControl
from specjax.decode.verifiers.greedy_draft import (
    GreedyDraftResidualOutsideControl)
from specjax.decode.verifiers.greedy_draft import GreedyDraftVerifier
from specjax.decode.verifiers.kseq import KSeqVerifier
from specjax.decode.verifiers.kseq import KSeqWrongResidualControl
from specjax.decode.verifiers.lossy import LenientVerifier
from specjax.decode.verifiers.lossy import TypicalVerifier
from specjax.decode.verifiers.token import TokenVerifier
from specjax.decode.verifiers.traversal import TraversalNoFinalResidualControl
from specjax.decode.verifiers.traversal import TraversalVerifier
from specjax.decode.verifiers.trees import TreeSkipResidualControl
from specjax.decode.verifiers.trees import TreeVerifier
from specjax.decode.verifiers import trees as _trees

# name -> factory(args: list[str]) -> Verifier
_REGISTRY: dict[str, Callable[[list[str]], Verifier]] = {}


def register_verifier(name: str, factory: Callable[[list[str]], Verifier], *,
                      replace: bool = False):
  """Registers `factory(args) -> Verifier` under `name` (args: the
  comma-separated strings after "name:", [] when there are none).

  A registered name is refused unless `replace=True`: re-registering
  "token", the default, would change every later call in the process.
  """
  if (not isinstance(name, str) or not name or ":" in name or "," in name
      or name != name.strip()):
    raise ValueError(f"verifier name must be a non-empty string without ':', "
                     f"',' or surrounding spaces, got {name!r}.")
  if not callable(factory):
    raise TypeError(f"factory must be callable (args -> Verifier), got "
                    f"{type(factory).__name__}.")
  if isinstance(factory, type):
    # The class itself would be called with the argument list as its first
    # field (TokenVerifier(coupling_rule=[])).
    raise TypeError(f"factory must be a function args -> Verifier, got the "
                    f"class {factory.__name__}; pass e.g. "
                    f"lambda args: {factory.__name__}().")
  if name in _REGISTRY and not _checks.check_bool("replace", replace):
    raise ValueError(f"verifier {name!r} is already registered; pass "
                     "replace=True to replace it, or choose another name.")
  _REGISTRY[name] = factory


def available_verifiers() -> tuple[str, ...]:
  """The registered names, in registration order."""
  return tuple(_REGISTRY)


def _no_args(cls):
  def factory(args):
    if args:
      raise ValueError(f"verifier {cls.name!r} takes no arguments, got "
                       f"{','.join(args)!r}.")
    return cls()
  return factory


def _floats(name, args, count, example):
  if len(args) != count:
    raise ValueError(f"verifier {name!r} needs {count} comma-separated "
                     f"number(s), e.g. {example!r}; got {args!r}.")
  # ASCII decimals only: float() also reads "0_5" as 5.0 and "٠.٥" as 0.5.
  if not all(re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?",
                          a) for a in args):
    raise ValueError(f"verifier {name!r}: arguments must be numbers, e.g. "
                     f"{example!r}; got {args!r}.")
  return [float(a) for a in args]


register_verifier("token", _no_args(TokenVerifier))
register_verifier("block", _no_args(BlockVerifier))
register_verifier("lenient", lambda args: LenientVerifier(
    *_floats("lenient", args, 1, "lenient:0.5")))
register_verifier("typical", lambda args: TypicalVerifier(
    *_floats("typical", args, 2, "typical:0.09,0.3")))
register_verifier("wrong_fallback", _no_args(WrongFallbackControl))
register_verifier("always_accept", _no_args(AlwaysAcceptControl))
register_verifier("tree", _trees.factory(TreeVerifier, "iid"))
register_verifier("tree-wor", _trees.factory(TreeVerifier, "wor"))
register_verifier("tree-skip-residual",
                  _trees.factory(TreeSkipResidualControl, "iid"))
register_verifier("traversal", _trees.factory(TraversalVerifier, "iid"))
register_verifier("traversal-wor", _trees.factory(TraversalVerifier, "wor"))
register_verifier("traversal-no-final-residual",
                  _trees.factory(TraversalNoFinalResidualControl, "iid"))
register_verifier("spectr", _trees.factory(KSeqVerifier, "iid"))
register_verifier("spectr-wrong-residual",
                  _trees.factory(KSeqWrongResidualControl, "iid"))
register_verifier("greedy-draft", _trees.factory(GreedyDraftVerifier,
                                                 "greedy"))
register_verifier("greedy-draft-residual-outside-drafts",
                  _trees.factory(GreedyDraftResidualOutsideControl, "greedy"))
register_verifier("canonical", _trees.factory(CanonicalVerifier, "iid"))
register_verifier("canonical-draft-law-q",
                  _trees.factory(CanonicalDraftLawQControl, "iid"))


def get_verifier(spec: str | Verifier) -> Verifier:
  """A `Verifier` from a registry string ("block", "lenient:0.5") or itself.

  Raises ValueError naming the registered verifiers for an unknown name, and
  the verifier's own error for bad arguments.
  """
  if isinstance(spec, Verifier):
    return _check_verifier(spec)
  if not isinstance(spec, str):
    raise TypeError(f"verifier must be a registry string (one of "
                    f"{available_verifiers()}, e.g. 'block' or "
                    f"'lenient:0.5') or a Verifier, got "
                    f"{type(spec).__name__}.")
  name, _, rest = spec.strip().partition(":")
  if name not in _REGISTRY:
    raise ValueError(f"unknown verifier {spec!r}; registered: "
                     f"{available_verifiers()} (arguments after ':', e.g. "
                     "'lenient:0.5', 'typical:0.09,0.3').")
  args = [a.strip() for a in rest.split(",")] if rest.strip() else []
  verifier = _REGISTRY[name](args)
  if not isinstance(verifier, Verifier):
    raise TypeError(f"the factory registered as {name!r} returned "
                    f"{type(verifier).__name__}, not a Verifier.")
  return _check_verifier(verifier)


def _check_verifier(verifier: Verifier) -> Verifier:
  """Refuses what would fail inside the compiled loop: a verifier class
  that does not implement the round, or one that is not hashable (it is a
  static argument of the loop)."""
  cls = type(verifier)
  missing = [m for m in ("num_uniforms", "verify")
             if getattr(cls, m) is getattr(Verifier, m)]
  if missing:
    raise TypeError(f"verifier {cls.__name__} does not implement {missing}; "
                    "subclass TokenVerifier or implement both (see "
                    "specjax.decode.verifiers.base.Verifier).")
  _checks.check_hashable("verifier", verifier)
  return verifier


__all__ = ["Verifier", "TokenVerifier", "BlockVerifier", "LenientVerifier",
           "TypicalVerifier", "WrongFallbackControl", "AlwaysAcceptControl",
           "TreeVerifier", "TreeSkipResidualControl", "TraversalVerifier",
           "TraversalNoFinalResidualControl", "KSeqVerifier",
           "KSeqWrongResidualControl", "GreedyDraftVerifier",
           "GreedyDraftResidualOutsideControl", "CanonicalVerifier",
           "CanonicalDraftLawQControl",
           "register_verifier", "available_verifiers", "get_verifier"]
