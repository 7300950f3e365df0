"""Khisti et al.'s canonical verifier in JAX (`specjax.decode.canonical`)
and as a verifier of the compiled loop ("canonical:2,1",
"canonical:parents=...").

q_Z of two importance-weighted i.i.d. drafts (`canonical.selected_law`) is
compared with the lab's enumeration, and the one-node law and acceptance of
the JAX walk, computed without sampling, with the lab's `canonical_law(p,
q, k)`, k = 1, 2; the REAL loop on the lab's Markov chains follows the
target's law (also under temperature, top-k and top-p) and rejects the
negative control; one-hot p gives the greedy tree walk, and greedy decoding
through the rule itself equals `generate`."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import lab
from specjax import sampling as sampling_lib
from specjax.decode import canonical as canonical_lib
from specjax.decode import tree as tree_lib
from specjax.decode import verifiers as vf
from specjax.lab import models as lab_models
from specjax.lab import multidraft as md

# tests/ is on sys.path: the real-loop harness and its fixtures, and the
# greedy settings.
from test_greedy import SETTINGS, _reference, _tree_transformer
from test_traversal import _paired_gain
from test_verifiers import EOS, TOP_K_P, _run_loop
from test_verifiers import lab_loop  # pylint: disable=unused-import

_CONTROL = "canonical-draft-law-q"
# float32 laws against float64 and the bisection's 2^-30.
ATOL = 1e-6


# ---------------------------------------------------------------- registry

def test_registry_specs_round_trip_and_the_control_is_labelled():
  for spec in ("canonical:2,1,1", "canonical:parents=-1,-1,0,0,1",
               f"{_CONTROL}:2,1"):
    v = vf.get_verifier(spec)
    assert isinstance(v, vf.CanonicalVerifier) and v.spec == spec
    assert v.mode == "iid"
    assert vf.get_verifier(v.spec) == v and hash(v) == hash(
        vf.get_verifier(spec))
  v = vf.get_verifier("canonical:2,1,1")
  assert v.exact and not v.control and v.greedy_walk and v.depth == 3
  assert v == vf.CanonicalVerifier((2, 1, 1))
  assert v != vf.get_verifier("tree:2,1,1")  # another rule, another compile
  control = vf.get_verifier(f"{_CONTROL}:2,1")
  assert control.control and not control.exact and not control.greedy_walk
  with pytest.raises(ValueError, match="mode must be 'iid'"):
    vf.CanonicalVerifier((2, 1), "wor")
  # More than 2 children anywhere: refused when the spec is read, naming
  # why and the fix.
  for spec, where in (("canonical:3,1", "the root has 3"),
                      ("canonical:parents=-1,-1,0,0,0", "node 0 has 3")):
    with pytest.raises(ValueError, match=where) as info:
      vf.get_verifier(spec)
    assert "V^(k-1) tuples" in str(info.value)
    assert "'spectr:...'" in str(info.value)
  for spec, match in (("canonical", "branching per depth"),
                      ("canonical:2,x", "integers"),
                      ("canonical:0", r"branching\[0\]")):
    with pytest.raises(ValueError, match=match):
      vf.get_verifier(spec)


def test_canonical_verify_names_its_bad_arguments():
  sample = sampling_lib.sample_from_probs
  args = (jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2)) / 2,
          jnp.ones((1, 2, 2)) / 2, jnp.zeros((1, 1), jnp.int32),
          jnp.ones((1, 1), bool), tree_lib.TreeTopology((-1,)), sample)
  with pytest.raises(ValueError, match="control"):
    canonical_lib.canonical_verify(*args, control="draft_law_q")
  with pytest.raises(ValueError, match=r"must be \[B, N\]"):
    canonical_lib.canonical_verify(
        jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2)) / 2,
        jnp.ones((1, 2, 2)) / 2, jnp.zeros((1, 2), jnp.int32),
        jnp.ones((1, 2), bool), tree_lib.TreeTopology((-1,)), sample)
  three = tree_lib.TreeTopology((-1, -1, -1))
  with pytest.raises(ValueError, match="V\\^\\(k-1\\) tuples"):
    canonical_lib.canonical_verify(
        jnp.zeros((1, 4, 2)), jnp.ones((1, 4, 4)) / 4,
        jnp.ones((1, 4, 4)) / 4, jnp.zeros((1, 3), jnp.int32),
        jnp.ones((1, 3), bool), three, sample)
  # The vocabulary bound: shapes only (nothing is traced or allocated
  # beyond the arguments).
  big = canonical_lib.MAX_VOCAB + 1
  with pytest.raises(ValueError, match=r"O\(V\^2\)"):
    canonical_lib.canonical_verify(
        jnp.zeros((1, 2, 2)), jnp.ones((1, 2, big)) / big,
        jnp.ones((1, 2, big)) / big, jnp.zeros((1, 1), jnp.int32),
        jnp.ones((1, 1), bool), tree_lib.TreeTopology((-1,)), sample)
  with pytest.raises(ValueError, match="same shape"):
    canonical_lib.selected_law(jnp.ones((2, 4)), jnp.ones((2, 5)))
  with pytest.raises(ValueError, match="chunk"):
    canonical_lib.selected_law(jnp.ones((2, 4)) / 4, jnp.ones((2, 4)) / 4,
                               chunk=0)


def test_the_loop_refuses_a_vocabulary_above_the_bound(lab_loop,
                                                       monkeypatch):
  """The bound is read when the loop checks its tree, before tracing: with
  it lowered under the lab's V = 4, the loop refuses."""
  _, target, draft, prompts, lengths, *_ = lab_loop
  monkeypatch.setattr(canonical_lib, "MAX_VOCAB", 3)
  with pytest.raises(ValueError, match=r"O\(V\^2\).*'spectr:\.\.\.'"):
    sj.speculative_generate(target, draft, prompts[:2], lengths[:2],
                            jax.random.key(0), max_new_tokens=4,
                            verifier="canonical:2,1")


