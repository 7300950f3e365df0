"""Hu et al.'s greedy drafts in JAX (`tree.greedy_children`,
`specjax.decode.greedy_draft`) and as a verifier of the compiled loop
("greedy-draft:3,1", "greedy-draft:parents=...").

The draft law of the JAX children and the one-node law of the JAX rule are
computed without sampling and compared with the lab's enumeration
(`specjax.lab.multidraft.draft_law` and `greedy_law`), and the rule's
acceptance with the scheme's optimum (`optimal_acceptance`); the REAL loop
on the lab's Markov chains follows the target's law and rejects the
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
from specjax.decode import greedy_draft as greedy_draft_lib
from specjax.decode import tree as tree_lib
from specjax.decode import verifiers as vf
from specjax.lab import models as lab_models
from specjax.lab import multidraft as md

# tests/ is on sys.path: the real-loop harness and its fixtures, and the
# greedy settings.
from test_constraint import _check as _check_constrained
from test_constraint import _run as _run_constrained
from test_constraint import lab_setup  # pylint: disable=unused-import
from test_greedy import SETTINGS, _reference, _tree_transformer
from test_traversal import _paired_gain
from test_verifiers import EOS, TOP_K_P, _run_loop
from test_verifiers import lab_loop  # pylint: disable=unused-import

_CONTROL = "greedy-draft-residual-outside-drafts"


# ---------------------------------------------------------------- registry

def test_registry_specs_round_trip_and_the_control_is_labelled():
  for spec in ("greedy-draft:3,1,1", "greedy-draft:parents=-1,-1,0,0,1",
               f"{_CONTROL}:3,1"):
    v = vf.get_verifier(spec)
    assert isinstance(v, vf.GreedyDraftVerifier) and v.spec == spec
    assert v.mode == "greedy"
    assert vf.get_verifier(v.spec) == v and hash(v) == hash(
        vf.get_verifier(spec))
  v = vf.get_verifier("greedy-draft:3,1,1")
  assert v.exact and not v.control and v.greedy_walk and v.depth == 3
  assert v == vf.GreedyDraftVerifier((3, 1, 1))  # mode defaults to greedy
  assert v != vf.get_verifier("tree-wor:3,1,1")  # another round, compile
  control = vf.get_verifier(f"{_CONTROL}:3,1")
  assert control.control and not control.exact and not control.greedy_walk
  with pytest.raises(ValueError, match="mode must be 'greedy'"):
    vf.GreedyDraftVerifier((2, 1), "wor")
  # Token-level trees cannot judge greedy drafts; the error names the rule
  # that can.
  with pytest.raises(ValueError, match="greedy-draft:3,1,1"):
    vf.TreeVerifier((2, 1), "greedy")
  for spec, match in (("greedy-draft", "branching per depth"),
                      ("greedy-draft:2,x", "integers"),
                      ("greedy-draft:0", r"branching\[0\]")):
    with pytest.raises(ValueError, match=match):
      vf.get_verifier(spec)
  with pytest.raises(ValueError, match="control"):
    greedy_draft_lib.greedy_draft_verify(
        jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2)) / 2, jnp.ones((1, 2, 2)) / 2,
        jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool),
        tree_lib.TreeTopology((-1,)), sampling_lib.sample_from_probs,
        control="residual_outside_drafts")
  with pytest.raises(ValueError, match=r"must be \[B, N\]"):
    greedy_draft_lib.greedy_draft_verify(
        jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2)) / 2, jnp.ones((1, 2, 2)) / 2,
        jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2), bool),
        tree_lib.TreeTopology((-1,)), sampling_lib.sample_from_probs)


def test_the_loop_refuses_more_children_than_tokens(lab_loop):
  _, target, draft, prompts, lengths, *_ = lab_loop  # V = 4
  with pytest.raises(ValueError, match="more than the vocabulary"):
    sj.speculative_generate(target, draft, prompts[:2], lengths[:2],
                            jax.random.key(0), max_new_tokens=4,
                            verifier="greedy-draft:5,1")


# ------------------------------------- the JAX drafts against the lab's law

@functools.partial(jax.jit, static_argnums=(3,))
def _children(u_R, q_RxV, counts_R, width):
  return tree_lib.greedy_children(u_R, q_RxV, counts_R, width,
                                  sampling_lib.sample_from_probs)


def _bisect(steps, rows, predicate):
  """Per row, sup{u in [0, 1): predicate(u)} (predicate monotone: true below
  its threshold), to 2^-steps."""
  lo, hi = np.zeros(rows), np.ones(rows)
  for _ in range(steps):
    mid = (lo + hi) / 2
    ok = predicate(mid)
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  return lo


# float32 laws against float64 and the bisection's 2^-30.
ATOL = 1e-6


def test_jax_children_follow_the_lab_draft_law():
  """On every lab setting and k = 1..4, drafted in a level 4 wide (a node
  with fewer children than the widest one keeps its own last draw): the
  first k - 1 children are the lab's top k - 1 of q (ties: the lower id),
  and the last one's law, by bisection on its uniform, is the lab's (its
  slot invalid exactly where the lab leaves it empty)."""
  settings = md.lab_settings()
  vocab, width = settings[0].q_V.shape[0], 4
  ks = np.arange(1, width + 1)
  q_RxV = np.repeat(np.stack([s.q_V for s in settings]), len(ks), axis=0)
  k_R = np.tile(ks, len(settings))
  rows = len(k_R)
  q = jnp.asarray(q_RxV, jnp.float32)
  counts = jnp.asarray(k_R, jnp.int32)
  tokens, valid = (np.asarray(a) for a in _children(
      jnp.full((rows,), 0.5), q, counts, width))
  # The CDF of the last draw at each token, for all tokens at once.
  last = lambda tok, k=k_R: tok[np.arange(len(k)), k - 1]
  cdf_RxV = np.ones((rows, vocab))
  for t in range(vocab - 1):
    cdf_RxV[:, t] = _bisect(30, rows, lambda u, t=t: last(np.asarray(
        _children(jnp.asarray(u, jnp.float32), q, counts, width)[0])) <= t)
  law_RxV = np.diff(cdf_RxV, axis=1, prepend=0.0)
  empty_slots = 0
  for r in range(rows):
    s, k = settings[r // len(ks)], int(k_R[r])
    drafts_NxK, prob_N = md.draft_law(s.q_V, k, "greedy")
    np.testing.assert_array_equal(tokens[r, :k - 1], drafts_NxK[0, :k - 1],
                                  err_msg=f"{s.name}, k={k}")
    assert valid[r, :k - 1].all() and not valid[r, k:].any()
    if drafts_NxK[0, -1] < 0:  # the lab's empty slot
      assert not valid[r, k - 1], (s.name, k)
      empty_slots += 1
      continue
    assert valid[r, k - 1], (s.name, k)
    want_V = np.zeros(vocab)
    np.add.at(want_V, drafts_NxK[:, -1], prob_N)
    np.testing.assert_allclose(law_RxV[r], want_V, atol=ATOL, rtol=0,
                               err_msg=f"{s.name}, k={k}")
  assert empty_slots >= 3, empty_slots  # one-hot q at k >= 2, two tokens at 3


def test_greedy_children_name_their_bad_arguments():
  q_2x4 = jnp.full((2, 4), 0.25)
  sample = sampling_lib.sample_from_probs
  for args, match in (((jnp.zeros(2), q_2x4, 2, 5), "more than the vocab"),
                      ((jnp.zeros(3), q_2x4, 2, 2), "leading shape"),
                      ((jnp.zeros(2), q_2x4, np.array([1, 3]), 2),
                       r"\[1, width=2\]"),
                      ((jnp.zeros(2), q_2x4, 0, 2), r"\[1, width=2\]")):
    with pytest.raises(ValueError, match=match):
      tree_lib.greedy_children(*args, sample)


# -------------------------------- the JAX node law against the lab's law

@functools.partial(jax.jit, static_argnums=(5, 6))
def _verify(u, p, q, tokens, valid, topology, control):
  return greedy_draft_lib.greedy_draft_verify(
      u, p, q, tokens, valid, topology, sampling_lib.sample_from_probs,
      control=control)


def _jax_node_laws(settings, k, control=None, steps=30):
  """Per setting, (law `[V]`, acceptance) of the JAX rule at the root of a
  depth-1 tree of k greedy children, computed without sampling, float64.

  Every draft tuple of the lab's `draft_law(q, k, "greedy")` is a row (an
  empty slot: an invalid child, once with token 0 and once repeating the
  top token, which must change nothing). With the last child rejected
  (u[k - 1, 0] = 1 - 2^-24), the residual token's CDF is found by bisection
  on u[0, 1] (every token at once, one copy of the rows each), and whether
  the walk descends on each residual token by running the rule inside that
  token's CDF interval; then the last child's keep probability by
  bisection on u[k - 1, 0], with u[0, 1] inside the interval of a residual
  token other than the last child's (a kept last child and a residual
  equal to its token both descend into it). The acceptance is P(the walk
  keeps a child)."""
  vocab = settings[0].p_V.shape[0]
  p_rows, q_rows, tokens, valid, weight, owner = [], [], [], [], [], []
  for i, s in enumerate(settings):
    drafts_NxK, prob_N = md.draft_law(s.q_V, k, "greedy")
    fills = (0,) + ((int(drafts_NxK[0, 0]),) if k >= 2 else ())
    for fill in fills:
      for drafts_K, prob in zip(drafts_NxK, prob_N):
        p_rows.append(s.p_V)
        q_rows.append(s.q_V)
        tokens.append(np.where(drafts_K >= 0, drafts_K, fill))
        valid.append(drafts_K >= 0)
        weight.append(prob / len(fills))
        owner.append(i)
  rows = len(weight)
  topology = tree_lib.TreeTopology.from_branching((k,))
  copies = vocab - 1

  def laws(n):
    at = np.arange(n) % rows
    return tuple(jnp.asarray(a) for a in (
        np.broadcast_to(np.array(p_rows, np.float32)[at, None],
                        (n, k + 1, vocab)),
        np.broadcast_to(np.array(q_rows, np.float32)[at, None],
                        (n, k + 1, vocab)),
        np.array(tokens, np.int32)[at], np.array(valid)[at]))

  one, many = laws(rows), laws(rows * copies)

  def run(u_Rx2, args):
    return [np.asarray(a) for a in _verify(jnp.asarray(u_Rx2, jnp.float32),
                                           *args, topology, control)]

  def with_u(n, last, res):
    u = np.full((n, k + 1, 2), 0.5)
    u[:, k - 1, 0] = last
    u[:, 0, 1] = res
    return u

  reject = 1.0 - 2.0 ** -24
  t_R = np.repeat(np.arange(copies), rows)
  cdf_R = _bisect(steps, rows * copies, lambda u: run(
      with_u(rows * copies, reject, u), many)[1][:, 0] <= t_R)
  cdf_RxV1 = np.concatenate([np.zeros((rows, 1)),
                             cdf_R.reshape(copies, rows).T,
                             np.ones((rows, 1))], axis=1)
  residual_RxV = np.diff(cdf_RxV1, axis=1)
  mid_RxV = (cdf_RxV1[:, :-1] + cdf_RxV1[:, 1:]) / 2
  # Inside each token's CDF interval the residual emits that token: does
  # the walk descend?
  descend_RxV = np.stack([
      run(with_u(rows, reject, mid_RxV[:, t]), one)[0][:, 0] >= 0
      for t in range(vocab)], axis=1)
  last_R = np.array(tokens)[:, k - 1]
  other_RxV = (residual_RxV > 1e-6) & (np.arange(vocab) != last_R[:, None])
  # Where the residual only emits the last child's token the keep
  # probability changes nothing: any u[0, 1] will do.
  res_R = np.where(other_RxV.any(1), mid_RxV[np.arange(rows),
                                              np.argmax(other_RxV, 1)], 0.5)
  keep_R = _bisect(steps, rows, lambda u: run(
      with_u(rows, u, res_R), one)[1][:, 0] == last_R)
  out = []
  weight_R, owner_R = np.array(weight), np.array(owner)
  for i in range(len(settings)):
    mine = owner_R == i
    law_V = weight_R[mine] @ ((1.0 - keep_R[mine])[:, None]
                              * residual_RxV[mine])
    np.add.at(law_V, last_R[mine], weight_R[mine] * keep_R[mine])
    accept = weight_R[mine] @ (keep_R[mine] + (1.0 - keep_R[mine]) * (
        residual_RxV[mine] * descend_RxV[mine]).sum(1))
    out.append((law_V, accept))
  return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_jax_node_law_is_the_lab_law_and_reaches_the_optimum(k):
  """On a depth-1 tree of k greedy children, over every lab setting: the
  JAX rule's law is the lab's `greedy_law` (p itself) and its acceptance
  the lab's, which is the scheme's optimum `optimal_acceptance(p, q, k,
  "greedy")`, all to 1e-6, including the settings whose last slot is empty
  (q one-hot, q on two tokens at k = 3, 4); the negative control's law is
  the lab's control law, which misses p for k >= 2."""
  settings = md.lab_settings()
  got = _jax_node_laws(settings, k)
  got_control = _jax_node_laws(settings, k, control=True)
  miss = 0.0
  for s, (law_V, accept), (control_V, control_accept) in zip(
      settings, got, got_control):
    want_V, want_accept = md.greedy_law(s.p_V, s.q_V, k)
    np.testing.assert_allclose(law_V, want_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    np.testing.assert_allclose(law_V, s.p_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    assert abs(accept - want_accept) < ATOL, (s.name, accept, want_accept)
    optimum = md.optimal_acceptance(s.p_V, s.q_V, k, "greedy")
    assert abs(accept - optimum) < ATOL, (s.name, accept, optimum)
    lab_V, lab_accept = md.greedy_law(s.p_V, s.q_V, k,
                                      "residual_outside_drafts")
    np.testing.assert_allclose(control_V, lab_V, atol=ATOL, rtol=0,
                               err_msg=s.name)
    assert abs(control_accept - lab_accept) < ATOL, s.name
    miss = max(miss, np.abs(control_V - s.p_V).max())
  if k >= 2:
    assert miss > 1e-2, miss


# --------------------------------------------------------- greedy (T = 0)

_IRREGULAR = (-1, -1, -1, 0, 0, 1, 3, 3)


def _greedy_tree(topology, q_BxN1xV, key):
  """Tokens and valid `[B, N]` drafted node by node as the loop drafts a
  greedy tree from the laws `q_BxN1xV`."""
  batch = q_BxN1xV.shape[0]
  tokens_BxN = jnp.zeros((batch, topology.num_nodes), jnp.int32)
  valid_BxN = jnp.ones((batch, topology.num_nodes), bool)
  for u in range(-1, topology.num_nodes):
    kids = topology.children(u)
    if kids:
      x, ok = tree_lib.greedy_children(
          jax.random.uniform(jax.random.fold_in(key, u + 1), (batch,)),
          q_BxN1xV[:, u + 1], len(kids), len(kids),
          sampling_lib.sample_from_probs)
      tokens_BxN = tokens_BxN.at[:, list(kids)].set(x)
      valid_BxN = valid_BxN.at[:, list(kids)].set(ok)
  return tokens_BxN, valid_BxN


@pytest.mark.full  # 1024 rows of every tree shape: about 9 s
def test_one_hot_p_gives_the_greedy_tree_walk():
  """With p one-hot on the argmax, the rule keeps what the greedy walk
  keeps (so the loop's greedy fast path is its own), on greedy trees drawn
  from soft q and from q one-hot or on two tokens (empty last slots), with
  children knocked out at random, and uniforms that matter for a soft p."""
  topology = tree_lib.TreeTopology(_IRREGULAR)
  n, vocab, batch = topology.num_nodes, 4, 1024
  k_q, k_draw, k_valid, k_arg, k_u, k_kind = jax.random.split(
      jax.random.key(0), 6)
  q_BxN1xV = jax.nn.softmax(jax.random.normal(k_q, (batch, n + 1, vocab)))
  # A third of the laws one-hot, a third on two tokens.
  kind_BxN1 = jax.random.randint(k_kind, (batch, n + 1), 0, 3)
  top2 = jnp.argsort(-q_BxN1xV, axis=-1)[..., :2]
  keep2_BxN1xV = jnp.any(jax.nn.one_hot(top2, vocab, dtype=bool), axis=-2)
  q_BxN1xV = jnp.where(
      (kind_BxN1 == 0)[..., None],
      jax.nn.one_hot(top2[..., 0], vocab, dtype=jnp.float32),
      jnp.where((kind_BxN1 == 1)[..., None] & ~keep2_BxN1xV, 0.0, q_BxN1xV))
  q_BxN1xV = q_BxN1xV / q_BxN1xV.sum(-1, keepdims=True)
  tokens_BxN, valid_BxN = _greedy_tree(topology, q_BxN1xV, k_draw)
  assert not np.asarray(valid_BxN).all()  # empty slots
  valid_BxN = valid_BxN & (jax.random.uniform(k_valid, (batch, n)) < 0.85)
  argmax_BxN1 = jax.random.randint(k_arg, (batch, n + 1), 0, vocab)
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
class _NoGreedyWalk(vf.GreedyDraftVerifier):
  """The rule without the loop's greedy fast path: at T = 0 the loop runs
  `greedy_draft_verify` on one-hot laws."""
  name = "greedy-draft-no-greedy-walk"
  greedy_walk = False


@pytest.mark.parametrize("verifier", [
    _NoGreedyWalk((3, 2, 1)),
    pytest.param(vf.get_verifier("greedy-draft:3,2,1"),
                 marks=pytest.mark.full)])
def test_greedy_decoding_through_greedy_drafts_equals_generate(verifier):
  """Greedy speculative decoding through `greedy_draft_verify` itself (and
  through the loop's greedy walk, the registered spec) returns
  `generate`'s tokens and lengths: a Transformer target, another
  Transformer drafting level by level (at T = 0 q is one-hot, so every
  node's last slot is empty), ragged prompts and EOS."""
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
    # Irregular: a level whose nodes have 2 and 1 children (each drafts its
    # own top k - 1 and last draw), 3 children of 4 tokens at the root.
    pytest.param("greedy-draft:parents=-1,-1,-1,0,0,1,3",
                 marks=pytest.mark.full),
    pytest.param("greedy-draft:2,1", marks=pytest.mark.full)])
