"""Exact (float64) law of tree speculation on the lab's Markov pairs.

For a static `TreeTopology` and a drafting mode ("iid": SpecInfer's children
i.i.d. from q; "wor": RSD's children without replacement), `tree_round_law`
enumerates one round literally, node by node: every sequence of child draws
at a node (with its probability under the mode), every accept / reject
outcome of recursive rejection sampling, the residual updates, and the token
emitted when all children are rejected; accepting a child recurses into its
subtree with the child's token as context (the pair is first-order Markov).
Nothing assumes exactness: `tree_tv` is computed and must be ~1e-16.
"""

from __future__ import annotations

import numpy as np

from specjax.decode import tree as tree_lib
from specjax.lab import exact
from specjax.lab import markov
from specjax.lab import verifiers as lab_verifiers


def _normalise_or(excess, fallback):
  mass = excess.sum(-1, keepdims=True)
  return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), fallback)


def _node_law(topology, node, ctx, p_CxV, q_CxV, mode, memo):
  """{length: float64 [V] * length}: law of what the subtree emits."""
  key = (node, ctx)
  if key in memo:
    return memo[key]
  vocab = p_CxV.shape[1]
  kids = topology.children(node)
  p_V, q_V = p_CxV[ctx], q_CxV[ctx]
  out = {}

  def add(length, mass):
    out[length] = out.get(length, 0.0) + mass

  # Histories of rejected draws: prob [H], residual r [H, V], taken [H, V].
  prob_H = np.ones(1)
  r_HxV = p_V[None].copy()
  taken_HxV = np.zeros((1, vocab), bool)
  for kid in kids:
    if mode == "wor":
      q_HxV = np.where(taken_HxV, 0.0, q_V[None])
      mass_H1 = q_HxV.sum(-1, keepdims=True)
      empty_H = mass_H1[:, 0] <= 0
      q_HxV = q_HxV / np.where(mass_H1 > 0, mass_H1, 1.0)
    else:
      q_HxV = np.broadcast_to(q_V[None], r_HxV.shape)
      empty_H = np.zeros(prob_H.shape, bool)
    # Accept x with probability min(1, r(x) / q_j(x)); q_j(x) = 0 draws never
    # happen (their mass is 0), and r = q = 0 is refused.
    over = r_HxV >= q_HxV
    accept_HxV = np.where(over, (r_HxV > 0).astype(np.float64),
                          r_HxV / np.where(over, 1.0, q_HxV))
    kept_V = (prob_H[:, None] * q_HxV * accept_HxV).sum(0)
    subs = [_node_law(topology, kid, x, p_CxV, q_CxV, mode, memo)
            for x in range(vocab)]
    for length in sorted(set().union(*subs)):
      laws = [sub.get(length, 0.0) * np.ones((vocab,) * length)
              for sub in subs]
      # P(keep child with token x) * P(its subtree emits the rest | x).
      add(length + 1, kept_V.reshape((vocab,) + (1,) * length)
          * np.stack(laws))
    # Rejected draws: one new history per (history, x).
    rej_HxV = prob_H[:, None] * q_HxV * (1.0 - accept_HxV)
    new_r = _normalise_or(np.maximum(r_HxV[:, None, :] - q_HxV[:, None, :],
                                     0.0), r_HxV[:, None, :])
    new_r = np.broadcast_to(new_r, r_HxV.shape[:1] + (vocab, vocab))
    new_taken = taken_HxV[:, None, :] | np.eye(vocab, dtype=bool)[None]
    # A history with no q mass left skips this child (r unchanged).
    prob_H = np.concatenate([rej_HxV.reshape(-1), prob_H[empty_H]])
    r_HxV = np.concatenate([new_r.reshape(-1, vocab), r_HxV[empty_H]])
    taken_HxV = np.concatenate([new_taken.reshape(-1, vocab),
                                taken_HxV[empty_H]])
    live = prob_H > 0
    prob_H, r_HxV, taken_HxV = prob_H[live], r_HxV[live], taken_HxV[live]
    # Histories in the same state (r, taken) behave identically from here:
    # sum their mass (exact; for iid every history shares one r).
    states, inverse = np.unique(np.concatenate([r_HxV, taken_HxV], 1),
                                axis=0, return_inverse=True)
    prob_H = np.bincount(inverse.reshape(-1), weights=prob_H,
                         minlength=len(states))
    r_HxV, taken_HxV = states[:, :vocab], states[:, vocab:] > 0.5
  add(1, (prob_H[:, None] * r_HxV).sum(0))
  memo[key] = out
  return out


def tree_round_law(pair: markov.MarkovPair, topology, mode: str = "iid"):
  """Exact law of one tree round, for every context.

  Returns:
    (blocks, expected_tokens_C): `blocks[k]` `[C] + [V] * (k + 1)` holds
    P(the round emits these k + 1 tokens | context) for k = 0..max_depth;
    `expected_tokens_C` is E[tokens emitted per round | context].
  """
  if not isinstance(topology, tree_lib.TreeTopology):
    topology = tree_lib.TreeTopology.from_branching(topology)
  mode = tree_lib.check_mode(mode)
  vocab, num_ctx = pair.vocab_size, pair.vocab_size + 1
  if mode == "wor" and topology.max_children > vocab:
    raise ValueError(f"mode='wor' draws at most V={vocab} distinct children "
                     f"per node; this tree has {topology.max_children}.")
  p_CxV, q_CxV = pair.target_rows_CxV, pair.draft_rows_CxV
  depth = topology.max_depth
  blocks = [np.zeros((num_ctx,) + (vocab,) * (k + 1)) for k in range(depth + 1)]
  memo = {}
  for c in range(num_ctx):
    for length, law in _node_law(topology, -1, c, p_CxV, q_CxV, mode,
                                 memo).items():
      blocks[length - 1][c] = law
  expected = sum((k + 1) * b.reshape(num_ctx, -1).sum(-1)
                 for k, b in enumerate(blocks))
  return blocks, expected


def tree_process_law(pair, topology, seq_len, mode="iid", context=None,
                     blocks=None):
  """Exact law of the first `seq_len` tokens under tree speculation."""
  if blocks is None:
    blocks, _ = tree_round_law(pair, topology, mode)
  return exact.chain_blocks(blocks, pair.vocab_size, seq_len, context)


def tree_tv(pair, topology, seq_len, mode="iid", context=None) -> float:
  """Exact TV of the tree process's N-token law to the target's."""
  return exact.tv(tree_process_law(pair, topology, seq_len, mode, context),
                  lab_verifiers.target_law(pair, seq_len, context))


def small_topologies(max_nodes: int = 7):
  """Every branching-per-depth tree with <= max_nodes nodes, plus a few
  irregular parent arrays: the lab's tree grid."""
  found = []

  def grow(branching, nodes, width):
    # width: nodes at the deepest level; adding branching b adds width * b.
    if branching:
      found.append(tree_lib.TreeTopology.from_branching(branching))
    for b in range(1, max_nodes + 1):
      if nodes + width * b > max_nodes:
        break
      grow(branching + (b,), nodes + width * b, width * b)

  grow((), 0, 1)
  irregular = [(-1, -1, 0, 0, 1), (-1, 0, 0, 1, -1), (-1, -1, -1, 0, 3, 4),
               (-1, 0, 1, 2, -1, 4, -1)]
  found += [tree_lib.TreeTopology(p) for p in irregular
            if len(p) <= max_nodes]
  return found