# ------------------------------------------- q_Z against the lab's law

def _lab_selected_law(p_V, q_V):
  """q_Z from the lab's enumeration of the i.i.d. pairs and its ratio
  selection (`canonical_law`'s steps, spelled out)."""
  drafts_NxK, prob_N = md.draft_law(q_V, 2, "iid")
  w_V = md._importance(p_V, q_V)  # pylint: disable=protected-access
  w_NxK = w_V[drafts_NxK]
  total_N1 = w_NxK.sum(-1, keepdims=True)
  sel_NxK = np.where(total_N1 > 0, w_NxK / np.where(total_N1 > 0, total_N1,
                                                     1.0), 0.5)
  q_z_V = np.zeros_like(q_V)
  for j in range(2):
    np.add.at(q_z_V, drafts_NxK[:, j], prob_N * sel_NxK[:, j])
  return q_z_V


def test_selected_law_is_the_labs_q_z_in_every_chunking():
  """`selected_law` on every lab setting (and a few laws with exact zeros,
  one-hot ones and p on q's zeros) equals the lab's enumerated q_Z to 1e-6,
  whole or in chunks of y (3 of V = 8: a padded last chunk), and sums to
  1; and the closed form 2 q(y) sum_x q(x) r(y, x) equals the lab's in
  float64 (the formula the module states)."""
  settings = md.lab_settings()
  p_RxV = np.stack([s.p_V for s in settings])
  q_RxV = np.stack([s.q_V for s in settings])
  want = np.stack([_lab_selected_law(p, q) for p, q in zip(p_RxV, q_RxV)])
  for p_V, q_V, want_V in zip(p_RxV, q_RxV, want):
    w_V = md._importance(p_V, q_V)  # pylint: disable=protected-access
    den = w_V[:, None] + w_V[None, :]
    r_VxV = np.where(den > 0, w_V[:, None] / np.where(den > 0, den, 1.0),
                     0.5)
    np.testing.assert_allclose(2 * q_V * (r_VxV @ q_V), want_V, atol=1e-14)
  p32, q32 = (jnp.asarray(a, jnp.float32) for a in (p_RxV, q_RxV))
  for chunk in (None, 3, 1, 8):
    got = np.asarray(canonical_lib.selected_law(p32, q32, chunk=chunk))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0,
                               err_msg=f"chunk={chunk}")
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=ATOL)
  # Leading dims are rows: [2, R, V] gives the same laws.
  got = np.asarray(canonical_lib.selected_law(
      jnp.stack([p32, p32]), jnp.stack([q32, q32]), chunk=3))
  np.testing.assert_allclose(got[1], want, atol=ATOL, rtol=0)