def test_real_loop_greedy_draft_on_the_lab_is_exact(lab_loop, spec):
  """The compiled tree round with greedy drafts (10^5 ragged rows, EOS):
  the first 2 (depth + 1) tokens follow the target's law."""
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
def test_real_loop_rejects_the_greedy_draft_control(lab_loop):
  result, _ = _run_loop(lab_loop, f"{_CONTROL}:3,1", 2, EOS)
  assert not result.passed, str(result)


@pytest.mark.big_batch
@pytest.mark.full
def test_real_loop_greedy_draft_under_top_k_top_p_is_exact(lab_loop):
  """Temperature, top-k and top-p at once: zeros in p and q, and (3
  children where q keeps 2 or 3 of 4 tokens) empty last slots."""
  result, _ = _run_loop(lab_loop, "greedy-draft:3,1", 2, EOS, TOP_K_P)
  assert result.passed, str(result)


@pytest.mark.big_batch
@pytest.mark.full
def test_constrained_loop_with_greedy_drafts_samples_the_constrained_target(
    lab_setup):
  """Under a constraint both models' laws are masked at every node before
  the children are drafted (the top k - 1 of the masked q) and judged: the
  first 6 tokens of 10^5 ragged rows follow the constrained target's law
  (gamma = 2, the tree's depth)."""
  out = _run_constrained(lab_setup, "greedy-draft:3,1")
  for result in _check_constrained(lab_setup, out, 6, None):
    assert result.passed, str(result)


