"""Tests for specjax.lab, the exact rejection-sampling oracle (seed 004)."""

import jax
import numpy as np
import pytest
from scipy import stats

from specjax import coupling
from specjax import lab
from specjax.lab import exact as lab_exact
from specjax.lab import stopping
from specjax.lab import verifiers as lab_verifiers

TOL = 1e-12

# (certainty, draft_match, seed): typical, uniform rows, near one-hot rows with
# exact zeros, unrelated draft, draft == target.
SETTINGS = [(1.5, 0.8, 0), (0.0, 0.3, 1), (1000.0, 0.5, 2), (3.0, 0.0, 3),
            (2.0, 1.0, 4)]


@pytest.mark.parametrize("certainty,draft_match,seed", SETTINGS)
@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
def test_exact_rule_has_zero_tv(certainty, draft_match, seed, gamma):
  pair = lab.make_markov_pair(certainty, draft_match, seed)
  for seq_len in (1, 2, 3, 4):
    assert lab.exact_tv(pair, gamma, seq_len) <= TOL


@pytest.mark.parametrize("rule", lab.RULES)
@pytest.mark.parametrize("gamma,seq_len", [(1, 3), (3, 2), (2, 5), (4, 4)])
def test_distributions_normalise(rule, gamma, seq_len):
  pair = lab.make_markov_pair(seed=7)
  spec = lab.speculative_distribution(pair, gamma, seq_len, rule)
  assert spec.shape == (lab.VOCAB_SIZE,) * seq_len
  assert spec.dtype == np.float64
  assert np.all(spec >= 0)
  assert abs(spec.sum() - 1) <= TOL
  assert abs(lab.target_distribution(pair, seq_len).sum() - 1) <= TOL
  for block in lab.round_distribution(pair, gamma, rule):
    assert block.shape[0] == lab.VOCAB_SIZE + 1
  masses = sum(b.reshape(b.shape[0], -1).sum(-1)
               for b in lab.round_distribution(pair, gamma, rule))
  np.testing.assert_allclose(masses, 1.0, atol=TOL, rtol=0)


@pytest.mark.parametrize("rule", lab.RULES)
def test_two_enumerations_agree(rule):
  pair = lab.make_markov_pair(2.0, 0.6, 5)
  for gamma, seq_len in ((1, 4), (2, 3), (3, 5), (4, 2)):
    np.testing.assert_allclose(
        lab.speculative_distribution(pair, gamma, seq_len, rule),
        lab_exact._hidden_state_distribution(pair, gamma, seq_len, rule),
        atol=TOL, rtol=0)


def test_negative_controls_fail_the_same_check():
  pair = lab.make_markov_pair()
  for gamma, seq_len in ((1, 1), (2, 3), (4, 4)):
    assert lab.exact_tv(pair, gamma, seq_len) <= TOL
    wrong = lab.exact_tv(pair, gamma, seq_len, "wrong_fallback")
    accept = lab.exact_tv(pair, gamma, seq_len, "always_accept")
    assert wrong > 1e-3, wrong
    assert accept > 1e-3, accept
  # Identical models leave nothing to detect: every rule is exact there.
  same = lab.make_markov_pair(draft_match=1.0)
  for rule in lab.RULES:
    assert lab.exact_tv(same, 3, 3, rule) <= TOL


def test_coupling_table_seed_000_example():
  table = lab.coupling_table(np.array([0.5, 0.3, 0.2]),
                             np.array([0.3, 0.1, 0.6]))
  np.testing.assert_allclose(table.output, [0.5, 0.3, 0.2], atol=TOL)
  np.testing.assert_allclose(table.reject_mass, 0.4, atol=TOL)
  np.testing.assert_allclose(table.rejected / 0.4, [0.5, 0.5, 0.0], atol=TOL)
  np.testing.assert_allclose(table.alpha, 0.6, atol=TOL)
  wrong = lab.coupling_table(np.array([0.5, 0.3, 0.2]),
                             np.array([0.3, 0.1, 0.6]), "wrong_fallback")
  assert lab.tv(wrong.output, [0.5, 0.3, 0.2]) > 0.05


@pytest.mark.parametrize("seed", range(5))
def test_alpha_is_one_minus_tv_and_residual_mass(seed):
  rng = np.random.default_rng(seed)
  p_xV = rng.dirichlet(np.full(8, 0.5), size=16)
  q_xV = rng.dirichlet(np.full(8, 0.5), size=16)
  q_xV[0] = p_xV[0]  # zero residual mass
  q_xV[1, :4] = 0  # draft proposes half the vocabulary only
  q_xV[1] /= q_xV[1].sum()
  table = lab.coupling_table(p_xV, q_xV)
  tv_x = 0.5 * np.abs(p_xV - q_xV).sum(-1)
  np.testing.assert_allclose(table.alpha, 1 - tv_x, atol=TOL, rtol=0)
  np.testing.assert_allclose(table.reject_mass,
                             np.maximum(p_xV - q_xV, 0).sum(-1), atol=TOL,
                             rtol=0)
  np.testing.assert_allclose(table.output, p_xV, atol=TOL, rtol=0)