def test_pair_selection_is_exactly_antisymmetric_over_any_range():
  """r(a, b) + r(b, a) = 1 in float32, 1/2 where both weights are 0, 0 or 1
  against a weight of 0, and finite where p / q nears float32's range
  (q = 1e-36)."""
  lw = canonical_lib.log_weight(
      jnp.array([0.5, 0.0, 1e-30, 1.0, 0.3, 0.2], jnp.float32),
      jnp.array([1e-36, 0.5, 0.9, 1e-20, 0.3, 0.0], jnp.float32))
  r_AxB = np.asarray(canonical_lib.pair_selection(lw[:, None], lw[None, :]))
  assert np.isfinite(r_AxB).all()
  np.testing.assert_array_equal(r_AxB + r_AxB.T, 1.0)
  assert r_AxB[1, 5] == 0.5 and r_AxB[1, 1] == 0.5
  assert r_AxB[0, 1] == 1.0 and r_AxB[1, 0] == 0.0
  assert r_AxB[4, 4] == 0.5


# --------------------------------- the JAX node law against the lab's law

@functools.partial(jax.jit, static_argnums=(5, 6))
def _verify(u, p, q, tokens, valid, topology, control):
  return canonical_lib.canonical_verify(
      u, p, q, tokens, valid, topology, sampling_lib.sample_from_probs,
      control=control)


def _bisect(steps, rows, predicate):
  """Per row, sup{u in [0, 1): predicate(u)} (predicate monotone: true below
  its threshold), to 2^-steps."""
  lo, hi = np.zeros(rows), np.ones(rows)
  for _ in range(steps):
    mid = (lo + hi) / 2
    ok = predicate(mid)
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  return lo


_LAST = 1.0 - 2.0 ** -24  # the largest float32 below 1


