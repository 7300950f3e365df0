"""Multi-draft and traversal verification in the lab (specjax.lab.multidraft):
every verifier's exact law is the target's, every negative control is
caught, and each acceptance stands where the theory puts it against the
transport optimum."""

import math

import numpy as np
import pytest

from specjax import lab
from specjax.decode import tree as tree_lib
from specjax.lab import multidraft as md
from specjax.lab import trees as lt
from specjax.lab import verifiers as lv

TOL = 1e-12      # an exact law's TV to the target (float64 rounding)
LP_TOL = 1e-9    # an LP optimum against its dual or closed form
CONTROL_MIN = 1e-6  # a negative control's TV must be clearly above this
KS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def one_step():
  """Every verifier and its control on the 19 lab settings x k = 1..4."""
  return md.one_step_table(md.lab_settings(), KS)


@pytest.fixture(scope="module")
def tree_rows():
  """Traversal and token-level trees on 6 Markov pairs x 8 trees x 2 modes."""
  return md.tree_table()


def _fraction_rows(one_step):
  for row in one_step:
    for name, result in row["verifiers"].items():
      yield row, name, result


# ------------------------------------------------------------ exactness --


def test_every_verifier_emits_the_target_law(one_step):
  assert len(one_step) == 19 * len(KS)
  worst = max(r["tv"] for _, _, r in _fraction_rows(one_step))
  assert worst <= TOL, worst


def test_negative_controls_are_caught(one_step):
  # Every control is wrong only where its mistake has mass to move: K-SEQ's
  # residual, the canonical scheme's q_Z and greedy's residual outside T
  # are right at k = 1 (one draft: k-draft mass = one draft's, q_Z = q, T is
  # empty), and on the adversarial settings a control can be exact (q = p
  # never rejects, disjoint supports never accept). On the random settings
  # at k >= 2 each one must miss p clearly.
  caught = {}
  for row, name, result in _fraction_rows(one_step):
    if row["kind"] == "random" and row["k"] >= 2:
      caught[name] = min(caught.get(name, 1.0), result["control_tv"])
  assert set(caught) == set(md.VERIFIERS)
  assert all(tv > CONTROL_MIN for tv in caught.values()), caught
  # The residual controls of recursive rejection sampling (and traversal's)
  # are wrong at k = 1 too: a rejection draws from p, not (p - q)+.
  for row, name, result in _fraction_rows(one_step):
    if (row["kind"] == "random" and row["k"] == 1
        and name in ("specinfer", "rsd", "traversal", "traversal_wor")):
      assert result["control_tv"] > CONTROL_MIN, (row["setting"], name)


def test_traversal_and_token_trees_emit_the_target_sequence_law(tree_rows):
  assert len(tree_rows) == 6 * 8 * 2
  for row in tree_rows:
    assert row["tv_traversal"] <= TOL, row
    assert row["tv_token"] <= TOL, row


def test_traversal_control_is_caught_where_the_draft_differs(tree_rows):
  # Uniform rows (certainty 0), one-hot rows (1000) and draft == target
  # (draft_match 1) never reject in a way the final residual could fix.
  biting = [r for r in tree_rows
            if r["certainty"] not in (0.0, 1000.0) and r["draft_match"] < 1]
  assert len(biting) == 3 * 8 * 2
  worst = min(r["tv_control"] for r in biting)
  assert worst > CONTROL_MIN, worst


def test_traversal_on_deeper_trees_over_more_sequence_lengths():
  pair = lab.make_markov_pair(1.5, 0.5, 7)
  for branching in ((2, 1), (2, 2), (3, 1, 1)):
    for mode in ("iid", "wor"):
      blocks, expected = md.traversal_round_law(pair, branching, mode)
      masses = sum(b.reshape(b.shape[0], -1).sum(-1) for b in blocks)
      np.testing.assert_allclose(masses, 1.0, atol=TOL, rtol=0)
      assert np.all(expected >= 1) and np.all(expected <= len(branching) + 1)
      for seq_len in (1, 2, 4):
        for context in (None, 3):
          law = md.traversal_process_law(pair, branching, seq_len, mode,
                                         context, blocks=blocks)
          assert lab.tv(law, lv.target_law(pair, seq_len, context)) <= TOL
      control = md.traversal_process_law(pair, branching, 3, mode,
                                         control="no_final_residual")
      assert lab.tv(control, lv.target_law(pair, 3)) > CONTROL_MIN