def test_round_first_acceptance_is_alpha():
  pair = lab.make_markov_pair(3.0, 0.5, 11)
  first = lab.round_distribution(pair, 3)[0]
  np.testing.assert_allclose(1 - first.reshape(first.shape[0], -1).sum(-1),
                             lab.acceptance_rates(pair), atol=TOL, rtol=0)


def test_jax_coupling_sample_matches_lab_table():
  """specjax.coupling_sample against the lab; the wrong table must fail."""
  p_V = np.array([0.05, 0.3, 0.1, 0.2, 0.0, 0.15, 0.1, 0.1], np.float32)
  q_V = np.array([0.2, 0.1, 0.3, 0.05, 0.1, 0.05, 0.2, 0.0], np.float32)
  n = 200_000
  k_draft, k_couple = jax.random.split(jax.random.key(0))
  logits_V = np.where(q_V > 0, np.log(np.maximum(q_V, 1e-30)), -np.inf)
  draft = jax.random.categorical(k_draft, logits_V, shape=(n,))
  token, accepted = jax.jit(coupling.coupling_sample)(k_couple, p_V, q_V,
                                                     draft)
  counts = np.bincount(np.asarray(token), minlength=8)
  table = lab.coupling_table(p_V, q_V)
  support = table.output > 0
  assert counts[~support].sum() == 0
  pvalue = stats.chisquare(counts[support],
                           n * table.output[support] / table.output[
                               support].sum()).pvalue
  assert pvalue > 1e-4, pvalue
  wrong = lab.coupling_table(p_V, q_V, "wrong_fallback").output
  assert stats.chisquare(counts[support], n * wrong[support] / wrong[
      support].sum()).pvalue < 1e-6
  alpha_hat = float(np.mean(np.asarray(accepted)))
  assert abs(alpha_hat - float(table.alpha)) < 5 * np.sqrt(0.25 / n)


def test_trace_is_seeded_and_balanced():
  pair = lab.make_markov_pair()
  a = lab.run_trace(pair, 5, 0.1, 96, seed=3)
  b = lab.run_trace(pair, 5, 0.1, 96, seed=3)
  c = lab.run_trace(pair, 5, 0.1, 96, seed=4)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert (a.target_calls, a.draft_calls, a.accepted) == (
      b.target_calls, b.draft_calls, b.accepted)
  assert not np.array_equal(a.tokens, c.tokens)
  assert a.tokens.shape == (96,)
  assert a.draft_calls == 5 * a.target_calls
  emitted = round(a.tokens_per_target_call * a.target_calls)
  assert emitted == a.accepted + a.target_calls >= 96
  assert a.toy_speedup == pytest.approx(96 / (a.target_calls
                                              + 0.1 * a.draft_calls))
  assert np.isfinite(a.estimated_speedup) and a.estimated_speedup > 1


@pytest.mark.parametrize("num_tokens", [1, 2, 7, 50])
def test_trace_length_is_exact(num_tokens):
  pair = lab.make_markov_pair(1000.0, 0.0, 1)  # frequent rejections
  for gamma in (1, 3):
    assert len(lab.run_trace(pair, gamma, 0.5, num_tokens).tokens) == (
        num_tokens)


def _blocks():
  """A round of one token, uniform over V = 2, from each of the 3 contexts."""
  return [np.full((3, 2), 0.5)]


def test_chain_blocks_of_uniform_rounds_is_uniform():
  np.testing.assert_allclose(lab_exact.chain_blocks(_blocks(), 2, 2),
                             np.full((2, 2), 0.25))