def _jax_node_laws(settings, k, width=None, control=None, steps=30):
  """Per setting, (law `[V]`, acceptance) of the JAX walk at the root of a
  depth-1 tree of `width` (default k) i.i.d. children, k of them valid
  (slots past k invalid, token 0), computed without sampling, float64.

  Every tuple of the lab's `draft_law(q, k, "iid")` is a row. The walk
  uses three uniforms at the node: u[c1, 0] selects (Z = x_1 below the
  selection threshold), u[c_k, 0] judges Z, u[root, 1] draws the residual.
  For each selection side s (u_sel = 0: x_1 wherever it can be selected;
  u_sel = 1 - 2^-24: x_2 wherever it can), as in tests/test_greedy_draft:
  the residual's CDF by bisection on u_res with Z rejected, and Z's keep
  probability by bisection on u_keep with u_res inside a residual token's
  interval other than Z's; L_s = keep delta_Z + (1 - keep) residual. Then
  the selection threshold by bisection on u_sel, judged at a probe
  (u_keep = 0, u_res inside one residual interval) where the two sides
  emit different tokens; where no probe differs, L_1 = L_2 and the
  threshold changes nothing. Law = r L_1 + (1 - r) L_2. The walk's descent
  is checked at every probe (it descends iff it emits a drafted token);
  the acceptance is the law's mass on the drafted tokens."""
  width = k if width is None else width
  vocab = settings[0].p_V.shape[0]
  p_rows, q_rows, tokens, weight, owner = [], [], [], [], []
  for i, s in enumerate(settings):
    drafts_NxK, prob_N = md.draft_law(s.q_V, k, "iid")
    for drafts_K, prob in zip(drafts_NxK, prob_N):
      p_rows.append(s.p_V)
      q_rows.append(s.q_V)
      tokens.append(np.r_[drafts_K, np.zeros(width - k, np.int64)])
      weight.append(prob)
      owner.append(i)
  rows = len(weight)
  tokens_RxW = np.array(tokens, np.int32)
  valid_RxW = np.broadcast_to(np.arange(width) < k, tokens_RxW.shape)
  topology = tree_lib.TreeTopology.from_branching((width,))

  def laws(n):
    at = np.arange(n) % rows
    return tuple(jnp.asarray(a) for a in (
        np.broadcast_to(np.array(p_rows, np.float32)[at, None],
                        (n, width + 1, vocab)),
        np.broadcast_to(np.array(q_rows, np.float32)[at, None],
                        (n, width + 1, vocab)),
        tokens_RxW[at], valid_RxW[at]))

  one, many = laws(rows), laws(rows * vocab)

  def run(u_sel, u_keep, u_res, args):
    n = args[2].shape[0]
    u = np.full((n, width + 1, 2), 0.5)
    u[:, 0, 0] = u_sel
    u[:, k - 1, 0] = u_keep
    u[:, 0, 1] = u_res
    path, emitted, _ = (np.asarray(a) for a in _verify(
        jnp.asarray(u, jnp.float32), *args, topology, control))
    y_R = emitted[:, 0]
    drafted_R = (tokens_RxW[np.arange(n) % rows, :k] == y_R[:, None]).any(1)
    np.testing.assert_array_equal(path[:, 0] >= 0, drafted_R)
    return y_R

  t_R = np.repeat(np.arange(vocab), rows)
  sides = []
  for u_sel in ((0.0, _LAST) if k == 2 else (0.0,)):
    z_R = run(u_sel, 0.0, 0.5, one)  # not always Z (p(Z) = 0): fixed below
    cdf_R = _bisect(steps, rows * vocab, lambda u, s=u_sel: run(
        s, _LAST, u, many) <= t_R)
    cdf_RxV1 = np.concatenate([np.zeros((rows, 1)),
                               cdf_R.reshape(vocab, rows).T], axis=1)
    cdf_RxV1[:, -1] = 1.0
    residual_RxV = np.diff(cdf_RxV1, axis=1)
    mid_RxV = (cdf_RxV1[:, :-1] + cdf_RxV1[:, 1:]) / 2
    # Z itself: at u_keep = 0 Z is kept iff p(Z) > 0; else Z's keep
    # probability is 0 and which token it was does not matter.
    sel_first = np.full(rows, u_sel == 0.0)
    z_R = np.where(sel_first, tokens_RxW[:, 0], tokens_RxW[:, k - 1])
    other_RxV = (residual_RxV > 1e-6) & (np.arange(vocab) != z_R[:, None])
    res_R = np.where(other_RxV.any(1), mid_RxV[np.arange(rows),
                                                np.argmax(other_RxV, 1)], 0.5)
    keep_R = _bisect(steps, rows, lambda u, s=u_sel: run(
        s, u, res_R, one) == z_R)
    law_RxV = (1.0 - keep_R)[:, None] * residual_RxV
    law_RxV[np.arange(rows), z_R] += keep_R
    sides.append((law_RxV, mid_RxV, residual_RxV))
  if k == 2:
    (law1, mid1, res1), (law2, _, _) = sides
    # A probe where the sides differ: u_keep = 0 and a residual interval.
    probe_R, differs_R = np.full(rows, 0.5), np.zeros(rows, bool)
    for t in range(vocab):
      at_R = np.where(res1[:, t] > 1e-6, mid1[:, t], 0.5)
      diff_R = run(0.0, 0.0, at_R, one) != run(_LAST, 0.0, at_R, one)
      new_R = diff_R & ~differs_R
      probe_R = np.where(new_R, at_R, probe_R)
      differs_R |= diff_R
    ref_R = run(0.0, 0.0, probe_R, one)
    r_R = _bisect(steps, rows, lambda u: run(u, 0.0, probe_R, one) == ref_R)
    assert np.abs(law1 - law2)[~differs_R].max(initial=0.0) < 1e-6
    law_RxV = r_R[:, None] * law1 + (1.0 - r_R)[:, None] * law2
  else:
    law_RxV = sides[0][0]
  drafted_RxV = np.zeros((rows, vocab), bool)
  np.put_along_axis(drafted_RxV, tokens_RxW[:, :k].astype(np.int64), True,
                    axis=1)
  weight_R, owner_R = np.array(weight), np.array(owner)
  out = []
  for i in range(len(settings)):
    mine = owner_R == i
    out.append((weight_R[mine] @ law_RxV[mine],
                float(weight_R[mine] @ (law_RxV[mine] * drafted_RxV[mine]
                                        ).sum(1))))
  return out