# ------------------------------------------------------------- optimum --


def test_lp_optimum_equals_its_dual_and_closed_forms(one_step):
  for row in one_step:
    for scheme in md.SCHEMES:
      assert abs(row["optimum"][scheme] - row["dual"][scheme]) <= LP_TOL, (
          row["setting"], row["k"], scheme)


def test_the_sorted_subsets_reach_the_dual_minimum():
  # Hu et al.'s fast route (the V + 1 sets of largest p/q) against all 2^V.
  for setting in md.lab_settings():
    for k in (2, 3):
      for scheme in ("iid", "wor"):
        full = md.dual_acceptance(setting.p_V, setting.q_V, k, scheme)
        fast = md.dual_acceptance(setting.p_V, setting.q_V, k, scheme,
                                  subsets="sorted")
        assert abs(full - fast) <= 1e-14, (setting.name, k, scheme)


def test_one_draft_optimum_is_one_minus_tv(one_step):
  for row in one_step:
    if row["k"] == 1:
      setting = next(s for s in md.lab_settings() if s.name == row["setting"])
      one_minus_tv = np.minimum(setting.p_V, setting.q_V).sum()
      for scheme in md.SCHEMES:
        assert abs(row["optimum"][scheme] - one_minus_tv) <= LP_TOL


def test_drafting_without_replacement_never_loses_to_iid(one_step):
  for row in one_step:
    assert row["optimum"]["wor"] >= row["optimum"]["iid"] - LP_TOL, row
  # ... and gains where q piles up on a few tokens.
  gains = [r["optimum"]["wor"] - r["optimum"]["iid"] for r in one_step
           if r["kind"] == "random" and r["k"] >= 2]
  assert min(gains) >= -LP_TOL and max(gains) > 0.01


def test_no_exact_verifier_beats_the_optimum_of_its_drafts(one_step):
  # Checks the LP as much as the verifiers: an optimum below an exact
  # verifier's acceptance would be wrong.
  for row, name, result in _fraction_rows(one_step):
    optimum = row["optimum"][result["scheme"]]
    assert result["acceptance"] <= optimum + LP_TOL, (row["setting"], name)


def test_kseq_reaches_one_minus_one_over_e_of_the_iid_optimum(one_step):
  bound = 1.0 - 1.0 / math.e
  for row in one_step:
    kseq = row["verifiers"]["kseq"]["acceptance"]
    assert kseq >= bound * row["optimum"]["iid"] - LP_TOL, row["setting"]


def test_kseq_rho_solves_its_equation():
  for setting in md.lab_settings()[:12]:
    p_V, q_V = setting.p_V, setting.q_V
    for k in (2, 3, 4):
      rho = md.kseq_rho(p_V, q_V, k)
      beta = np.minimum(q_V, p_V / rho).sum()
      assert 1.0 <= rho <= k
      assert abs(1 - (1 - beta) ** k - rho * beta) <= 1e-12


def test_greedy_and_lp_selection_reach_their_optimum(one_step):
  for row in one_step:
    greedy = row["verifiers"]["greedy"]["acceptance"]
    assert abs(greedy - row["optimum"]["greedy"]) <= LP_TOL, row["setting"]
    # Khisti et al.: selection + single-draft speculation can reach alpha*.
    canonical = row["verifiers"]["canonical_lp"]["acceptance"]
    assert abs(canonical - row["optimum"]["iid"]) <= LP_TOL, row["setting"]


# ---------------------------------------------- traversal vs token trees --


