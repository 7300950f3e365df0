"""SpecTr's K-SEQ on a static draft tree, in JAX (Sun et al., NeurIPS 2023).

SpecTr ("SpecTr: Fast Speculative Decoding via Optimal Transport", arXiv
2310.15141) verifies k drafts x_1..x_k drawn i.i.d. from q with K-SEQ:

  rho in [1, k] is the least root of 1 - (1 - beta)^k = rho beta, beta =
  sum_x min(q(x), p(x) / rho); child j is kept with probability
  min(1, p(x_j) / (rho q(x_j))), in order, the first kept one wins; if all k
  are rejected, one token is drawn from the residual

    p_res ∝ (p - m)+,   m = min(q, p / rho) (1 - (1 - beta)^k) / beta,

  m being the law-mass the k drafts emit (`specjax.lab.multidraft.kseq_law`,
  whose enumeration proves the emitted token has law p, and whose
  acceptance is at least 1 - (1 - beta)^k >= (1 - 1/e) of the optimum).

On a tree the rule runs node by node, walking down from the root as
`tree.tree_verify` does: at the node reached, K-SEQ over its children with
p and q at that node (k = its number of children); descend into the kept
child; stop at a leaf (k = 0: m = 0, the bonus token from p) or when every
child is rejected (a token from the node's residual).

Why the walk is exact. Condition on reaching node u along some path. The
children of u were drafted i.i.d. from q_u given that path, and the walk's
decision at u uses only their tokens and u's own uniforms; so K-SEQ at u
emits Y ~ p_u exactly (its one-step guarantee). If Y is the token of a kept
child c, the walk continues at c, whose subtree was drafted from the draft
given the path and x_c alone, independent of c's siblings and of u's
uniforms: given the emitted prefix it is again a fresh i.i.d. tree, and the
same argument applies at c. By induction every emitted token, given the
ones before it, has the target's law: the round is exact (tested against
the lab's `kseq_law` at one node and on the lab's Markov chains in the
real loop, tests/test_kseq.py).

Solving rho. f(rho) = 1 - (1 - beta(rho))^k - rho beta(rho) falls with rho
(beta falls, rho beta rises), f(1) >= 0 >= f(k); `RHO_STEPS` bisection
steps on [1, k] per (row, node), vectorised, float32, keep the upper end
(the exact side: m <= p, as the lab's `kseq_rho`). After 30 halvings the
bracket (k - 1) 2^-30 is below float32's spacing on [1, k] for any k below
2^7, so rho is the float32 root to about one ulp (relative 1.2e-7) plus
the rounding of f itself (a sum over V in float32), which matters where f
is flat at its root: on the lab's grid the relative error is at most
1.9e-6 against the float64 root (tested to 1e-5); where f(1) <= 0, rho is
1 exactly.

Cost: per level of the walk, O(RHO_STEPS V) per row for rho (a sum over V
per step) and O(K + V) for the decisions and the residual, where
token-level verification does O(K V) (one residual per rejected child).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode import tree as tree_lib

# Bisection steps for rho on [1, k]: (k - 1) 2^-30 is below float32's
# spacing there, so more steps change nothing.
RHO_STEPS = 30


def kseq_rho(p_BxV, q_BxV, k_B, steps: int = RHO_STEPS):
  """SpecTr's rho per row: float32 `[B]`, the upper end of a bisection.

  Args:
    p_BxV, q_BxV: float32 `[B, V]` laws.
    k_B: `[B]` number of i.i.d. drafts (0 allowed: rho = 1, unused).
    steps: static number of bisection steps.

  Returns:
    rho_B in [1, max(k, 1)] with f(rho) <= 0 up to float32 rounding (the
    exact side, as `specjax.lab.multidraft.kseq_rho`); 1 where f(1) <= 0.
  """
  k_B = jnp.asarray(k_B, jnp.float32)

  def excess(rho_B):
    beta_B = jnp.sum(jnp.minimum(q_BxV, p_BxV / rho_B[:, None]), axis=-1)
    return 1.0 - jnp.power(1.0 - beta_B, k_B) - rho_B * beta_B

  ones_B = jnp.ones(k_B.shape, jnp.float32)
  at_one_B = excess(ones_B) <= 0

  def halve(_, bracket):
    low_B, high_B = bracket
    mid_B = 0.5 * (low_B + high_B)
    above_B = excess(mid_B) > 0
    return jnp.where(above_B, mid_B, low_B), jnp.where(above_B, high_B, mid_B)

  # A loop, not unrolled: the walk calls this once per level.
  _, high_B = jax.lax.fori_loop(0, steps, halve,
                                (ones_B, jnp.maximum(k_B, 1.0)))
  return jnp.where(at_one_B, 1.0, high_B)


def kseq_tree_verify(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                     topology: tree_lib.TreeTopology, sample, *,
                     control=None):
  """K-SEQ node by node down a static tree of i.i.d. children, per row.

  Args:
    u_BxNx2: float32 uniforms `[B, N + 1, 2]`, `tree.tree_verify`'s layout:
      [:, i, 0] judges node i, [:, u + 1, 1] draws the token emitted when
      node u (or the root, u = -1 -> index 0) keeps none of its children.
    p_BxN1xV, q_BxN1xV: float32 `[B, N + 1, V]`: target / draft laws after
      the root (index 0) and after each node i (index i + 1).
    tokens_BxN: int32 `[B, N]` node tokens, children drawn i.i.d. from q at
      their parent; valid_BxN: bool `[B, N]` (an invalid child is left out
      of its parent's k).
    topology: static `TreeTopology`.
    sample: the loop's sampler, `sample(u_x, probs_xV) -> int32`.
    control: static; None for the exact rule. True is a NEGATIVE CONTROL
      only (the lab's "wrong_residual": the residual subtracts one draft's
      accepted mass min(q, p / rho), not (1 - (1 - beta)^k) / beta times
      it): not exact wherever k >= 2 and all children can be rejected.

  Returns:
    As `tree.tree_verify`: (path_BxD int32 `[B, D]`: kept node per depth,
    -1 past the end; emitted_BxD1 int32 `[B, D + 1]`: the kept tokens, then
    the final token at num_accepted (and at D); num_accepted_B int32
    `[B]`).
  """
  tree_lib.check_control(control)

  def judge(view):
    p_BxV, q_BxV = view.p_BxV, view.q_BxV
    k_B = jnp.sum(view.valid_BxK, axis=1)
    rho_B = kseq_rho(p_BxV, q_BxV, k_B)
    p_x_BxK = jnp.take_along_axis(p_BxV, view.tokens_BxK, axis=1)
    q_x_BxK = jnp.take_along_axis(q_BxV, view.tokens_BxK, axis=1)
    # u < min(1, p / (rho q)) without dividing; p(x) = 0 never keeps x.
    # Rejections change nothing, so every child is judged at once and the
    # first kept one wins.
    keep_BxK = view.valid_BxK & (
        view.u_BxK * rho_B[:, None] * q_x_BxK < p_x_BxK)
    # The residual: p minus the mass the k children emit (0 at a leaf).
    single_BxV = jnp.minimum(q_BxV, p_BxV / rho_B[:, None])
    beta_B = jnp.sum(single_BxV, axis=-1)
    factor_B = jnp.where(
        beta_B > 0, (1.0 - jnp.power(1.0 - beta_B, k_B.astype(jnp.float32)))
        / jnp.where(beta_B > 0, beta_B, 1.0), 0.0)
    if control:
      factor_B = jnp.where(k_B > 0, 1.0, 0.0)
    r_BxV = tree_lib.residual(
        jnp.maximum(p_BxV - single_BxV * factor_B[:, None], 0.0), p_BxV)
    return tree_lib.first_child(view.kids_BxK, keep_BxK), r_BxV, None

  # The walk's step and layout are `tree_verify`'s.
  return tree_lib.walk(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                       topology, sample, judge)