@pytest.mark.parametrize("k,width", [
    (1, 1), (1, 2), pytest.param(2, 2, marks=pytest.mark.full)])
def test_jax_node_law_is_the_lab_law(k, width):
  """On a depth-1 tree over every lab setting: the JAX walk's law is the
  lab's `canonical_law(p, q, k)` (p itself) and its acceptance the lab's,
  to 1e-6; k = 1 also as the one valid child of two (the other invalid:
  token-level verification). The negative control's law is the lab's
  control law, which misses p at k = 2."""
  settings = md.lab_settings()
  got = _jax_node_laws(settings, k, width)
  got_control = _jax_node_laws(settings, k, width, control=True)
  miss = 0.0
  for s, (law_V, accept), (control_V, control_accept) in zip(
      settings, got, got_control):
    want_V, want_accept = md.canonical_law(s.p_V, s.q_V, k)
    np.testing.assert_allclose(law_V, want_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    np.testing.assert_allclose(law_V, s.p_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    assert abs(accept - want_accept) < ATOL, (s.name, accept, want_accept)
    assert accept <= md.optimal_acceptance(s.p_V, s.q_V, k, "iid") + ATOL
    lab_V, lab_accept = md.canonical_law(s.p_V, s.q_V, k,
                                         control="draft_law_q")
    np.testing.assert_allclose(control_V, lab_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    assert abs(control_accept - lab_accept) < ATOL, s.name
    miss = max(miss, np.abs(control_V - s.p_V).max())
  if k == 2:
    assert miss > 1e-2, miss
  else:
    assert miss < ATOL, miss


# --------------------------------------------------------- greedy (T = 0)

_IRREGULAR = (-1, -1, 0, 0, 1, 2, 2, 4)


def _iid_tree(topology, q_BxN1xV, key):
  """Tokens `[B, N]` drafted node by node as the loop drafts an i.i.d.
  tree from the laws `q_BxN1xV`."""
  batch = q_BxN1xV.shape[0]
  tokens_BxN = jnp.zeros((batch, topology.num_nodes), jnp.int32)
  for u in range(-1, topology.num_nodes):
    kids = topology.children(u)
    if kids:
      x, _ = tree_lib.draft_children(
          jax.random.uniform(jax.random.fold_in(key, u + 1),
                             (batch, len(kids))), None, q_BxN1xV[:, u + 1],
          len(kids), "iid", sampling_lib.sample_from_probs)
      tokens_BxN = tokens_BxN.at[:, list(kids)].set(x)
  return tokens_BxN


@pytest.mark.full  # 1024 rows of every tree shape: about 9 s
def test_one_hot_p_gives_the_greedy_tree_walk():
  """With p one-hot on the argmax, the rule keeps what the greedy walk
  keeps (so the loop's greedy fast path is its own), on i.i.d. trees drawn
  from soft q and from one-hot q (both children one token), with children
  knocked out at random (one valid child of two), and uniforms that matter
  for a soft p."""
  topology = tree_lib.TreeTopology(_IRREGULAR)
  n, vocab, batch = topology.num_nodes, 4, 1024
  k_q, k_draw, k_valid, k_arg, k_u, k_kind = jax.random.split(
      jax.random.key(0), 6)
  q_BxN1xV = jax.nn.softmax(jax.random.normal(k_q, (batch, n + 1, vocab)))
  one_hot_BxN1 = jax.random.uniform(k_kind, (batch, n + 1)) < 0.3
  q_BxN1xV = jnp.where(one_hot_BxN1[..., None], jax.nn.one_hot(
      jnp.argmax(q_BxN1xV, -1), vocab, dtype=jnp.float32), q_BxN1xV)
  tokens_BxN = _iid_tree(topology, q_BxN1xV, k_draw)
  valid_BxN = jax.random.uniform(k_valid, (batch, n)) < 0.85
  # The argmax is often a drafted token, so that paths are kept.
  argmax_BxN1 = jnp.where(
      jax.random.uniform(k_arg, (batch, n + 1)) < 0.6,
      jnp.argmax(q_BxN1xV, -1),
      jax.random.randint(jax.random.fold_in(k_arg, 1), (batch, n + 1), 0,
                         vocab))
  p_BxN1xV = jax.nn.one_hot(argmax_BxN1, vocab, dtype=jnp.float32)
  u_BxN1x2 = jax.random.uniform(k_u, (batch, n + 1, 2))
  got = _verify(u_BxN1x2, p_BxN1xV, q_BxN1xV, tokens_BxN, valid_BxN,
                topology, None)
  want = tree_lib.greedy_tree_verify(argmax_BxN1, tokens_BxN, valid_BxN,
                                     topology)
  for name, a, b in zip(("path", "emitted", "accepted"), got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  assert set(np.asarray(got[2]).tolist()) == set(range(topology.max_depth + 1))


@dataclasses.dataclass(frozen=True)
class _NoGreedyWalk(vf.CanonicalVerifier):
  """The rule without the loop's greedy fast path: at T = 0 the loop runs
  `canonical_verify` on one-hot laws."""
  name = "canonical-no-greedy-walk"
  greedy_walk = False


@pytest.mark.parametrize("verifier", [
    _NoGreedyWalk((2, 2, 1)),
    pytest.param(vf.get_verifier("canonical:2,2,1"), marks=pytest.mark.full)])
def test_greedy_decoding_through_canonical_equals_generate(verifier):
  """Greedy speculative decoding through `canonical_verify` itself (and
  through the loop's greedy walk, the registered spec) returns
  `generate`'s tokens and lengths: a Transformer target, another
  Transformer drafting level by level (at T = 0 q is one-hot, so both
  children of a node are one token), ragged prompts and EOS."""
  name = "tree:llama"
  setting = SETTINGS[name]
  target = setting.target()
  batch, seed, key = 4, 9, 0
  prompts, lengths = setting.prompts(batch, seed)
  ref = _reference(name, batch, seed,
                   key if setting.ref_key is None else setting.ref_key)
  out = sj.speculative_generate(
      target, _tree_transformer(target, ref), prompts, lengths,
      jax.random.key(key), verifier=verifier,
      max_new_tokens=setting.max_new_tokens, sampling=sj.GREEDY,
      eos_id=setting.eos_id)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  s = out.summary()
  assert s["accepted"] <= s["verified"] <= verifier.depth * s["rounds"]
  assert np.asarray(out.stats.accept_hist)[:, 1:].sum() > 0  # paths kept


# ------------------------------------------ the REAL loop on the lab (T = 1)

@pytest.mark.big_batch
@pytest.mark.parametrize("spec", [
    # Irregular: a level whose nodes have 2 and 1 children, and a pair
    # below a single child (q_Z at depths 0 and 2).
    pytest.param("canonical:parents=-1,-1,0,2,2", marks=pytest.mark.full),
    pytest.param("canonical:2,1", marks=pytest.mark.full)])
def test_real_loop_canonical_on_the_lab_is_exact(lab_loop, spec):
  """The compiled tree round judged by the canonical verifier (10^5 ragged
  rows, EOS): the first 2 (depth + 1) tokens follow the target's law."""
  depth = vf.get_verifier(spec).depth
  result, out = _run_loop(lab_loop, spec, depth, EOS)
  assert result.passed, f"{spec}: {result}"
  hist = np.asarray(out.stats.accept_hist)
  assert ((hist[:, depth] >= 1)
          & (np.asarray(out.stats.rounds) > hist[:, depth])).sum() > 1000
  assert np.asarray(out.lengths).min() < 2 * (depth + 1)
  s = out.summary()
  assert s["accepted"] <= s["verified"] <= depth * s["rounds"]


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_rejects_the_canonical_control(lab_loop):
  result, _ = _run_loop(lab_loop, f"{_CONTROL}:2,1", 2, EOS)
  assert not result.passed, str(result)


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_canonical_under_top_k_top_p_is_exact(lab_loop):
  """Temperature, top-k and top-p at once: zeros in p and q (weights of 0,
  tokens of p that q cannot draft)."""
  result, _ = _run_loop(lab_loop, "canonical:2,2", 2, EOS, TOP_K_P)
  assert result.passed, str(result)


def test_the_control_warns_when_it_decodes(lab_loop):
  _, target, draft, prompts, lengths, *_ = lab_loop
  with pytest.warns(UserWarning, match="negative control"), pytest.raises(
      ValueError, match="max_new_tokens"):
    sj.speculative_generate(target, draft, prompts, lengths,
                            jax.random.key(0), max_new_tokens=0,
                            verifier=f"{_CONTROL}:2,1")


# ------------------------------ the canonical verifier against the i.i.d.
# tree's other rules

@pytest.mark.big_batch
@pytest.mark.optimized
@pytest.mark.full
def test_canonical_tokens_per_target_call_against_tree_and_tree_wor():
  """Same tree (2,1,1), models and keys at T = 1 on 10^4 rows of 32
  tokens: the canonical verifier's tokens per target call against
  SpecInfer's (token-level verification of the same i.i.d. drafts) and
  RSD's (children without replacement), with paired intervals. The
  canonical rule keeps more than SpecInfer here (measured +0.053 +- 0.006,
  95%), though not at every one-step lab setting; RSD's drafts, whose
  optimum is higher at k = 2, keep more (-0.114 +- 0.008): reported, not
  asserted."""
  pair = lab.make_markov_pair(2.0, 0.4, 1)
  target, draft = lab_models.markov_lms(pair)
  rows = 10_000
  prompts = np.tile(np.array([[3, 5]], np.int32), (rows, 1))
  outs = {}
  for rule in ("canonical", "tree", "tree-wor"):
    outs[rule] = sj.speculative_generate(
        target, draft, prompts, np.full(rows, 2, np.int32), jax.random.key(4),
        max_new_tokens=32, verifier=f"{rule}:2,1,1")
  summaries = {k: o.summary() for k, o in outs.items()}
  line = ", ".join(f"{k} {s['tokens_per_target_call']:.4f}"
                   for k, s in summaries.items())
  print(f"2,1,1 tokens per target call: {line}")
  for other in ("tree", "tree-wor"):
    gain, se = _paired_gain(outs["canonical"], outs[other])
    assert gain == pytest.approx(
        summaries["canonical"]["tokens_per_target_call"]
        - summaries[other]["tokens_per_target_call"])
    print(f"  canonical - {other}: {gain:+.4f} +- {1.96 * se:.4f} (95%)")
    if other == "tree":
      assert gain - 3 * se > 0, (gain, se)
