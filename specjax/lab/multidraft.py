"""Multi-draft and traversal verification, exactly, with the optimum beside.

One step with k drafts. The target's law is p and the draft's q, over a small
vocabulary V; the draft proposes a k-tuple of tokens under a draft scheme:

  "iid"     k i.i.d. draws from q (SpecInfer, SpecTr, Khisti et al.);
  "wor"     k draws without replacement (x_j from q without x_1..x_{j-1},
            renormalised; RSD, Jeon et al. 2024); a slot where q has no
            mass left stays empty;
  "greedy"  Hu et al. (ICLR 2025, "Towards optimal multi-draft speculative
            decoding"): the k - 1 most likely tokens under q (ties: the
            lower id), and one draw from q without them.

A verifier sees the drafts and emits one token Y; it is exact when Y ~ p.
Its acceptance is P(Y is one of the drafts), the quantity the optimum
bounds. For every scheme the best any exact verifier can do is the optimal
transport value

  alpha*(scheme) = max over couplings of (S, Y), S ~ drafted set, Y ~ p,
                   of P(Y in S),

`optimal_acceptance` (a linear program, scipy's HiGHS). Its dual is a
minimum over token subsets A (`dual_acceptance`, Hu et al.'s subset
selection): alpha* = min_A [p(V \\ A) + P(S meets A)], which for i.i.d.
drafts is min_A [p(V \\ A) + 1 - (1 - q(A))^k] (Khisti et al.'s k = 2 bound,
for every k) and for greedy drafts the closed form
p(T) + sum_{y not in T} min(p(y), q'(y)), T the top k - 1 tokens and q' the
law of the last draw.

The verifiers (`one_step_law`), each an exact law by enumerating the draft
tuples and every accept / reject outcome (no sampling):

  specinfer   i.i.d. drafts, recursive rejection sampling: r = p; keep x_j
              with probability min(1, r(x_j)/q(x_j)), else r <- (r - q)+
              normalised; if none is kept emit a draw from r. What
              specjax's "tree" verifier does at one node.
  rsd         the same over drafts without replacement, judged against q
              without the earlier drafts ("tree-wor" at one node).
  kseq        SpecTr's K-SEQ (Sun et al. 2023): keep x_j with probability
              min(1, p(x_j) / (rho q(x_j))), rho in [1, k] the root of
              1 - (1 - beta)^k = rho beta, beta = sum min(q, p / rho); the
              first kept draft is emitted, else a draw from the residual
              p - min(q, p / rho) (1 - (1 - beta)^k) / beta, normalised.
  canonical   Khisti et al. (ICLR 2025): pick one draft Z (importance
              weights p(x)/q(x) over the slots, `selection="ratio"`, or the
              selection that a linear program finds best,
              `selection="lp"`), then single-draft speculative sampling of Z
              against p with Z's own law q_Z.
  greedy      Hu et al.'s greedy drafts, verified by single-draft
              speculative sampling of the last draw against p with its own
              law q': a residual draw that lands in T is a drafted token.
  traversal   Weng et al. (NeurIPS 2025): on a depth-1 tree of k children
              it is recursive rejection sampling (specinfer / rsd).

Traversal Verification on deeper static trees (`traversal_round_law`)
walks a tree leaves-to-root over the lab's Markov pairs: every node carries
a block-verification weight w = min(1, w_parent p(x)/q(x)); the first
remaining leaf in depth-first order is kept with probability w (the path to
it and a final token from its residual are emitted) or removed, and then its
parent's law and weight become (w p - q)+ normalised and
sum (w p - q)+ / (sum (w p - q)+ + 1 - w); the root is always kept. On a
chain it is block verification, on one level recursive rejection sampling.
Its round law chains into the law of the first N tokens with
`specjax.lab.exact.chain_blocks`, as the lab's other trees
(`specjax.lab.trees`) do.

Each verifier has a deliberately wrong negative control (`CONTROLS`): an
exactness check that cannot tell it from the real rule proves nothing.

The lab grid and the study (`python -m benchmarks.multidraft_optimum`):
`lab_settings` (19 one-step (p, q) pairs, random and adversarial),
`one_step_table` (every verifier, its control and every optimum on them),
`tree_table` (traversal against token-level trees on the Markov pairs) and
`study_summary` (the headline numbers). tests/test_multidraft_lab.py checks
them; docs/multidraft.md explains them.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from specjax import _checks
from specjax.decode import tree as tree_lib
from specjax.lab import exact
from specjax.lab import markov
from specjax.lab import trees as lab_trees
from specjax.lab import verifiers as lab_verifiers

SCHEMES = ("iid", "wor", "greedy")
SELECTIONS = ("ratio", "lp")
# verifier -> (draft scheme, its negative control).
VERIFIERS = {
    "specinfer": ("iid", "skip_residual"),
    "rsd": ("wor", "skip_residual"),
    "kseq": ("iid", "wrong_residual"),
    "canonical": ("iid", "draft_law_q"),
    "canonical_lp": ("iid", "draft_law_q"),
    "greedy": ("greedy", "residual_outside_drafts"),
    "traversal": ("iid", "no_final_residual"),
    "traversal_wor": ("wor", "no_final_residual"),
}
# control -> what it gets wrong.
CONTROLS = {
    "skip_residual": "a rejected draft leaves r unchanged: later drafts and "
                     "the final token are judged against p itself",
    "wrong_residual": "K-SEQ's residual subtracts one draft's accepted mass "
                      "min(q, p / rho), not k drafts' (1 - (1 - beta)^k) / "
                      "beta times it",
    "draft_law_q": "judges the selected draft as if it were drawn from q, "
                   "not from its own law q_Z",
    "residual_outside_drafts": "draws the residual only over the tokens "
                               "outside the greedy top k - 1",
    "no_final_residual": "a kept node whose children were all removed emits "
                         "its final token from p, not from its residual",
}

# V ** k draft tuples are enumerated: cap the work.
_MAX_TUPLES = 2 ** 16
# Subsets of V in the dual.
_MAX_DUAL_VOCAB = 16
# Token rows are laws to this tolerance.
_SUM_TOL = 1e-9


class Setting(NamedTuple):
  """One lab setting: a name, p_V and q_V, and its kind ("random" or
  "adversarial")."""
  name: str
  p_V: np.ndarray
  q_V: np.ndarray
  kind: str


# ------------------------------------------------------------- checks --


def _check_law(name: str, x) -> np.ndarray:
  x = np.asarray(x)
  if x.dtype.kind not in "fiu" or x.dtype == bool:
    raise TypeError(f"{name} must be a float array of probabilities, got "
                    f"dtype {x.dtype}.")
  x = x.astype(np.float64)
  if x.ndim != 1 or x.shape[0] < 2:
    raise ValueError(f"{name} must have shape [V] with V >= 2, got "
                     f"{x.shape}.")
  if not np.all(np.isfinite(x)) or np.any(x < 0):
    raise ValueError(f"{name} must be finite and non-negative.")
  if abs(x.sum() - 1.0) > _SUM_TOL:
    raise ValueError(f"{name} must sum to 1 (within {_SUM_TOL:g}); it sums "
                     f"to {x.sum():.12g}.")
  return x


def _check_pq(p, q) -> tuple[np.ndarray, np.ndarray]:
  p_V, q_V = _check_law("p", p), _check_law("q", q)
  if p_V.shape != q_V.shape:
    raise ValueError(f"p and q must share the vocabulary: p has "
                     f"{p_V.shape[0]} tokens, q has {q_V.shape[0]}.")
  return p_V, q_V


def _check_scheme(scheme: str) -> str:
  if scheme not in SCHEMES:
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}.")
  return scheme


def _check_k(k, vocab: int, scheme: str) -> int:
  k = _checks.check_int("k", k, low=1)
  if scheme in ("wor", "greedy") and k > vocab:
    raise ValueError(f"k={k} drafts {scheme} need k <= V={vocab} distinct "
                     "tokens.")
  if vocab ** k > _MAX_TUPLES:
    raise ValueError(f"k={k} gives {vocab}**{k} draft tuples, more than the "
                     f"{_MAX_TUPLES} the lab enumerates.")
  return k


def _check_control(control, allowed: str):
  if control is not None and control != allowed:
    raise ValueError(f"control must be None (the exact rule) or "
                     f"{allowed!r}, got {control!r}.")
  return control


def _ratio(num, den):
  """min(1, num / den) without dividing where num >= den; num = den = 0 gives
  0 (a draft of q = 0 is never proposed; r = 0 refuses it)."""
  over = num >= den
  return np.where(over, (num > 0).astype(np.float64),
                  num / np.where(over, 1.0, den))


def _normalise_or(excess, fallback):
  mass = excess.sum(-1, keepdims=True)
  return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), fallback)


# -------------------------------------------------------- draft laws --


def draft_law(q, k: int, scheme: str = "iid"):
  """The exact law of the k-tuple of drafts.

  Args:
    q: the draft's law `[V]`.
    k: drafts per step, >= 1 (V ** k <= 65,536).
    scheme: "iid", "wor" or "greedy" (module docstring).

  Returns:
    (drafts_NxK int64, prob_N float64): every tuple of positive probability
    (-1 marks an empty slot: a "wor" or "greedy" draw where q has no mass
    left) and its probability; prob_N sums to 1.
  """
  q_V = _check_law("q", q)
  scheme = _check_scheme(scheme)
  vocab = q_V.shape[0]
  k = _check_k(k, vocab, scheme)
  if scheme == "iid":
    drafts_NxK = np.array(list(itertools.product(range(vocab), repeat=k)),
                          np.int64)
    prob_N = np.prod(q_V[drafts_NxK], axis=-1)
  elif scheme == "wor":
    drafts_NxK, prob_N = _wor_tuples(q_V, k)
  else:
    top = np.argsort(-q_V, kind="stable")[:k - 1]
    rest_V = np.ones(vocab, bool)
    rest_V[top] = False
    mass = q_V[rest_V].sum()
    if mass > 0:
      last = np.flatnonzero(rest_V & (q_V > 0))
      drafts_NxK = np.concatenate([np.tile(top, (len(last), 1)),
                                   last[:, None]], axis=1)
      prob_N = q_V[last] / mass
    else:  # q lives on the top k - 1: the last slot stays empty
      drafts_NxK = np.append(top, -1)[None]
      prob_N = np.ones(1)
  keep = prob_N > 0
  return drafts_NxK[keep].astype(np.int64), prob_N[keep]


def _wor_tuples(q_V, k):
  vocab = q_V.shape[0]
  tuples, probs = [()], [1.0]
  for _ in range(k):
    new_tuples, new_probs = [], []
    for drafted, prob in zip(tuples, probs):
      left_V = q_V.copy()
      left_V[[x for x in drafted if x >= 0]] = 0.0
      # The mass left is summed over what is left, not 1 - the drafted
      # mass: no cancellation when q is nearly one-hot.
      mass = left_V.sum()
      if mass <= 0:
        new_tuples.append(drafted + (-1,))
        new_probs.append(prob)
        continue
      for x in range(vocab):
        if left_V[x] > 0:
          new_tuples.append(drafted + (x,))
          new_probs.append(prob * left_V[x] / mass)
    tuples, probs = new_tuples, new_probs
  return np.array(tuples, np.int64).reshape(len(tuples), k), np.array(probs)


def _members(drafts_NxK, vocab: int) -> np.ndarray:
  """bool `[N, V]`: which tokens each tuple drafted."""
  mask_NxV = np.zeros((drafts_NxK.shape[0], vocab), bool)
  rows_NxK = np.broadcast_to(np.arange(drafts_NxK.shape[0])[:, None],
                             drafts_NxK.shape)
  valid = drafts_NxK >= 0
  mask_NxV[rows_NxK[valid], drafts_NxK[valid]] = True
  return mask_NxV


def set_law(q, k: int, scheme: str = "iid"):
  """The law of the drafted SET (what the optimum depends on).

  Returns:
    (sets_SxV bool, prob_S float64): each distinct set of drafted tokens of
    positive probability, and its probability.
  """
  drafts_NxK, prob_N = draft_law(q, k, scheme)
  mask_NxV = _members(drafts_NxK, np.asarray(q).shape[-1])
  sets_SxV, inverse = np.unique(mask_NxV, axis=0, return_inverse=True)
  prob_S = np.bincount(inverse.reshape(-1), weights=prob_N,
                       minlength=sets_SxV.shape[0])
  return sets_SxV, prob_S


# ---------------------------------------------------------- optimum --


def optimal_acceptance(p, q, k: int, scheme: str = "iid") -> float:
  """The best acceptance any exact verifier reaches on these drafts.

  The transport LP: maximise sum_{S, y in S} pi(S, y) over pi >= 0 with
  sum_y pi(S, y) <= P(S) and sum_S pi(S, y) <= p(y) (a coupling of the
  drafted set with p restricted to its matched mass; the unmatched mass
  couples arbitrarily). The objective depends on the draft tuple only
  through its set, so the optimum over couplings of the tuple's law is the
  same. Solved with scipy.optimize.linprog (HiGHS dual simplex, primal and
  dual feasibility tolerance 1e-10).

  Args:
    p, q: target and draft laws `[V]`.
    k: drafts, >= 1.
    scheme: "iid", "wor" or "greedy".

  Returns:
    alpha* in [0, 1]; for k = 1 it is sum_x min(p(x), q(x)).
  """
  from scipy import optimize  # pylint: disable=import-outside-toplevel
  from scipy import sparse  # pylint: disable=import-outside-toplevel
  p_V, q_V = _check_pq(p, q)
  sets_SxV, prob_S = set_law(q_V, k, scheme)
  set_E, token_E = np.nonzero(sets_SxV)  # one variable per (set, member)
  num_sets, vocab, num_vars = sets_SxV.shape[0], p_V.shape[0], set_E.shape[0]
  rows = np.concatenate([set_E, num_sets + token_E])
  cols = np.concatenate([np.arange(num_vars)] * 2)
  a_ub = sparse.csr_matrix((np.ones(2 * num_vars), (rows, cols)),
                           shape=(num_sets + vocab, num_vars))
  b_ub = np.concatenate([prob_S, p_V])
  result = optimize.linprog(
      -np.ones(num_vars), A_ub=a_ub, b_ub=b_ub, bounds=(0, None),
      method="highs-ds",
      options=dict(primal_feasibility_tolerance=1e-10,
                   dual_feasibility_tolerance=1e-10))
  if result.status != 0:
    raise RuntimeError(f"linprog failed on the transport LP: "
                       f"{result.message}")
  return float(min(1.0, max(0.0, -result.fun)))


def dual_acceptance(p, q, k: int, scheme: str = "iid",
                    subsets: str = "all") -> float:
  """alpha* from the dual (Hu et al.'s subset selection), no LP solver.

  alpha* = min over token subsets A of p(V \\ A) + P(S meets A) (max-flow /
  min-cut on the bipartite graph of drafted sets and tokens). P(S meets A)
  is 1 - (1 - q(A))^k for "iid" (closed form); for "wor" it comes from the
  enumerated set law; for "greedy" the minimum has the closed form
  p(T) + sum_{y not in T} min(p(y), q'(y)) (T: the top k - 1 of q, q': q
  without T, renormalised), which is returned.

  Args:
    p, q, k, scheme: as `optimal_acceptance`.
    subsets: "all" (every one of the 2^V subsets; V <= 16) or "sorted" (the
      V + 1 sets of the tokens of largest p/q: Hu et al.'s fast route for
      "iid" and "wor", which the tests check against "all").
  """
  p_V, q_V = _check_pq(p, q)
  scheme = _check_scheme(scheme)
  vocab = p_V.shape[0]
  k = _check_k(k, vocab, scheme)
  if subsets not in ("all", "sorted"):
    raise ValueError(f"subsets must be 'all' or 'sorted', got {subsets!r}.")
  if scheme == "greedy":
    top = np.argsort(-q_V, kind="stable")[:k - 1]
    rest_V = np.ones(vocab, bool)
    rest_V[top] = False
    mass = q_V[rest_V].sum()
    last_V = np.where(rest_V, q_V, 0.0) / (mass if mass > 0 else 1.0)
    return float(p_V[top].sum() + np.minimum(p_V, last_V)[rest_V].sum())
  if subsets == "sorted":
    # Largest p/q first (q = 0 < p: infinite; p = q = 0: last).
    ratio_V = np.where(q_V > 0, p_V / np.where(q_V > 0, q_V, 1.0),
                       np.where(p_V > 0, np.inf, -1.0))
    order = np.argsort(-ratio_V, kind="stable")
    subsets_AxV = np.zeros((vocab + 1, vocab), bool)
    for j in range(1, vocab + 1):
      subsets_AxV[j, order[:j]] = True
  elif vocab > _MAX_DUAL_VOCAB:
    raise ValueError(f"dual_acceptance enumerates 2^V subsets: V={vocab} is "
                     f"more than {_MAX_DUAL_VOCAB}; pass subsets='sorted'.")
  else:
    subsets_AxV = ((np.arange(2 ** vocab)[:, None] >> np.arange(vocab)) & 1
                   ).astype(bool)
  if scheme == "iid":
    meets_A = 1.0 - (1.0 - subsets_AxV @ q_V) ** k
  else:
    sets_SxV, prob_S = set_law(q_V, k, scheme)
    meets_A = ((subsets_AxV.astype(np.float64) @ sets_SxV.T) > 0) @ prob_S
  value_A = (~subsets_AxV) @ p_V + meets_A
  return float(min(1.0, value_A.min()))


# ------------------------------------------------ one-step verifiers --


def _accumulate(drafts_NxK, prob_N, law_NxV):
  """(output law `[V]`, P(output is a draft)) of per-tuple laws."""
  vocab = law_NxV.shape[-1]
  out_V = prob_N @ law_NxV
  hit = float(prob_N @ np.where(_members(drafts_NxK, vocab), law_NxV,
                                0.0).sum(-1))
  return out_V, hit


def _rrs_laws(p_V, q_V, drafts_NxK, mode: str, update: bool):
  """Recursive rejection sampling given the drafts: law `[N, V]` of Y."""
  num, k = drafts_NxK.shape
  rows = np.arange(num)
  r_NxV = np.tile(p_V, (num, 1))
  taken_NxV = np.zeros(r_NxV.shape, bool)
  reach_N = np.ones(num)
  law_NxV = np.zeros(r_NxV.shape)
  for j in range(k):
    x_N = drafts_NxK[:, j]
    valid_N = x_N >= 0
    safe_N = np.maximum(x_N, 0)
    if mode == "wor":
      q_NxV = np.where(taken_NxV, 0.0, q_V[None])
      mass_N1 = q_NxV.sum(-1, keepdims=True)
      q_NxV = q_NxV / np.where(mass_N1 > 0, mass_N1, 1.0)
    else:
      q_NxV = np.broadcast_to(q_V[None], r_NxV.shape)
    keep_N = np.where(valid_N, _ratio(r_NxV[rows, safe_N],
                                      q_NxV[rows, safe_N]), 0.0)
    law_NxV[rows, safe_N] += reach_N * keep_N
    reach_N = reach_N * (1.0 - keep_N)
    if update:
      new_r = _normalise_or(np.maximum(r_NxV - q_NxV, 0.0), r_NxV)
      r_NxV = np.where(valid_N[:, None], new_r, r_NxV)
    taken_NxV[rows[valid_N], x_N[valid_N]] = True
  return law_NxV + reach_N[:, None] * r_NxV


def specinfer_law(p, q, k: int, control: str | None = None):
  """SpecInfer's token-level multi-draft verification, exactly.

  k i.i.d. drafts; recursive rejection sampling against r (r = p, then
  (r - q)+ normalised after each rejection); a draw from r if all are
  rejected. Exact for every p, q, k (a rejected x has r(x) = 0 afterwards,
  so the final draw never emits a drafted token).

  Args:
    p, q: `[V]`; k: >= 1.
    control: None, or "skip_residual" (the negative control).

  Returns:
    (law_V, acceptance): the law of the emitted token (p up to rounding
    unless a control) and P(it is one of the drafts).
  """
  p_V, q_V = _check_pq(p, q)
  _check_control(control, "skip_residual")
  drafts_NxK, prob_N = draft_law(q_V, k, "iid")
  laws = _rrs_laws(p_V, q_V, drafts_NxK, "iid", control is None)
  return _accumulate(drafts_NxK, prob_N, laws)


def rsd_law(p, q, k: int, control: str | None = None):
  """RSD: recursive rejection sampling over drafts without replacement.

  Draft j is judged against q without x_1..x_{j-1}, renormalised (its own
  law), so the residual update stays exact. As `specinfer_law`.
  """
  p_V, q_V = _check_pq(p, q)
  _check_control(control, "skip_residual")
  drafts_NxK, prob_N = draft_law(q_V, k, "wor")
  laws = _rrs_laws(p_V, q_V, drafts_NxK, "wor", control is None)
  return _accumulate(drafts_NxK, prob_N, laws)


def kseq_rho(p, q, k: int) -> float:
  """SpecTr's rho in [1, k]: the least rho with 1 - (1 - beta)^k <= rho beta,
  beta = sum_x min(q(x), p(x) / rho).

  The left side falls and the right side rises with rho (f(1) >= 0 >= f(k)),
  so bisection finds it; the upper end is returned, on the exact side (the
  accepted mass never exceeds p), 1e-15 away from the root.
  """
  p_V, q_V = _check_pq(p, q)
  k = _checks.check_int("k", k, low=1)

  def excess(rho):
    beta = np.minimum(q_V, p_V / rho).sum()
    return 1.0 - (1.0 - beta) ** k - rho * beta

  if excess(1.0) <= 0:
    return 1.0
  low, high = 1.0, float(k)
  for _ in range(200):
    mid = 0.5 * (low + high)
    if excess(mid) > 0:
      low = mid
    else:
      high = mid
    if high - low <= 1e-15:
      break
  return high


def kseq_law(p, q, k: int, control: str | None = None):
  """SpecTr's K-SEQ on k i.i.d. drafts, exactly.

  Keep the first x_j that passes u < min(1, p(x_j) / (rho q(x_j))); if none
  does, emit a draw from the residual (p - m)+ normalised, m(y) =
  min(q(y), p(y) / rho) (1 - (1 - beta)^k) / beta the mass the k drafts
  emit as y. rho = `kseq_rho` makes m <= p, so the law is p; the
  acceptance is at least 1 - (1 - beta)^k >= (1 - 1/e) alpha*(iid)
  (SpecTr's guarantee, checked by the tests).

  control: None, or "wrong_residual" (subtracts min(q, p / rho), one
  draft's accepted mass; exact only where k = 1 or no draft is rejected).
  """
  p_V, q_V = _check_pq(p, q)
  _check_control(control, "wrong_residual")
  drafts_NxK, prob_N = draft_law(q_V, k, "iid")
  rho = kseq_rho(p_V, q_V, k)
  single_V = np.minimum(q_V, p_V / rho)
  beta = single_V.sum()
  accept_V = _ratio(p_V / rho, q_V)
  factor = (1.0 - (1.0 - beta) ** k) / beta if beta > 0 else 0.0
  emitted_V = single_V if control else single_V * factor
  residual_V = _normalise_or(np.maximum(p_V - emitted_V, 0.0), p_V)
  num = drafts_NxK.shape[0]
  law_NxV = np.zeros((num, p_V.shape[0]))
  reach_N = np.ones(num)
  for j in range(k):
    keep_N = accept_V[drafts_NxK[:, j]]
    law_NxV[np.arange(num), drafts_NxK[:, j]] += reach_N * keep_N
    reach_N = reach_N * (1.0 - keep_N)
  law_NxV += reach_N[:, None] * residual_V
  return _accumulate(drafts_NxK, prob_N, law_NxV)


def _selection_lp(p_V, sets_SxV, prob_S):
  """The selection law sel(z | S) maximising sum_z min(p(z), q_Z(z)), q_Z(z)
  = sum_S P(S) sel(z | S): Khisti et al.'s optimal importance sampling, a
  linear program. Returns `[S, V]`."""
  from scipy import optimize  # pylint: disable=import-outside-toplevel
  from scipy import sparse  # pylint: disable=import-outside-toplevel
  set_E, token_E = np.nonzero(sets_SxV)
  num_sets, vocab, num_sel = sets_SxV.shape[0], p_V.shape[0], set_E.shape[0]
  # Variables: sel over (set, member), then m_V; maximise sum m.
  cost = np.concatenate([np.zeros(num_sel), -np.ones(vocab)])
  # m_z - sum_S P(S) sel(z | S) <= 0.
  a_ub = sparse.hstack([
      sparse.csr_matrix((-prob_S[set_E], (token_E, np.arange(num_sel))),
                        shape=(vocab, num_sel)),
      sparse.identity(vocab)]).tocsr()
  a_eq = sparse.csr_matrix((np.ones(num_sel), (set_E, np.arange(num_sel))),
                           shape=(num_sets, num_sel + vocab))
  bounds = [(0, None)] * num_sel + [(0, float(x)) for x in p_V]
  result = optimize.linprog(
      cost, A_ub=a_ub, b_ub=np.zeros(vocab), A_eq=a_eq,
      b_eq=np.ones(num_sets), bounds=bounds, method="highs-ds",
      options=dict(primal_feasibility_tolerance=1e-10,
                   dual_feasibility_tolerance=1e-10))
  if result.status != 0:
    raise RuntimeError(f"linprog failed on the selection LP: "
                       f"{result.message}")
  sel_SxV = np.zeros(sets_SxV.shape)
  sel_SxV[set_E, token_E] = np.maximum(result.x[:num_sel], 0.0)
  return sel_SxV / sel_SxV.sum(-1, keepdims=True)


def canonical_law(p, q, k: int, selection: str = "ratio",
                  scheme: str = "iid", control: str | None = None):
  """Khisti et al.'s canonical architecture: select, then speculate.

  Step 1 picks one draft Z: `selection="ratio"` picks slot j with
  probability proportional to p(x_j) / q(x_j) (importance sampling;
  uniformly if every weight is 0), `selection="lp"` the selection law over
  drafted sets that maximises sum min(p, q_Z) (a linear program; Khisti et
  al. show it reaches alpha*). Step 2 is single-draft speculative sampling
  of Z against p with Z's law q_Z (enumerated): keep Z with probability
  min(1, p(Z) / q_Z(Z)), else a draw from (p - q_Z)+ normalised. Exact for
  any selection rule, since Z ~ q_Z.

  control: None, or "draft_law_q" (step 2 uses q in place of q_Z: exact
  only at k = 1, where q_Z = q).
  """
  p_V, q_V = _check_pq(p, q)
  if selection not in SELECTIONS:
    raise ValueError(f"selection must be one of {SELECTIONS}, got "
                     f"{selection!r}.")
  _check_control(control, "draft_law_q")
  drafts_NxK, prob_N = draft_law(q_V, k, scheme)
  vocab, num = p_V.shape[0], drafts_NxK.shape[0]
  valid_NxK = drafts_NxK >= 0
  safe_NxK = np.maximum(drafts_NxK, 0)
  sel_NxV = np.zeros((num, vocab))
  if selection == "ratio":
    weight_NxK = np.where(valid_NxK, _importance(p_V, q_V)[safe_NxK], 0.0)
    total_N1 = weight_NxK.sum(-1, keepdims=True)
    uniform_NxK = valid_NxK / valid_NxK.sum(-1, keepdims=True)
    weight_NxK = np.where(total_N1 > 0, weight_NxK / np.where(
        total_N1 > 0, total_N1, 1.0), uniform_NxK)
    rows_NxK = np.broadcast_to(np.arange(num)[:, None], drafts_NxK.shape)
    np.add.at(sel_NxV, (rows_NxK, safe_NxK), weight_NxK)
  else:
    mask_NxV = _members(drafts_NxK, vocab)
    sets_SxV, inverse = np.unique(mask_NxV, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    prob_S = np.bincount(inverse, weights=prob_N,
                         minlength=sets_SxV.shape[0])
    sel_NxV = _selection_lp(p_V, sets_SxV, prob_S)[inverse]
  q_z_V = prob_N @ sel_NxV
  judge_V = q_V if control else q_z_V
  keep_V = _ratio(p_V, judge_V)
  residual_V = _normalise_or(np.maximum(p_V - judge_V, 0.0), p_V)
  law_NxV = sel_NxV * keep_V + (sel_NxV * (1.0 - keep_V)).sum(
      -1, keepdims=True) * residual_V
  return _accumulate(drafts_NxK, prob_N, law_NxV)


def _importance(p_V, q_V):
  """p / q where q > 0 (drafted tokens always have q > 0)."""
  return np.where(q_V > 0, p_V / np.where(q_V > 0, q_V, 1.0), 0.0)


def greedy_law(p, q, k: int, control: str | None = None):
  """Hu et al.'s greedy drafts and their verifier, exactly.

  T = the top k - 1 tokens of q are drafted outright; the last draft x is
  drawn from q' = q without T, renormalised. Speculative sampling of x
  against p with law q' (keep x with probability min(1, p(x) / q'(x)),
  else a draw from (p - q')+ normalised) emits Y ~ p, and since q' = 0 on
  T the residual puts all of p(T) on drafted tokens: the acceptance is
  p(T) + sum_{y not in T} min(p(y), q'(y)), the scheme's optimum.

  control: None, or "residual_outside_drafts" (the residual drawn only
  outside T: exact only at k = 1 or where p(T) = 0).
  """
  p_V, q_V = _check_pq(p, q)
  _check_control(control, "residual_outside_drafts")
  drafts_NxK, prob_N = draft_law(q_V, k, "greedy")
  vocab = p_V.shape[0]
  rest_V = np.ones(vocab, bool)
  rest_V[drafts_NxK[0, :k - 1]] = False
  mass = q_V[rest_V].sum()
  last_V = np.where(rest_V, q_V, 0.0) / (mass if mass > 0 else 1.0)
  excess_V = np.maximum(p_V - last_V, 0.0)
  if control:
    excess_V = np.where(rest_V, excess_V, 0.0)
  residual_V = _normalise_or(excess_V, p_V)
  x_N = drafts_NxK[:, -1]
  keep_N = np.where(x_N >= 0, _ratio(p_V[np.maximum(x_N, 0)],
                                     last_V[np.maximum(x_N, 0)]), 0.0)
  law_NxV = (1.0 - keep_N)[:, None] * residual_V
  law_NxV[np.arange(len(x_N)), np.maximum(x_N, 0)] += keep_N
  return _accumulate(drafts_NxK, prob_N, law_NxV)


def traversal_law(p, q, k: int, mode: str = "iid",
                  control: str | None = None):
  """Traversal Verification on a depth-1 tree of k children, exactly.

  Computed by the tree traversal (`traversal_round_law`) on a constant pair
  (every row p, q), not from the tuples: the tests check that it equals
  `specinfer_law` ("iid") or `rsd_law` ("wor"), which a depth-1 traversal
  is. The acceptance is P(a child is kept).

  control: None, or "no_final_residual".
  """
  p_V, q_V = _check_pq(p, q)
  mode = tree_lib.check_mode(mode)
  _check_control(control, "no_final_residual")
  k = _check_k(k, p_V.shape[0], mode)
  # MarkovPair wants rows summing to 1 within 1e-12; p and q passed 1e-9.
  pair = lab_verifiers.constant_pair(p_V / p_V.sum(), q_V / q_V.sum())
  blocks, _ = traversal_round_law(pair, (k,), mode, control)
  bos = p_V.shape[0]
  law_V = blocks[0][bos] + blocks[1][bos].sum(-1)
  return law_V, float(blocks[1][bos].sum())


_ONE_STEP = {
    "specinfer": lambda p, q, k, c: specinfer_law(p, q, k, c),
    "rsd": lambda p, q, k, c: rsd_law(p, q, k, c),
    "kseq": lambda p, q, k, c: kseq_law(p, q, k, c),
    "canonical": lambda p, q, k, c: canonical_law(p, q, k, "ratio",
                                                  control=c),
    "canonical_lp": lambda p, q, k, c: canonical_law(p, q, k, "lp",
                                                     control=c),
    "greedy": lambda p, q, k, c: greedy_law(p, q, k, c),
    "traversal": lambda p, q, k, c: traversal_law(p, q, k, "iid", c),
    "traversal_wor": lambda p, q, k, c: traversal_law(p, q, k, "wor", c),
}


def one_step_law(verifier: str, p, q, k: int, control: str | None = None):
  """(law_V, acceptance) of a verifier in `VERIFIERS` (its control with
  `control=VERIFIERS[verifier][1]`)."""
  if verifier not in VERIFIERS:
    raise ValueError(f"verifier must be one of {tuple(VERIFIERS)}, got "
                     f"{verifier!r}.")
  return _ONE_STEP[verifier](p, q, k, control)


# --------------------------------------------- traversal on trees --


def _as_topology(topology) -> tree_lib.TreeTopology:
  if isinstance(topology, tree_lib.TreeTopology):
    return topology
  if isinstance(topology, (tuple, list)):
    return tree_lib.TreeTopology.from_branching(tuple(topology))
  raise TypeError("topology must be a TreeTopology or a branching tuple "
                  f"such as (2, 1), got {type(topology).__name__}.")


def _traverse(topology, node, ctx_T, w_T, p_CxV, q_CxV, mode, control):
  """Traversal of the subtree at `node`, for T instances at once.

  Instance t: the node's token is ctx_T[t] (its row in the `_CxV` tables)
  and its incoming weight w_T[t]. The node's children are drafted (one at a
  time, as traversal meets them in depth-first order) and their subtrees
  traversed recursively; after the last child the node is itself a leaf,
  kept with probability w (always, for the root: node -1).

  Returns:
    (elim_T, acc): elim_T[t] = P(the whole subtree, the node included, is
    removed); acc[L] float64 `[T, V ** L]` = P(the subtree keeps a node and
    emits these L tokens after the node's own: the path below it, then the
    final token).
  """
  vocab = p_CxV.shape[1]
  num = ctx_T.shape[0]
  p_TxV, q_TxV = p_CxV[ctx_T], q_CxV[ctx_T]
  # States of the node between children: owner instance, probability,
  # weight, residual law, drafted tokens (for "wor").
  owner_S = np.arange(num)
  prob_S = np.ones(num)
  w_S = w_T.astype(np.float64)
  r_SxV = p_TxV.copy()
  taken_SxV = np.zeros((num, vocab), bool)
  acc = {}
  for kid in topology.children(node):
    q_SxV = q_TxV[owner_S]
    if mode == "wor":
      q_SxV = np.where(taken_SxV, 0.0, q_SxV)
      mass_S1 = q_SxV.sum(-1, keepdims=True)
      q_SxV = q_SxV / np.where(mass_S1 > 0, mass_S1, 1.0)
      skip_S = mass_S1[:, 0] <= 0  # no q mass left: the child is skipped
    else:
      skip_S = np.zeros(len(owner_S), bool)
    s_P, y_P = np.nonzero((q_SxV > 0) & (prob_S > 0)[:, None])
    draw_P = prob_S[s_P] * q_SxV[s_P, y_P]
    w_kid_P = _ratio(w_S[s_P] * r_SxV[s_P, y_P], q_SxV[s_P, y_P])
    elim_P, acc_kid = _traverse(topology, kid, y_P, w_kid_P, p_CxV, q_CxV,
                                mode, control)
    for length, a_PxM in acc_kid.items():
      # The kid's token y, then what its subtree emits.
      out = acc.setdefault(length + 1, np.zeros((num, vocab ** (length + 1))))
      out = out.reshape(num * vocab, vocab ** length)
      np.add.at(out, owner_S[s_P] * vocab + y_P, draw_P[:, None] * a_PxM)
    # The kid's subtree removed: the node's law and weight take the
    # block-verification residual (w r - q_j)+, judged with the law the kid
    # was drawn from (q, or q without the earlier kids for "wor").
    excess_SxV = np.maximum(w_S[:, None] * r_SxV - q_SxV, 0.0)
    mass_S = excess_SxV.sum(-1)
    new_r_SxV = np.where(mass_S[:, None] > 0, excess_SxV / np.where(
        mass_S > 0, mass_S, 1.0)[:, None], r_SxV)
    new_w_S = np.where(mass_S > 0, mass_S / np.where(
        mass_S > 0, mass_S + (1.0 - w_S), 1.0), 0.0)
    gone_P = draw_P * elim_P
    if mode == "wor":
      taken_P = taken_SxV[s_P].copy()
      taken_P[np.arange(len(y_P)), y_P] = True
      owner_S = np.concatenate([owner_S[s_P], owner_S[skip_S]])
      prob_S = np.concatenate([gone_P, prob_S[skip_S]])
      w_S = np.concatenate([new_w_S[s_P], w_S[skip_S]])
      r_SxV = np.concatenate([new_r_SxV[s_P], r_SxV[skip_S]])
      taken_SxV = np.concatenate([taken_P, taken_SxV[skip_S]])
      live = prob_S > 0
      owner_S, prob_S, w_S = owner_S[live], prob_S[live], w_S[live]
      r_SxV, taken_SxV = r_SxV[live], taken_SxV[live]
      # States alike in every number act alike from here: merge them.
      key = np.concatenate([owner_S[:, None], w_S[:, None], r_SxV,
                            taken_SxV], axis=1)
      key, inverse = np.unique(key, axis=0, return_inverse=True)
      inverse = inverse.reshape(-1)
      prob_S = np.bincount(inverse, weights=prob_S, minlength=len(key))
      owner_S = key[:, 0].astype(np.int64)
      w_S, r_SxV = key[:, 1], key[:, 2:2 + vocab]
      taken_SxV = key[:, 2 + vocab:] > 0.5
    else:
      # i.i.d. kids: the update does not depend on which token was
      # removed, so each state stays one state.
      prob_S = np.bincount(s_P, weights=gone_P, minlength=len(owner_S))
      w_S, r_SxV = new_w_S, new_r_SxV
  keep_S = np.ones(len(owner_S)) if node < 0 else w_S
  final_SxV = p_TxV[owner_S] if control else r_SxV
  out = acc.setdefault(1, np.zeros((num, vocab)))
  np.add.at(out, owner_S, (prob_S * keep_S)[:, None] * final_SxV)
  elim_T = np.bincount(owner_S, weights=prob_S * (1.0 - keep_S),
                       minlength=num)
  return elim_T, acc


def traversal_round_law(pair: markov.MarkovPair, topology, mode: str = "iid",
                        control: str | None = None):
  """Exact law of one Traversal Verification round, for every context.

  Args:
    pair: the lab's target and draft chains (`make_markov_pair`).
    topology: a `TreeTopology` or a branching tuple such as (2, 1).
    mode: "iid" (children i.i.d. from q) or "wor" (without replacement).
    control: None, or "no_final_residual" (the negative control).

  Returns:
    (blocks, expected_tokens_C) in the layout of
    `specjax.lab.trees.tree_round_law`: `blocks[j]` `[C] + [V] * (j + 1)`
    holds P(the round keeps a node at depth j with these tokens on its path
    and emits this final token | context), C = V + 1 (BOS last);
    expected_tokens_C = E[tokens emitted per round | context].
  """
  pair = exact._check_pair(pair)  # pylint: disable=protected-access
  topology = _as_topology(topology)
  mode = tree_lib.check_mode(mode)
  _check_control(control, "no_final_residual")
  vocab, num_ctx = pair.vocab_size, pair.vocab_size + 1
  if mode == "wor" and topology.max_children > vocab:
    raise ValueError(f"mode='wor' draws at most V={vocab} distinct children "
                     f"per node; this tree has {topology.max_children}.")
  if vocab ** (topology.max_depth + 1) > 2 ** 20:
    raise ValueError(f"a tree of depth {topology.max_depth} over V={vocab} "
                     "has too many paths to enumerate.")
  elim_C, acc = _traverse(topology, -1, np.arange(num_ctx), np.ones(num_ctx),
                          pair.target_rows_CxV, pair.draft_rows_CxV, mode,
                          control)
  assert np.all(elim_C == 0)  # the root is always kept
  depth = topology.max_depth
  blocks = [acc.get(j + 1, np.zeros((num_ctx, vocab ** (j + 1)))).reshape(
      (num_ctx,) + (vocab,) * (j + 1)) for j in range(depth + 1)]
  expected = sum((j + 1) * b.reshape(num_ctx, -1).sum(-1)
                 for j, b in enumerate(blocks))
  return blocks, expected


def traversal_process_law(pair: markov.MarkovPair, topology, seq_len: int,
                          mode: str = "iid", context: int | None = None,
                          control: str | None = None, blocks=None):
  """Exact law of the first `seq_len` tokens under Traversal Verification
  rounds (float64 `[V] * seq_len`); equals
  `specjax.lab.verifiers.target_law(pair, seq_len, context)` up to rounding
  unless a control."""
  if blocks is None:
    blocks, _ = traversal_round_law(pair, topology, mode, control)
  return exact.chain_blocks(blocks, pair.vocab_size, seq_len, context)


def expected_accepted(pair: markov.MarkovPair, topology,
                      verifier: str = "traversal", mode: str = "iid"
                      ) -> np.ndarray:
  """E[drafts kept per round | context], float64 `[C]` (BOS last).

  verifier: "traversal" (this module) or "token" (token-level tree
  verification, `specjax.lab.trees.tree_round_law`).
  """
  if verifier == "traversal":
    _, expected = traversal_round_law(pair, topology, mode)
  elif verifier == "token":
    _, expected = lab_trees.tree_round_law(pair, _as_topology(topology), mode)
  else:
    raise ValueError(f"verifier must be 'traversal' or 'token', got "
                     f"{verifier!r}.")
  return expected - 1.0


# ------------------------------------------------------- the lab grid --


def lab_settings(vocab: int = 8) -> list[Setting]:
  """The one-step lab grid: 12 random (p, q) pairs and 7 adversarial ones.

  Random (fixed seeds): p and q independent Dirichlet(1) and
  Dirichlet(0.3) draws (a weak draft), and q = l p + (1 - l) noise for
  l = 0.5, 0.8 (a draft that tracks the target), three seeds each.
  Adversarial: disjoint supports (alpha* = 0), q = p (alpha* = 1), near
  one-hot p and q with the same or another argmax, a uniform p against a
  one-hot q and the reverse, and a q with only two tokens of positive
  mass (a "wor" or "greedy" slot stays empty from k = 3 on).
  """
  vocab = _checks.check_int("vocab", vocab, low=4, high=_MAX_DUAL_VOCAB)
  settings = []
  for seed in range(3):
    rng = np.random.default_rng(seed)
    settings.append(Setting(f"dirichlet(1) #{seed}",
                            rng.dirichlet(np.ones(vocab)),
                            rng.dirichlet(np.ones(vocab)), "random"))
    settings.append(Setting(f"dirichlet(0.3) #{seed}",
                            rng.dirichlet(0.3 * np.ones(vocab)),
                            rng.dirichlet(0.3 * np.ones(vocab)), "random"))
    for match in (0.5, 0.8):
      p_V = rng.dirichlet(0.5 * np.ones(vocab))
      q_V = match * p_V + (1 - match) * rng.dirichlet(0.5 * np.ones(vocab))
      settings.append(Setting(f"mix {match} #{seed}", p_V, q_V / q_V.sum(),
                              "random"))
  half = vocab // 2
  low_V = np.r_[np.ones(half) / half, np.zeros(vocab - half)]
  settings.append(Setting("disjoint supports", low_V, low_V[::-1].copy(),
                          "adversarial"))
  same_V = np.random.default_rng(100).dirichlet(np.ones(vocab))
  settings.append(Setting("q = p", same_V, same_V.copy(), "adversarial"))

  def peaked(top, mass):
    law_V = np.full(vocab, (1 - mass) / (vocab - 1))
    law_V[top] = mass
    return law_V

  settings.append(Setting("near one-hot, same argmax", peaked(0, 0.97),
                          peaked(0, 0.9), "adversarial"))
  settings.append(Setting("near one-hot, other argmax", peaked(0, 0.97),
                          peaked(1, 0.97), "adversarial"))
  one_hot_V = np.eye(vocab)[0]
  uniform_V = np.ones(vocab) / vocab
  settings.append(Setting("p uniform, q one-hot", uniform_V, one_hot_V,
                          "adversarial"))
  settings.append(Setting("p one-hot, q uniform", one_hot_V, uniform_V,
                          "adversarial"))
  zeros_V = np.random.default_rng(101).dirichlet(np.ones(vocab))
  settings.append(Setting("q with exact zeros", zeros_V,
                          np.r_[np.zeros(vocab - 2), 0.7, 0.3],
                          "adversarial"))
  return settings


def one_step_table(settings=None, ks=(1, 2, 3, 4),
                   verifiers=tuple(VERIFIERS)) -> list[dict]:
  """Every verifier on every (setting, k): the study's and the tests' rows.

  Returns one dict per (setting, k) with keys "setting", "kind", "k",
  "optimum" and "dual" ({scheme: alpha*} from the LP and from the dual),
  and "verifiers": {name: {"scheme", "tv" (TV(law, p)), "acceptance",
  "fraction" (acceptance / alpha* of its scheme; None where alpha* = 0),
  "fraction_of_best" (acceptance / the largest alpha* over schemes),
  "control_tv" (TV of its negative control)}}.
  """
  settings = lab_settings() if settings is None else settings
  rows = []
  for setting in settings:
    for k in ks:
      optimum = {s: optimal_acceptance(setting.p_V, setting.q_V, k, s)
                 for s in SCHEMES}
      dual = {s: dual_acceptance(setting.p_V, setting.q_V, k, s)
              for s in SCHEMES}
      best = max(optimum.values())
      results = {}
      for name in verifiers:
        scheme, control = VERIFIERS[name]
        law_V, accept = one_step_law(name, setting.p_V, setting.q_V, k)
        control_V, _ = one_step_law(name, setting.p_V, setting.q_V, k,
                                    control)
        results[name] = dict(
            scheme=scheme, tv=exact.tv(law_V, setting.p_V),
            acceptance=accept,
            fraction=accept / optimum[scheme] if optimum[scheme] > 0
            else None,
            fraction_of_best=accept / best if best > 0 else None,
            control_tv=exact.tv(control_V, setting.p_V))
      rows.append(dict(setting=setting.name, kind=setting.kind, k=k,
                       optimum=optimum, dual=dual, verifiers=results))
  return rows


def median_fractions(rows: list[dict]) -> dict:
  """{k: {verifier: median over settings of its fraction of the optimum}}
  (settings whose optimum is 0 left out)."""
  out = {}
  for row in rows:
    for name, result in row["verifiers"].items():
      if result["fraction"] is not None:
        out.setdefault(row["k"], {}).setdefault(name, []).append(
            result["fraction"])
  return {k: {name: float(np.median(v)) for name, v in by.items()}
          for k, by in out.items()}


# Markov pairs (certainty, draft_match, seed) and trees of the tree grid.
TREE_PAIRS = ((1.5, 0.8, 0), (0.0, 0.3, 1), (1000.0, 0.5, 2), (3.0, 0.0, 3),
              (2.0, 1.0, 4), (8.0, 0.8, 5))
TREE_TOPOLOGIES = ((2, 1), (2, 2), (3, 1), (3, 1, 1), (1, 2), (2, 1, 1))
CHAINS = ((1, 1), (1, 1, 1))


def tree_table(pairs=TREE_PAIRS, topologies=TREE_TOPOLOGIES + CHAINS,
               seq_len: int = 3, vocab: int = markov.VOCAB_SIZE
               ) -> list[dict]:
  """Traversal against token-level tree verification on the Markov lab.

  One dict per (pair, tree, mode): the knobs, "tree", "mode", and for
  "traversal" and "token" the expected drafts kept per round (from BOS and
  averaged over the V + 1 contexts, "accepted_bos" / "accepted_mean"),
  their worst-context difference "traversal_minus_token_min", the exact TV
  of each process's `seq_len`-token law to the target's ("tv_traversal",
  "tv_token"), that of traversal's negative control ("tv_control"), and,
  on a chain, the largest difference of traversal's round law from block
  verification's ("block_max_diff").
  """
  rows = []
  for certainty, match, seed in pairs:
    pair = markov.make_markov_pair(certainty, match, seed, vocab)
    target = lab_verifiers.target_law(pair, seq_len)
    for branching in topologies:
      topology = _as_topology(branching)
      for mode in tree_lib.MODES:
        blocks, tokens_C = traversal_round_law(pair, topology, mode)
        token_blocks, token_C = lab_trees.tree_round_law(pair, topology, mode)
        row = dict(certainty=certainty, draft_match=match, seed=seed,
                   tree=",".join(map(str, branching)), mode=mode,
                   accepted_bos=dict(traversal=float(tokens_C[-1] - 1),
                                     token=float(token_C[-1] - 1)),
                   accepted_mean=dict(traversal=float(tokens_C.mean() - 1),
                                      token=float(token_C.mean() - 1)),
                   traversal_minus_token_min=float((tokens_C - token_C).min()),
                   tv_traversal=exact.tv(traversal_process_law(
                       pair, topology, seq_len, blocks=blocks), target),
                   tv_token=exact.tv(lab_trees.tree_process_law(
                       pair, topology, seq_len, mode, blocks=token_blocks),
                                     target),
                   tv_control=exact.tv(traversal_process_law(
                       pair, topology, seq_len, mode,
                       control="no_final_residual"), target))
        if all(b == 1 for b in branching):
          block_blocks, _ = lab_verifiers.round_law(pair, len(branching),
                                                    "block")
          row["block_max_diff"] = float(max(
              np.abs(a - b).max() for a, b in zip(blocks, block_blocks)))
        rows.append(row)
  return rows


# The verifiers of i.i.d. or without-replacement drafts whose acceptance is
# not the optimum by construction: "greedy" and "canonical_lp" reach theirs
# (the tests check it; "canonical_lp" solves a program over every drafted
# set, out of reach at a real vocabulary), and the depth-1 traversals are
# specinfer and rsd again.
PRACTICAL = ("specinfer", "rsd", "kseq", "canonical")


def study_summary(rows: list[dict], tree_rows: list[dict],
                  threshold: float = 0.95) -> dict:
  """The study's headline numbers from `one_step_table` and `tree_table`.

  Returns a dict: "median" and "median_random" ({k: {verifier: median
  fraction of its scheme's optimum}} over every setting with alpha* > 0 /
  over the random ones), "best_practical" ({k: (verifier, median)} among
  `PRACTICAL` on the random settings, k >= 2) and "reaches_threshold"
  (whether that best median is >= `threshold` at every k >= 2),
  "kseq_worst_fraction" (its smallest acceptance / alpha*(iid)),
  "scheme_gain" ({k: median alpha*(wor) / alpha*(iid) and alpha*(greedy) /
  alpha*(iid)} on the random settings), "worst_tv" (the largest TV to p of
  any exact verifier, one step and trees), "traversal_gain" ({tree: {mode:
  {"mean": E[kept] traversal - token, "mean_rel": traversal / token - 1,
  both averaged over the pairs, "max_rel": the largest}}}; E[kept]
  averaged over the contexts), "traversal_minus_token_min" (worst
  context) and "chain_block_max_diff".
  """
  random_rows = [r for r in rows if r["kind"] == "random"]
  median_random = median_fractions(random_rows)
  best = {}
  for k, by in median_random.items():
    if k >= 2:
      name = max(PRACTICAL, key=lambda n: by[n])
      best[k] = (name, by[name])
  kseq = [r["verifiers"]["kseq"]["acceptance"] / r["optimum"]["iid"]
          for r in rows if r["optimum"]["iid"] > 0]
  gains = {}
  for row in random_rows:
    if row["optimum"]["iid"] > 0:
      for scheme in ("wor", "greedy"):
        gains.setdefault(row["k"], {}).setdefault(scheme, []).append(
            row["optimum"][scheme] / row["optimum"]["iid"])
  tree_gain = {}
  for row in tree_rows:
    token, traversal = (row["accepted_mean"]["token"],
                        row["accepted_mean"]["traversal"])
    tree_gain.setdefault(row["tree"], {}).setdefault(row["mode"], []).append(
        (traversal - token, traversal / token - 1.0 if token > 0 else 0.0))
  chains = [r["block_max_diff"] for r in tree_rows if "block_max_diff" in r]
  return dict(
      median=median_fractions(rows), median_random=median_random,
      best_practical=best,
      reaches_threshold=bool(best) and all(v >= threshold
                                           for _, v in best.values()),
      threshold=threshold, kseq_worst_fraction=float(min(kseq)),
      scheme_gain={k: {s: float(np.median(v)) for s, v in by.items()}
                   for k, by in gains.items()},
      worst_tv=float(max([v["tv"] for r in rows
                          for v in r["verifiers"].values()]
                         + [r["tv_traversal"] for r in tree_rows]
                         + [r["tv_token"] for r in tree_rows])),
      traversal_gain={t: {m: dict(mean=float(np.mean([g for g, _ in v])),
                                  mean_rel=float(np.mean([r for _, r in v])),
                                  max_rel=float(max(r for _, r in v)))
                          for m, v in by.items()}
                      for t, by in tree_gain.items()},
      traversal_minus_token_min=float(min(
          r["traversal_minus_token_min"] for r in tree_rows)),
      chain_block_max_diff=float(max(chains)) if chains else None)