def test_depth_one_traversal_is_recursive_rejection_sampling(one_step):
  for row in one_step:
    v = row["verifiers"]
    assert abs(v["traversal"]["acceptance"]
               - v["specinfer"]["acceptance"]) <= TOL
    assert abs(v["traversal_wor"]["acceptance"]
               - v["rsd"]["acceptance"]) <= TOL
  pair = lab.make_markov_pair(1.5, 0.5, 0)
  for k in (2, 3):
    for mode in ("iid", "wor"):
      blocks, _ = md.traversal_round_law(pair, (k,), mode)
      token_blocks, _ = lt.tree_round_law(
          pair, tree_lib.TreeTopology.from_branching((k,)), mode)
      for a, b in zip(blocks, token_blocks):
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


def test_traversal_keeps_at_least_as_many_as_token_trees(tree_rows):
  # Per context: E[drafts kept] of traversal >= token-level tree
  # verification on the same tree and drafting mode, in every setting.
  for row in tree_rows:
    assert row["traversal_minus_token_min"] >= -TOL, row
  # ... strictly more somewhere on every multi-level tree.
  by_tree = {}
  for row in tree_rows:
    gain = row["accepted_mean"]["traversal"] - row["accepted_mean"]["token"]
    by_tree[row["tree"]] = max(by_tree.get(row["tree"], 0.0), gain)
  assert all(gain > 1e-3 for gain in by_tree.values()), by_tree


def test_on_a_chain_traversal_is_block_verification(tree_rows):
  # The relation found: on a chain (one child per level) Traversal
  # Verification's round law EQUALS block verification's (Sun et al.),
  # token for token (not only in expectation): its leaf-to-root pass keeps
  # depth i with the probability h_i block verification uses, and a kept
  # node's final token is block verification's correction. So traversal >=
  # token verification on chains is block >= token.
  chains = [r for r in tree_rows if "block_max_diff" in r]
  assert len(chains) == 6 * 2 * 2
  assert max(r["block_max_diff"] for r in chains) <= TOL


# -------------------------------------------------------------- inputs --


def test_inputs_are_checked():
  p_V, q_V = md.lab_settings()[0].p_V, md.lab_settings()[0].q_V
  with pytest.raises(ValueError, match="p must sum to 1"):
    md.specinfer_law(p_V * 2, q_V, 2)
  with pytest.raises(ValueError, match="share the vocabulary"):
    md.kseq_law(p_V, np.ones(4) / 4, 2)
  with pytest.raises(ValueError, match="q must be finite"):
    md.rsd_law(p_V, np.full(8, np.nan), 2)
  with pytest.raises(TypeError, match="k must be"):
    md.optimal_acceptance(p_V, q_V, 2.0)
  with pytest.raises(ValueError, match="k must be >= 1"):
    md.greedy_law(p_V, q_V, 0)
  with pytest.raises(ValueError, match="scheme must be one of"):
    md.optimal_acceptance(p_V, q_V, 2, "topk")
  with pytest.raises(ValueError, match="control must be None"):
    md.kseq_law(p_V, q_V, 2, control="skip_residual")
  with pytest.raises(ValueError, match="selection must be one of"):
    md.canonical_law(p_V, q_V, 2, selection="best")
  with pytest.raises(ValueError, match="verifier must be one of"):
    md.one_step_law("tree", p_V, q_V, 2)
  with pytest.raises(ValueError, match="k=9 drafts wor"):
    md.draft_law(q_V, 9, "wor")
  with pytest.raises(TypeError, match="topology must be"):
    md.traversal_round_law(lab.make_markov_pair(), "2,1")


def test_draft_laws_are_laws():
  for setting in md.lab_settings():
    for scheme in md.SCHEMES:
      for k in (1, 3):
        drafts, prob = md.draft_law(setting.q_V, k, scheme)
        assert drafts.shape == (len(prob), k)
        assert abs(prob.sum() - 1) <= TOL and np.all(prob > 0)
        if scheme != "iid":  # distinct tokens, empties only at the end
          for row in drafts:
            kept = row[row >= 0]
            assert len(set(kept)) == len(kept)
            assert np.all(row[len(kept):] == -1)