def test_the_control_warns_when_it_decodes(lab_loop):
  _, target, draft, prompts, lengths, *_ = lab_loop
  with pytest.warns(UserWarning, match="negative control"), pytest.raises(
      ValueError, match="max_new_tokens"):
    sj.speculative_generate(target, draft, prompts, lengths,
                            jax.random.key(0), max_new_tokens=0,
                            verifier=f"{_CONTROL}:3,1")


# --------------------------------- greedy drafts against drafts without
# replacement

@pytest.mark.big_batch
@pytest.mark.optimized
@pytest.mark.full
def test_greedy_draft_and_tree_wor_tokens_per_target_call():
  """Same tree (3,2,1), models and keys at T = 1 on 10^4 rows: greedy
  drafts' tokens per target call against RSD's (children without
  replacement, token-level verification), with a paired interval."""
  pair = lab.make_markov_pair(2.0, 0.4, 1)
  target, draft = lab_models.markov_lms(pair)
  rows = 10_000
  prompts = np.tile(np.array([[3, 5]], np.int32), (rows, 1))
  outs = {}
  for rule in ("tree-wor", "greedy-draft"):
    outs[rule] = sj.speculative_generate(
        target, draft, prompts, np.full(rows, 2, np.int32), jax.random.key(4),
        max_new_tokens=32, verifier=f"{rule}:3,2,1")
  gain, se = _paired_gain(outs["greedy-draft"], outs["tree-wor"])
  summaries = {k: o.summary() for k, o in outs.items()}
  assert gain == pytest.approx(
      summaries["greedy-draft"]["tokens_per_target_call"]
      - summaries["tree-wor"]["tokens_per_target_call"])
  print(f"3,2,1 tokens per target call: greedy-draft "
        f"{summaries['greedy-draft']['tokens_per_target_call']:.4f}, "
        f"tree-wor {summaries['tree-wor']['tokens_per_target_call']:.4f}, "
        f"difference {gain:+.4f} +- {1.96 * se:.4f} (95%)")
  assert gain - 3 * se > 0, (gain, se)