@pytest.mark.parametrize("call,match", [
    (lambda: lab.make_markov_pair(certainty=-1.0), "certainty"),
    # 1e308 overflowed the softmax, and the error named target_trans_VxV.
    (lambda: lab.make_markov_pair(certainty=1e308), r"certainty must be in"),
    (lambda: lab.make_markov_pair(draft_match=2.0), "draft_match"),
    (lambda: lab.make_markov_pair(seed=-1), "seed"),
    (lambda: lab.speculative_distribution(lab.make_markov_pair(), 0, 2),
     "gamma"),
    (lambda: lab.speculative_distribution(lab.make_markov_pair(), 2, 0),
     "seq_len"),
    (lambda: lab.speculative_distribution(lab.make_markov_pair(), 2, 2, "x"),
     "rule"),
    (lambda: lab.speculative_distribution("pair", 2, 2), "pair"),
    (lambda: lab.run_trace(lab.make_markov_pair(), 2, -1.0), "draft_cost"),
    (lambda: lab.coupling_table(np.ones(3) / 3, np.ones(4) / 4), "vocabulary"),
    (lambda: lab.MarkovPair(np.ones(8), np.eye(8), np.ones(8) / 8, np.eye(8)),
     "target_init_V"),
    # Not laws: the "output" came back as a non-law ([1, 1] gave [.5, .5]).
    (lambda: lab.coupling_table(np.ones(2), np.ones(2) / 2),
     "every row of p must sum to 1"),
    (lambda: lab.coupling_table(np.ones((2, 3)) / 3, np.ones((3, 3)) / 3),
     "do not broadcast"),
    (lambda: lab_exact.tv([np.nan], [1.0]), "finite"),
    # chain_blocks read context -1 and V as the BOS row, truncated 2.7.
    (lambda: lab_exact.chain_blocks(_blocks(), 2, 2, context=-1), "context"),
    (lambda: lab_exact.chain_blocks(_blocks(), 2, 2, context=2), "context"),
    (lambda: lab_exact.chain_blocks(_blocks(), 2, 2, context=1.5), "context"),
    (lambda: lab_exact.chain_blocks(_blocks(), 2, 0), "seq_len"),
    (lambda: lab_exact.chain_blocks([], 2, 2), "blocks is empty"),
    (lambda: lab_exact.chain_blocks(_blocks(), 3, 2), "blocks.0. has shape"),
    (lambda: lab_exact.chain_blocks([2 * b for b in _blocks()], 2, 2),
     "total mass 1"),
])
def test_invalid_inputs_name_the_argument(call, match):
  with pytest.raises((TypeError, ValueError), match=match):
    call()


def _pair4():
  return lab.make_markov_pair(vocab_size=4)


def _stop4():
  return stopping.confidence_rule(_pair4(), 0.5)


def _signed_blocks():
  """Rows of -1 and 2: each context still totals 1, but it is no law."""
  block = np.full((3, 2), 0.5)
  block[0] = (-1.0, 2.0)
  return [block]


_NEVER = lambda i, context, drafts: False


@pytest.mark.parametrize("call,match", [
    # gamma_max past exact.round_distribution's cap enumerated 4**20 blocks
    # (a hang); 0, -1, True and 2.0 were read as a length or failed raw.
    (lambda: stopping.expected_draft_length(_pair4(), 20, _stop4(), 0),
     "gamma_max=20 is too large"),
    (lambda: stopping.round_distribution(_pair4(), 20, _NEVER), "gamma_max"),
    (lambda: stopping.expected_draft_length(_pair4(), 0, _stop4(), 0),
     "gamma_max"),
    (lambda: stopping.expected_draft_length(_pair4(), -1, _stop4(), 0),
     "gamma_max"),
    (lambda: stopping.expected_draft_length(_pair4(), True, _stop4(), 0),
     "gamma_max"),
    (lambda: stopping.expected_draft_length(_pair4(), 2.0, _stop4(), 0),
     "gamma_max"),
    # -1 read the BOS row; 5 (V = 4) and 1.5 raised a raw IndexError.
    (lambda: stopping.expected_draft_length(_pair4(), 2, _stop4(), -1),
     "context"),
    (lambda: stopping.expected_draft_length(_pair4(), 2, _stop4(), 5),
     "context"),
    (lambda: stopping.expected_draft_length(_pair4(), 2, _stop4(), 1.5),
     "context"),
    # AttributeError on None.
    (lambda: stopping.exact_tv(None, 2, _NEVER, 3), "pair"),
    (lambda: stopping.confidence_rule(None, 0.5), "pair"),
    (lambda: stopping.peeking_rule(None, 0.5), "pair"),
    (lambda: stopping.expected_draft_length(None, 2, _NEVER, 0), "pair"),
    # ahead = -3 raised IndexError mid-enumeration, 1.5 a raw TypeError.
    (lambda: stopping.peeking_rule(_pair4(), 0.3, ahead=-3), "ahead"),
    (lambda: stopping.peeking_rule(_pair4(), 0.3, ahead=1.5), "ahead"),
    # A bad threshold failed only when the rule first ran.
    (lambda: stopping.confidence_rule(_pair4(), "0.5"), "threshold"),
    (lambda: stopping.confidence_rule(_pair4(), True), "threshold"),
    (lambda: stopping.confidence_rule(_pair4(), float("nan")), "threshold"),
    (lambda: stopping.confidence_rule(_pair4(), 50), "threshold"),
    (lambda: stopping.peeking_rule(_pair4(), -0.1), "threshold"),
    (lambda: stopping.exact_tv(_pair4(), 2, "stop", 3), "stop"),
    (lambda: stopping.expected_draft_length(_pair4(), 2, None, 0), "stop"),
    (lambda: stopping.exact_tv(_pair4(), 2, _NEVER, 3, probe=True), "probe"),
    # Totals alone passed these, and the chained "law" had a minimum of -2.
    (lambda: lab_exact.chain_blocks(_signed_blocks(), 2, 2), "blocks.0."),
    (lambda: lab_exact.chain_blocks([np.full((3, 2), np.nan)], 2, 2),
     "blocks.0. holds NaN"),
    (lambda: lab_exact.chain_blocks(np.full((3, 2), 0.5), 2, 2),
     "blocks must be a list"),
    # process_law ran the gamma = 3 law while claiming gamma = 1.
    (lambda: lab.process_law(_pair4(), 1, 2,
                             blocks=lab.round_law(_pair4(), 3)[0]),
     "blocks do not match gamma=1"),
    (lambda: lab.process_law(_pair4(), 1, 2,
                             blocks=lab.round_law(lab.make_markov_pair(
                                 vocab_size=3), 1)[0]),
     "blocks do not match gamma=1 over V=4"),
    (lambda: lab.process_law(_pair4(), 1, 2, blocks=lab.round_law(_pair4(),
                                                                  1)),
     "blocks must be the first item"),
    # target_law read -1 as the BOS row and truncated 2.7 to 2.
    (lambda: lab_verifiers.target_law(_pair4(), 1, context=-1), "context"),
    (lambda: lab_verifiers.target_law(_pair4(), 1, context=4), "context"),
    (lambda: lab_verifiers.target_law(_pair4(), 1, context=2.7), "context"),
    (lambda: lab_verifiers.target_law(None, 1), "pair"),
    (lambda: lab.process_law(_pair4(), 1, 2, context=-1), "context"),
    # An empty vocabulary gave an empty table with alpha = 0.
    (lambda: lab.coupling_table(np.zeros(0), np.zeros(0)), "vocabulary"),
])
def test_lab_bad_inputs_are_refused(call, match):
  with pytest.raises((TypeError, ValueError), match=match):
    call()


