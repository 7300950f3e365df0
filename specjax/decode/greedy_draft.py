"""Hu et al.'s greedy multi-draft scheme on a static draft tree, in JAX.

Hu et al. ("Towards Optimal Multi-draft Speculative Decoding", ICLR 2025)
draft k tokens at a node greedily: the k - 1 most likely tokens under the
draft's q (the set T; ties: the lower id) outright, and one token x drawn
from q' = q without T, renormalised (`tree.greedy_children`; no x where q
has no mass outside T). Verification is single-draft speculative sampling
of x against the target's p with x's own law q':

  keep x with probability min(1, p(x) / q'(x)); else draw y from
  (p - q')+ normalised.

Because q' = 0 on T, the residual keeps all of p(T): a residual draw that
lands in T IS a drafted child, and the walk descends into it. The node
emits the target's token with probability

  p(T) + sum_{y not in T} min(p(y), q'(y)),

the scheme's optimum (the transport LP over its drafted sets,
`specjax.lab.multidraft.optimal_acceptance(p, q, k, "greedy")`): every
exact verifier of these drafts emits a drafted token at most this often.

On a tree the rule runs node by node, walking down from the root as
`tree.tree_verify` does: at the node reached, the rule with p and q at that
node (T: the tokens of its first k - 1 children, x: its last child); a kept
x or a residual token in T descends into that child; a leaf (k = 0) emits
from p; k = 1 (no T) is token-level verification.

Why the walk is exact. Condition on reaching node u along some path. Its
children are T (a function of q_u) and x ~ q'_u given that path; the
decision at u uses x and u's own uniforms, and is single-draft speculative
sampling of x ~ q'_u against p_u, so the token Y it emits has law p_u. If
Y is a child c's token the walk continues at c, whose subtree was drafted
from the draft given the path and Y alone, with draws of its own,
independent of x and of u's uniforms: given the emitted prefix it is again
a fresh greedy tree, and the same argument applies at c. By induction
every emitted token, given the ones before it, has the target's law
(tests/test_greedy_draft.py: the one-node law against the lab's
`greedy_law`, the compiled loop on the lab's Markov chains).

Degenerate nodes. Where q has no mass outside T the last child is invalid
(`valid` False): it is never kept, and q' is taken as 0, so the residual is
p itself and every drafted token is reached through it (the acceptance is
p(T), the optimum there). A child of T with q = 0 stays drafted: p's mass
on it still counts. An invalid child of T is never descended into; a
residual token equal to it is emitted as the final token (Y still has law
p).

Cost: per level of the walk, O(K + V) per row (q' and the residual, one
draw), the same order as one rejection of token-level verification; the
drafting adds one top-(k - 1) over V at each node, and the target's pass
is the same as for any tree of that topology.
"""

from __future__ import annotations

import jax.numpy as jnp

from specjax.decode import tree as tree_lib


def greedy_draft_verify(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                        topology: tree_lib.TreeTopology, sample, *,
                        control=None):
  """Hu et al.'s greedy-draft verification node by node down a static tree.

  Args:
    u_BxNx2: float32 uniforms `[B, N + 1, 2]`, `tree.tree_verify`'s layout:
      [:, i, 0] judges node i (here: a node's last child), [:, u + 1, 1]
      draws the residual token at node u (or the root, u = -1 -> index 0).
    p_BxN1xV, q_BxN1xV: float32 `[B, N + 1, V]`: target / draft laws after
      the root (index 0) and after each node i (index i + 1).
    tokens_BxN: int32 `[B, N]` node tokens, drafted by
      `tree.greedy_children`: a node's first k - 1 children are T, its last
      one the draw from q without T; valid_BxN: bool `[B, N]`.
    topology: static `TreeTopology`.
    sample: the loop's sampler, `sample(u_x, probs_xV) -> int32`.
    control: static; None for the exact rule. True is a NEGATIVE CONTROL
      only (the lab's "residual_outside_drafts": the residual is drawn only
      outside T, so p(T) leaks onto other tokens): not exact wherever
      k >= 2, the last child can be rejected and p(T) > 0.

  Returns:
    As `tree.tree_verify`: (path_BxD int32 `[B, D]`: kept node per depth,
    -1 past the end; emitted_BxD1 int32 `[B, D + 1]`: the kept tokens, then
    the final token at num_accepted (and at D); num_accepted_B int32
    `[B]`).
  """
  tree_lib.check_control(control)

  def judge(view):
    p_BxV, q_BxV, kids_BxK = view.p_BxV, view.q_BxV, view.kids_BxK
    rows_B = jnp.arange(kids_BxK.shape[0])
    count_B = jnp.sum(kids_BxK >= 0, axis=1)  # children fill the first slots
    x_BxK = view.tokens_BxK
    in_t_BxK = jnp.arange(kids_BxK.shape[1]) < count_B[:, None] - 1
    # q' = q without T: T's tokens whatever their validity, as the draft
    # drew the last child without them.
    in_t_BxV = jnp.zeros(q_BxV.shape, jnp.float32).at[
        rows_B[:, None], x_BxK].add(in_t_BxK.astype(jnp.float32)) > 0
    q_last_BxV = tree_lib.residual(jnp.where(in_t_BxV, 0.0, q_BxV),
                                   jnp.zeros_like(q_BxV))
    last_B = jnp.maximum(count_B - 1, 0)
    last_kid_B = jnp.where(count_B > 0, kids_BxK[rows_B, last_B], -1)
    x_B = x_BxK[rows_B, last_B]
    q_x_B = q_last_BxV[rows_B, x_B]
    # The last child exists only where it was drafted: a leaf has none, an
    # empty slot (no mass outside T) is invalid, and a token of q' = 0 was
    # never drawn from q'.
    has_B = (count_B > 0) & view.valid_BxK[rows_B, last_B] & (q_x_B > 0)
    # u < min(1, p / q') without dividing.
    keep_B = has_B & (view.u_BxK[rows_B, last_B] * q_x_B < p_BxV[rows_B, x_B])
    # The residual: p minus what the last child emits (nothing where it
    # was not drafted: then p itself).
    judged_BxV = jnp.where(has_B[:, None], q_last_BxV, 0.0)
    excess_BxV = jnp.maximum(p_BxV - judged_BxV, 0.0)
    if control:
      excess_BxV = jnp.where(in_t_BxV, 0.0, excess_BxV)
    r_BxV = tree_lib.residual(excess_BxV, p_BxV)
    y_B = sample(view.u_final_B, r_BxV).astype(jnp.int32)
    # A residual token in T is that child's: descend into it (T's tokens
    # are distinct, and the last child's is outside T). The last child's
    # own token is matched too: the exact residual never emits it after
    # rejecting it ((p - q')+ is 0 there), but the control's fallback to p
    # can, and emitting a child's token is reaching that child.
    hit_B = tree_lib.first_child(kids_BxK,
                                 view.valid_BxK & (x_BxK == y_B[:, None]))
    # y is the final token of a row that descends nowhere.
    return jnp.where(keep_B, last_kid_B, hit_B), r_BxV, y_B

  # The walk's step and layout are `tree_verify`'s.
  return tree_lib.walk(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                       topology, sample, judge)
