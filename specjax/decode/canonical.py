"""Khisti et al.'s canonical importance-sampling verifier on a static tree
of i.i.d. children, at most 2 per node, in JAX.

Khisti et al. ("Multi-draft speculative sampling: canonical architectures
and theoretical limits", ICLR 2025) verify k i.i.d. drafts x_1..x_k ~ q in
two steps:

  1. select one draft Z by importance weights w(x) = p(x) / q(x): slot j
     with probability w(x_j) / sum_i w(x_i) (uniformly when every weight is
     0);
  2. single-draft speculative sampling of Z against p with Z's own law
     q_Z: keep Z with probability min(1, p(Z) / q_Z(Z)), else draw from
     (p - q_Z)+ normalised.

Step 2 is exact for any selection rule, because Z ~ q_Z. The lab's law is
`specjax.lab.multidraft.canonical_law(p, q, k, "ratio")`.

q_Z for two drafts. q_Z has no closed form for general k (it sums over
the V^(k - 1) tuples of the other drafts), but for k = 2 i.i.d. drafts

  q_Z(y) = 2 q(y) sum_x q(x) r(y, x),   r(y, x) = w(y) / (w(y) + w(x)),

with r = 1/2 where w(y) + w(x) = 0 (so x = y contributes q(y)^2: Z = y
surely). That is O(V^2) per row and node (`selected_law`), computed in
chunks of y so that memory stays `[B, chunk, V]`. A node of one child is
plain token-level speculative sampling (q_Z = q); a node of more than 2
children is refused (`check_topology`), and so is a vocabulary above
`MAX_VOCAB` (`check_vocab`).

r is computed as sigmoid(log w(y) - log w(x)), made exactly antisymmetric
(r(y, x) + r(x, y) = 1 in float32): the same function selects Z in the walk
and sums into q_Z, so the judged law is the law the selection actually
follows, to float32 summation, whatever the weights' range (p / q itself
overflows float32 where q is tiny; the sigmoid of a log-ratio does not).

On a tree the rule runs node by node, walking down from the root as
`tree.tree_verify` does: at the node reached, the rule with p and q at that
node. The emitted token Y may equal ANY drafted child (Z kept, or the
other child hit by the residual draw): the walk descends into the first
valid child whose token is Y, else the round ends with Y.

Why the walk is exact. Condition on reaching node u along some path. Its
children are i.i.d. from q_u given that path; the decision at u uses their
tokens and u's own uniforms, and is single-draft speculative sampling of
Z ~ q_Z against p_u, so the token Y it emits has law p_u. If Y is a
child c's token the walk continues at c, whose subtree was drafted from
the draft given the path and Y alone, with draws of its own, independent of
the selection and u's uniforms: given the emitted prefix it is again a
fresh i.i.d. tree, and the same argument applies at c (SpecInfer's
argument). By induction every emitted token, given the ones before it, has
the target's law (tests/test_canonical.py: the one-node law against the
lab's `canonical_law`, the compiled loop on the lab's Markov chains).

Uniforms (`tree.tree_verify`'s `[B, N + 1, 2]` layout): at a node of two
valid children, the first child's [:, c1, 0] selects and the second's
[:, c2, 0] judges Z; at a node of one valid child, its own judges it;
[:, u + 1, 1] draws the residual token at node u.

Cost: per level of the walk whose depth has a node of 2 children, O(V^2)
per row for q_Z (one sigmoid per (y, x) pair); other levels O(V), as
token-level verification. The target's pass is the same as for any tree of
that topology.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode import tree as tree_lib

# Children per node this rule judges: q_Z of k importance-weighted i.i.d.
# drafts sums over the V^(k - 1) tuples of the other drafts.
MAX_CHILDREN = 2
# The largest vocabulary: q_Z costs V^2 sigmoids per row and node with two
# children, 6.7e7 at V = 8192, already about the FLOPs of a 30M-parameter
# target scoring one token; at GPT-2's 50,257 it would be 2.5e9 per row and
# node, more than a 1B target's forward pass per token: verification would
# cost more than the target calls it saves.
MAX_VOCAB = 8192
# Elements of one chunk of q_Z's pairwise work, `[B, chunk, V]` float32:
# 64 MiB whatever the batch and vocabulary (one y per chunk at the least).
_CHUNK_ELEMENTS = 2 ** 24


def check_topology(topology: tree_lib.TreeTopology) -> None:
  """Raises unless every node of `topology` has at most 2 children."""
  if not isinstance(topology, tree_lib.TreeTopology):
    raise TypeError("topology must be a TreeTopology (e.g. "
                    "TreeTopology.from_branching((2, 1, 1))), got "
                    f"{type(topology).__name__}.")
  if topology.max_children > MAX_CHILDREN:
    wide = [u for u in range(-1, topology.num_nodes)
            if len(topology.children(u)) > MAX_CHILDREN]
    where = "the root" if wide[0] < 0 else f"node {wide[0]}"
    raise ValueError(
        f"the canonical verifier judges at most {MAX_CHILDREN} children per "
        f"node; {where} has {len(topology.children(wide[0]))}. q_Z of "
        f"k > 2 importance-weighted drafts sums over V^(k-1) tuples. Use a "
        f"tree of 1 or 2 children per node (e.g. 'canonical:2,2,1'), or "
        f"'spectr:...' / 'tree:...' for wider i.i.d. trees.")


def check_vocab(vocab: int) -> None:
  """Raises where the O(V^2) work of q_Z is too large (`MAX_VOCAB`)."""
  if vocab > MAX_VOCAB:
    raise ValueError(
        f"the canonical verifier computes q_Z, the selected draft's law, in "
        f"O(V^2) per row and node with two children; V = {vocab:,} is above "
        f"{MAX_VOCAB:,}, where that work outgrows the target calls it "
        f"saves. Use 'spectr:...' or 'tree:...' (the same i.i.d. tree, "
        f"O(V) per node) or 'greedy-draft:...'.")


def log_weight(p_xV, q_xV):
  """log w = log p - log q, float32 `[..., V]`; -inf where p = 0 or q = 0
  (the lab's w = 0 where q = 0: such a token is never drafted)."""
  pos_xV = (p_xV > 0) & (q_xV > 0)
  return jnp.where(pos_xV, jnp.log(jnp.where(pos_xV, p_xV, 1.0))
                   - jnp.log(jnp.where(pos_xV, q_xV, 1.0)), -jnp.inf)


def pair_selection(lw_a, lw_b):
  """r(a, b) = w(a) / (w(a) + w(b)) from log weights (broadcast): the
  probability that a draft of weight w(a) is selected over one of w(b).

  sigmoid(|d|) of the log-ratio d, taken as s or 1 - s by d's sign, so that
  r(a, b) + r(b, a) = 1 exactly in float32 (1 - s is exact for s in
  [1/2, 1]): the selection and q_Z use one function. 1/2 where both
  weights are 0."""
  d = lw_a - lw_b
  s = jax.nn.sigmoid(jnp.abs(d))
  r = jnp.where(d >= 0, s, 1.0 - s)
  return jnp.where(jnp.isneginf(lw_a) & jnp.isneginf(lw_b), 0.5, r)


def selected_law(p_xV, q_xV, chunk: int | None = None):
  """q_Z, the law of the draft selected from two i.i.d. drafts of q by
  importance weights p / q: float32 `[..., V]`.

  q_Z(y) = 2 q(y) sum_x q(x) r(y, x) (module docstring), O(V^2) per row,
  computed over chunks of y (`jax.lax.map`), so memory stays
  `[rows, chunk, V]`.

  Args:
    p_xV, q_xV: float32 `[..., V]` laws (the target's and the draft's, after
      the sampling transform), the same shape.
    chunk: static, y per chunk; None: as many as keep a chunk under 2^24
      elements.
  """
  if p_xV.shape != q_xV.shape:
    raise ValueError(f"p {tuple(p_xV.shape)} and q {tuple(q_xV.shape)} must "
                     f"have the same shape [..., V].")
  lead, vocab = q_xV.shape[:-1], q_xV.shape[-1]
  check_vocab(vocab)
  p_RxV = p_xV.reshape(-1, vocab).astype(jnp.float32)
  q_RxV = q_xV.reshape(-1, vocab).astype(jnp.float32)
  rows = p_RxV.shape[0]
  if chunk is None:
    chunk = max(1, min(vocab, _CHUNK_ELEMENTS // max(1, rows * vocab)))
  if not isinstance(chunk, (int, np.integer)) or chunk < 1:
    raise ValueError(f"chunk must be a positive int, got {chunk!r}.")
  chunk = int(min(chunk, vocab))
  lw_RxV = log_weight(p_RxV, q_RxV)
  num = math.ceil(vocab / chunk)
  # Padded y's have weight 0 and are cut off below.
  lw_y_CxRxc = jnp.pad(lw_RxV, ((0, 0), (0, num * chunk - vocab)),
                       constant_values=-jnp.inf).reshape(
                           rows, num, chunk).transpose(1, 0, 2)

  def one_chunk(lw_y_Rxc):
    r_RxcxV = pair_selection(lw_y_Rxc[:, :, None], lw_RxV[:, None, :])
    # A product and a sum, not a matmul: no reduced-precision dot.
    return jnp.sum(r_RxcxV * q_RxV[:, None, :], axis=-1)

  if num == 1:
    s_RxV = one_chunk(lw_y_CxRxc[0])
  else:
    s_RxV = jax.lax.map(one_chunk, lw_y_CxRxc).transpose(1, 0, 2).reshape(
        rows, num * chunk)[:, :vocab]
  return (2.0 * q_RxV * s_RxV).reshape(lead + (vocab,))


def canonical_verify(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                     topology: tree_lib.TreeTopology, sample, *,
                     control=None):
  """The canonical verifier (importance-weighted selection, then
  speculative sampling with the selected draft's law) node by node down a
  static tree of i.i.d. children, at most 2 per node.

  Args:
    u_BxNx2: float32 uniforms `[B, N + 1, 2]`, `tree.tree_verify`'s layout:
      at a node of two valid children [:, c1, 0] selects and [:, c2, 0]
      judges (one valid child: its own judges); [:, u + 1, 1] draws the
      residual token at node u (or the root, u = -1 -> index 0).
    p_BxN1xV, q_BxN1xV: float32 `[B, N + 1, V]`: target / draft laws after
      the root (index 0) and after each node i (index i + 1); V <=
      `MAX_VOCAB`.
    tokens_BxN: int32 `[B, N]` node tokens, children drawn i.i.d. from q at
      their parent; valid_BxN: bool `[B, N]` (an invalid child is left out
      of its parent's k).
    topology: static `TreeTopology`, at most 2 children per node.
    sample: the loop's sampler, `sample(u_x, probs_xV) -> int32`.
    control: static; None for the exact rule. True is a NEGATIVE CONTROL
      only (the lab's "draft_law_q": Z is judged with q, not q_Z): not
      exact wherever a node has two children.

  Returns:
    As `tree.tree_verify`: (path_BxD int32 `[B, D]`: kept node per depth,
    -1 past the end; emitted_BxD1 int32 `[B, D + 1]`: the kept tokens, then
    the final token at num_accepted (and at D); num_accepted_B int32
    `[B]`).
  """
  tree_lib.check_control(control)
  tree_lib.check_walk_args(topology, u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN,
                           valid_BxN)
  check_topology(topology)
  check_vocab(p_BxN1xV.shape[-1])
  # Static: the depths (0: the root) with a node of two children, the only
  # levels of the walk that need q_Z (a row at level d is at depth d).
  depth_T = topology.depth_with_root()
  pair_depths = {int(depth_T[u + 1]) for u in range(-1, topology.num_nodes)
                 if len(topology.children(u)) == 2}

  def judge(view):
    p_BxV, q_BxV, ok_BxK = view.p_BxV, view.q_BxV, view.valid_BxK
    kids_BxK, x_BxK = view.kids_BxK, view.tokens_BxK
    rows_B = jnp.arange(kids_BxK.shape[0])
    k_B = jnp.sum(ok_BxK, axis=1)
    # The first and the last valid child (the same one where k = 1).
    first_B = jnp.argmax(ok_BxK, axis=1)
    last_B = kids_BxK.shape[1] - 1 - jnp.argmax(ok_BxK[:, ::-1], axis=1)
    x1_B, x2_B = x_BxK[rows_B, first_B], x_BxK[rows_B, last_B]
    if view.level in pair_depths:
      lw_BxV = log_weight(p_BxV, q_BxV)
      r12_B = pair_selection(lw_BxV[rows_B, x1_B], lw_BxV[rows_B, x2_B])
      pick_first_B = (k_B < 2) | (view.u_BxK[rows_B, first_B] < r12_B)
      # The selected draft's law: q_Z with two children, q with one.
      law_BxV = q_BxV if control else jnp.where(
          (k_B == 2)[:, None], selected_law(p_BxV, q_BxV), q_BxV)
    else:  # no node of this depth has two children: token-level
      pick_first_B = jnp.ones(k_B.shape, bool)
      law_BxV = q_BxV
    z_B = jnp.where(pick_first_B, x1_B, x2_B)
    q_z_B = law_BxV[rows_B, z_B]
    # Z exists where a child was drafted; a law of 0 at Z (never drawn
    # from it) leaves the node to p.
    has_B = (k_B > 0) & (q_z_B > 0)
    # u < min(1, p / q_Z) without dividing.
    keep_B = has_B & (view.u_BxK[rows_B, last_B] * q_z_B < p_BxV[rows_B, z_B])
    judged_BxV = jnp.where(has_B[:, None], law_BxV, 0.0)
    r_BxV = tree_lib.residual(jnp.maximum(p_BxV - judged_BxV, 0.0), p_BxV)
    y_B = jnp.where(keep_B, z_B,
                    sample(view.u_final_B, r_BxV).astype(jnp.int32))
    # Y is the node's token, whichever way it came: a residual token equal
    # to the other child's descends into it (exact: that child's subtree
    # was drafted given its token alone). Two children of one token: the
    # first, as the greedy walk.
    chosen_B = tree_lib.first_child(kids_BxK, ok_BxK & (x_BxK == y_B[:, None]))
    return chosen_B, r_BxV, y_B

  return tree_lib.walk(u_BxNx2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                       topology, sample, judge)