def test_lab_edge_inputs_still_work():
  """The bounds the checks keep: context V (BOS), ahead = 0 (reads x_i),
  reused blocks of the same gamma, float64 rounding below zero."""
  pair = _pair4()
  stop = stopping.confidence_rule(pair, 0.5)
  assert 0 < stopping.expected_draft_length(pair, 2, stop, pair.bos) <= 2
  assert stopping.exact_tv(pair, 2, stopping.peeking_rule(pair, 0.3, 0),
                           3) <= TOL
  blocks, _ = lab.round_law(pair, 2)
  np.testing.assert_allclose(lab.process_law(pair, 2, 3, blocks=blocks),
                             lab.process_law(pair, 2, 3), atol=TOL, rtol=0)
  np.testing.assert_allclose(
      lab_verifiers.target_law(pair, 2, np.int64(3)),
      lab_verifiers.target_law(pair, 2, 3), atol=0, rtol=0)
  rounding = _blocks()
  rounding[0][2] = (-1e-17, 1.0 + 1e-17)  # the BOS row
  np.testing.assert_array_equal(lab_exact.chain_blocks(rounding, 2, 1),
                                rounding[0][2])


@pytest.mark.full
def test_audit_passes():
  from specjax.lab import audit  # pylint: disable=g-import-not-at-top
  result = audit.run_audit()
  failed = [c for c in result.checks if not c.passed]
  assert not failed, failed
  assert len(result.checks) >= 20
  assert result.num_settings >= 1000
  assert result.worst_tv <= TOL
  assert result.wrong_fallback_tv > 1e-3
  text = audit.report(result)
  assert text.splitlines()[0] == (
      f"specjax rejection-sampling lab audit: {len(result.checks)} checks")
  assert "ALL PASS" in text.splitlines()[-1]


@pytest.mark.full
def test_audit_on_sharp_rows_fails_only_where_controls_vanish():
  """On sharp rows the wrong fallback's true TV shrinks (the residual nears
  p), yet it stays far above the exact checks' rounding floor: the audit
  passes. Where it reaches that floor the fallback cannot be tested, and the
  audit says so."""
  from specjax.lab import audit  # pylint: disable=g-import-not-at-top
  fast = dict(grid_seeds=1, min_grid_settings=1)
  sharp = audit.run_audit(certainty=8.0, draft_match=0.9, **fast)
  assert sharp.ok, [c for c in sharp.checks if not c.passed]
  assert 1e3 * TOL < sharp.wrong_fallback_tv < 1e-3
  one_hot = audit.run_audit(certainty=50.0, **fast)
  assert "wrong_fallback_tv_default" in [c.name for c in one_hot.checks
                                         if not c.passed]
