"""The constrained target's exact law on the lab, for constrained decoding.

A small regular language over the lab's tokens, written as a plain Python
automaton (`LabLanguage`), and the exact law of the first k tokens that a
constrained decoder must sample: at each position, the target's law
restricted to the tokens the automaton allows there and renormalised, then
the sampling transform; EOS is allowed at final states only, and a token
into a stop state (final, nothing may follow) ends the row as an EOS does.

The law is computed here from the automaton's own transition dict, apart
from the device tables `specjax.constraint` builds from it (`to_constraint`),
which are what the decode loop reads.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from specjax import constraint as constraint_lib
from specjax import sampling as sampling_lib
from specjax.lab import markov


@dataclasses.dataclass(frozen=True)
class LabLanguage:
  """A DFA over token ids: `edges[state]` maps each allowed non-EOS token to
  the next state; `final` are accepting states. Token i stands for the byte
  `letters[i]` (None: no text, e.g. EOS)."""
  edges: dict
  final: frozenset
  initial: int
  letters: tuple

  def allowed(self, state: int, eos_id: int | None) -> np.ndarray:
    """bool `[V]`: the tokens allowed after `state`."""
    ok = np.zeros(len(self.letters), bool)
    ok[list(self.edges[state])] = True
    if eos_id is not None and state in self.final:
      ok[eos_id] = True
    return ok

  def stops(self, state: int) -> bool:
    return state in self.final and not self.edges[state]


def lab_language() -> LabLanguage:
  """(a | bc)* c a? over tokens a, b, c = 0, 1, 2 (token 3 has no text: the
  lab's EOS). State 0 allows a, b, c; state 1 (after b) only c; state 2
  (after the final c) is final and allows a or EOS; state 3 (after c a) is
  a stop state."""
  return LabLanguage(
      edges={0: {0: 0, 1: 1, 2: 2}, 1: {2: 0}, 2: {0: 3}, 3: {}},
      final=frozenset({2, 3}), initial=0, letters=(b"a", b"b", b"c", None))


def to_constraint(language: LabLanguage) -> constraint_lib.Constraint:
  """The device tables of `language` (its letters as a byte DFA)."""
  num = len(language.edges)
  next_Sx256 = np.full((num, 256), -1)
  for s, edges in language.edges.items():
    for token, t in edges.items():
      next_Sx256[s, language.letters[token][0]] = t
  final_S = np.array([s in language.final for s in range(num)])
  return constraint_lib.from_byte_dfa(
      next_Sx256, final_S, language.initial, list(language.letters),
      pattern="lab")


def constrained_law(pair: markov.MarkovPair, k: int, context: int,
                    language: LabLanguage, eos_id: int | None,
                    sampling: sampling_lib.SamplingConfig | None = None
                    ) -> np.ndarray:
  """float64 `[(V + 1)**k]`: the constrained target's law of the first k
  tokens after a prompt ending in `context`, indexed by the tokens as
  digits in radix V + 1 (first most significant), digit V after the row's
  end (its first EOS, or its first token into a stop state)."""
  vocab = pair.vocab_size
  if len(language.letters) != vocab:
    raise ValueError(f"language has {len(language.letters)} tokens, the "
                     f"pair {vocab}.")
  sampling = sampling or sampling_lib.SamplingConfig()
  log_p_VxV = np.log(pair.target_trans_VxV)
  law = np.zeros((vocab + 1) ** k)

  def visit(prev, state, depth, prob, digits):
    if depth == k:
      law[int(np.dot(digits, (vocab + 1) ** np.arange(k - 1, -1, -1)))] += (
          prob)
      return
    ok_V = language.allowed(state, eos_id)
    logits = np.where(ok_V, log_p_VxV[prev], -np.inf)
    p_V = np.asarray(sampling_lib.probabilities(
        jnp.asarray(logits, jnp.float32), sampling), np.float64)
    p_V = np.where(ok_V, p_V, 0.0)
    p_V /= p_V.sum()
    for x in np.flatnonzero(p_V > 0):
      if x == eos_id:
        visit_end(depth, prob * p_V[x], digits + [x])
        continue
      nxt = language.edges[state][x]
      if language.stops(nxt):
        visit_end(depth, prob * p_V[x], digits + [x])
      else:
        visit(x, nxt, depth + 1, prob * p_V[x], digits + [x])

  def visit_end(depth, prob, digits):
    visit(None, None, k, prob, digits + [vocab] * (k - depth - 1))

  visit(context, language.initial, 0, 1.0, [])
  return law
