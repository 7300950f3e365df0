"""Exact (float64) laws of every chain verifier on the lab's Markov pairs.

`specjax.lab.exact` enumerates the speculative process for token
verification; this module does the same for the chain verifiers the decoder
registers (`specjax.decode.verifiers`): token, block (Sun et al. 2025), the
lossy baselines lenient:l and typical:eps,delta, and the negative controls.
It is a second, numpy implementation written from the algorithms'
definitions, not from the JAX code: it reads a verifier's spec string (its
own parse, `LAWS`), never the decoder's registry, and it never assumes
exactness: the TV to the target is computed, and must come out ~1e-16 for
exact verifiers.

One round from context c, literally:

  1. every draft block x_1..x_G has probability q(x_1|c) q(x_2|x_1) ...;
  2. given the block, the verifier's law of tau (drafts kept) and of the
     token emitted after them (residual, correction or bonus) is written out
     in closed form from its definition (`_token_like` / `_block` below);
  3. summing out the drafts after x_tau gives P(round emits x_1..x_k, y | c).

`process_law` then chains rounds over committed prefixes (the pair is
first-order Markov, so a round depends on the prefix through its last token)
and truncates at N tokens, exactly as `specjax.lab.speculative_distribution`
does for the token rule.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from specjax import _checks
from specjax.lab import controls
from specjax.lab import exact
from specjax.lab import markov

# V ** G draft blocks per context, each with [G + 1, V] laws: cap the work.
_MAX_BLOCKS = 2 ** 16

# pylint: disable-next=protected-access
_check_context = exact._check_context  # context None (BOS) or a token


def _safe_ratio(num, den):
  """min(1, num / den) without dividing where num >= den; num = den = 0 -> 0
  (a draft of q = 0 and p = 0 is refused, the coupling's u q < p)."""
  over = num >= den
  return np.where(over, (num > 0).astype(np.float64),
                  num / np.where(over, 1.0, den))


def _normalise_or(excess, fallback):
  mass = excess.sum(-1, keepdims=True)
  return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), fallback)


def _residual(p, q):
  return _normalise_or(np.maximum(p - q, 0.0), p)


def _entropy(p):
  return -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=-1)


@dataclasses.dataclass(frozen=True)
class Law:
  """A chain verifier as the lab knows it: its spec's name and numbers, and
  whether its definition claims the target's law (`exact`)."""
  name: str
  args: tuple[float, ...] = ()

  @property
  def spec(self) -> str:
    return self.name + (":" + ",".join(f"{a:g}" for a in self.args)
                        if self.args else "")

  @property
  def exact(self) -> bool:
    return self.name in ("token", "block")


# name -> (number of arguments, example spec)
LAWS = {"token": (0, "token"), "block": (0, "block"),
        "lenient": (1, "lenient:0.5"), "typical": (2, "typical:0.09,0.3"),
        **{name: (0, name) for name in controls.NAMES}}


def parse(verifier) -> Law:
  """The `Law` of a verifier spec ("block", "lenient:0.5") or of a
  `Verifier` handed in (read through its public `spec`)."""
  spec = verifier if isinstance(verifier, str) else getattr(
      verifier, "spec", None)
  if not isinstance(spec, str):
    raise TypeError(f"verifier must be a spec string such as 'block' or a "
                    f"specjax Verifier, got {type(verifier).__name__}.")
  name, _, rest = spec.strip().partition(":")
  if name not in LAWS:
    raise ValueError(f"the lab has no law for verifier {spec!r}; it knows "
                     f"{tuple(LAWS)} (add one to specjax.lab.verifiers).")
  count, example = LAWS[name]
  args = [a.strip() for a in rest.split(",")] if rest.strip() else []
  try:
    numbers = tuple(float(a) for a in args)
  except ValueError:
    numbers = ()
  if len(numbers) != count or len(args) != count:
    raise ValueError(f"verifier {spec!r}: {name} takes {count} number(s), "
                     f"e.g. {example!r}.")
  return Law(name, numbers)


def _token_like(accept_xG, corr_xGxV, bonus_xV):
  """tau law and corrections for rules that judge drafts one at a time.

  accept_xG[..., i]: P(keep draft i+1 | reached it). Returns
  (tau_xG1, corr_xG1xV): P(tau = k) = a_1..a_k (1 - a_{k+1}), and the law of
  the emitted token after k kept drafts.
  """
  gamma = accept_xG.shape[-1]
  kept = np.concatenate([np.ones(accept_xG.shape[:-1] + (1,)),
                         np.cumprod(accept_xG, axis=-1)], axis=-1)
  stop = np.concatenate([1.0 - accept_xG,
                         np.ones(accept_xG.shape[:-1] + (1,))], axis=-1)
  tau = kept * stop
  corr = np.concatenate([corr_xGxV[..., :gamma, :], bonus_xV[..., None, :]],
                        axis=-2)
  return tau, corr


def _block(p_xG1xV, q_xGxV, p_at_xG, q_at_xG):
  """Sun et al.'s Algorithm 2, as a law over tau and the emitted token."""
  gamma = q_at_xG.shape[-1]
  w = np.ones(p_at_xG.shape[:-1])
  weights = [w]
  for i in range(gamma):
    w = _safe_ratio(w * p_at_xG[..., i], q_at_xG[..., i])
    weights.append(w)
  w_xG1 = np.stack(weights, axis=-1)  # w_0..w_G
  h = []
  for i in range(1, gamma):
    excess = np.maximum(w_xG1[..., i, None] * p_xG1xV[..., i, :]
                        - q_xGxV[..., i, :], 0.0).sum(-1)
    denom = excess + 1.0 - w_xG1[..., i]
    h.append(np.where(denom > 0, excess / np.where(denom > 0, denom, 1.0),
                      0.0))
  h.append(w_xG1[..., gamma])
  h_xG1 = np.stack([np.ones_like(w)] + h, axis=-1)  # h_0 = 1: tau >= 0
  # tau = the LAST i whose eta_i < h_i (independent etas).
  later_fail = np.ones_like(h_xG1)
  for k in range(gamma - 1, -1, -1):
    later_fail[..., k] = later_fail[..., k + 1] * (1.0 - h_xG1[..., k + 1])
  tau = h_xG1 * later_fail
  corr = [_normalise_or(np.maximum(w_xG1[..., k, None] * p_xG1xV[..., k, :]
                                   - q_xGxV[..., k, :], 0.0),
                        p_xG1xV[..., k, :]) for k in range(gamma)]
  corr.append(p_xG1xV[..., gamma, :])
  return tau, np.stack(corr, axis=-2)


def verifier_law(verifier, p_xG1xV, q_xGxV, drafts_xG):
  """The law of one round's verdict for given drafts, float64.

  Args:
    verifier: a spec string or a `Verifier` (token, block, lenient,
      typical, wrong_fallback, always_accept).
    p_xG1xV: target laws at the G + 1 positions; q_xGxV: draft laws at G.
    drafts_xG: int, the drafted tokens.

  Returns:
    (tau_xG1, corr_xG1xV): P(tau = k drafts kept) and the law of the token
    emitted after them (k = G: the bonus).
  """
  v = parse(verifier)
  gamma = drafts_xG.shape[-1]
  p_xGxV = p_xG1xV[..., :gamma, :]
  take = lambda probs: np.take_along_axis(probs, drafts_xG[..., None],
                                          -1)[..., 0]
  p_at, q_at = take(p_xGxV), take(q_xGxV)
  bonus = p_xG1xV[..., gamma, :]
  if v.name == "block":
    return _block(p_xG1xV, q_xGxV, p_at, q_at)
  if v.name == "token":
    return _token_like(_safe_ratio(p_at, q_at), _residual(p_xGxV, q_xGxV),
                       bonus)
  if v.name == "lenient":
    return _token_like(_safe_ratio(p_at, v.args[0] * q_at),
                       _residual(p_xGxV, q_xGxV), bonus)
  if v.name == "typical":
    epsilon, delta = v.args
    thr = np.minimum(epsilon, delta * np.exp(-_entropy(p_xGxV)))
    return _token_like((p_at > thr).astype(np.float64), p_xGxV, bonus)
  accept, fallback = controls.rule_tables(v.name, p_xGxV,
                                          _safe_ratio(p_at, q_at))
  return _token_like(accept, fallback, bonus)


def _check(pair, gamma):
  pair = exact._check_pair(pair)  # pylint: disable=protected-access
  gamma = _checks.check_int("gamma", gamma, low=1)
  if pair.vocab_size ** gamma > _MAX_BLOCKS:
    raise ValueError(f"gamma={gamma} gives {pair.vocab_size}**{gamma} draft "
                     f"blocks, more than the {_MAX_BLOCKS} the lab enumerates.")
  return pair, gamma


def _check_blocks(blocks, gamma: int, vocab: int) -> None:
  """Refuses `blocks` that are not one round's law at this gamma and V: the
  chain would otherwise run the law they hold while claiming `gamma`."""
  # round_law returns (blocks, expected_tokens_C); a block is never 1-D.
  if (isinstance(blocks, tuple) and len(blocks) == 2
      and isinstance(blocks[0], list) and np.ndim(blocks[1]) == 1):
    raise TypeError("blocks must be the first item of round_law's (blocks, "
                    "expected_tokens_C), not the pair: pass "
                    "blocks=round_law(pair, gamma, verifier)[0].")
  if not isinstance(blocks, (list, tuple)):
    raise TypeError("blocks must be the list round_law(pair, gamma, "
                    f"verifier)[0], got {type(blocks).__name__}.")
  shapes = []
  for block in blocks:
    try:
      shapes.append(tuple(np.shape(block)))
    except ValueError:  # a ragged nest of lists has no shape
      shapes.append(None)
  want = [(vocab + 1,) + (vocab,) * k for k in range(1, gamma + 2)]
  if shapes != want:
    raise ValueError(f"blocks do not match gamma={gamma} over V={vocab}: a "
                     f"round law has gamma + 1 = {gamma + 1} blocks of shapes "
                     f"{want}, got {len(blocks)} of shapes {shapes}. Pass "
                     f"round_law(pair, {gamma}, verifier)[0], or blocks=None.")


def round_law(pair: markov.MarkovPair, gamma: int, verifier="token"):
  """Exact law of the tokens one round emits, for every context.

  Returns:
    (blocks, expected_tokens_C): `blocks[k]` has shape `[C] + [V] * (k + 1)`
    (C = V + 1 contexts, BOS last) and holds P(the round keeps k drafts
    x_1..x_k and then emits y | context); `expected_tokens_C[c]` is the
    expected number of tokens the round emits, E[tau + 1 | c].
  """
  pair, gamma = _check(pair, gamma)
  vocab, num_ctx = pair.vocab_size, pair.vocab_size + 1
  p_CxV, q_CxV = pair.target_rows_CxV, pair.draft_rows_CxV
  drafts_NxG = np.array(list(itertools.product(range(vocab), repeat=gamma)),
                        np.int64)
  num = drafts_NxG.shape[0]
  # Context of position i: c for i = 0, x_i after.
  ctx_CxNxG1 = np.concatenate(
      [np.broadcast_to(np.arange(num_ctx)[:, None, None], (num_ctx, num, 1)),
       np.broadcast_to(drafts_NxG[None], (num_ctx, num, gamma))], axis=-1)
  p_CxNxG1xV = p_CxV[ctx_CxNxG1]
  q_CxNxGxV = q_CxV[ctx_CxNxG1[..., :gamma]]
  x_CxNxG = np.broadcast_to(drafts_NxG[None], (num_ctx, num, gamma))
  draft_prob_CxN = np.prod(np.take_along_axis(
      q_CxNxGxV, x_CxNxG[..., None], -1)[..., 0], axis=-1)
  tau_CxNxG1, corr_CxNxG1xV = verifier_law(verifier, p_CxNxG1xV, q_CxNxGxV,
                                           x_CxNxG)
  joint_CxNxG1 = draft_prob_CxN[..., None] * tau_CxNxG1
  blocks = []
  for k in range(gamma + 1):
    mass = (joint_CxNxG1[..., k, None] * corr_CxNxG1xV[..., k, :])
    mass = mass.reshape((num_ctx,) + (vocab,) * gamma + (vocab,))
    # Sum out the drafts after x_k (drawn, then thrown away).
    mass = mass.sum(axis=tuple(range(k + 1, gamma + 1)))
    blocks.append(mass)
  expected = (joint_CxNxG1 * np.arange(1, gamma + 2)).sum(axis=(1, 2))
  return blocks, expected


def process_law(pair: markov.MarkovPair, gamma: int, seq_len: int,
                verifier="token", context: int | None = None, blocks=None):
  """Exact law of the first `seq_len` tokens of the whole process.

  Args:
    pair, gamma, verifier: as `round_law` (pass its `blocks` to reuse them).
    seq_len: N; rounds run until N tokens are committed, then truncate.
    context: the token the text so far ends with (a prompt's last token), or
      None for the start of a sequence (the BOS row).
    blocks: None, or `round_law(pair, gamma, verifier)[0]` computed before;
      blocks of another gamma or vocabulary are refused.

  Returns:
    float64 `[V] * seq_len`; equal to `target_law(pair, seq_len, context)`
    up to rounding iff the verifier is exact.
  """
  pair, gamma = _check(pair, gamma)
  vocab = pair.vocab_size
  seq_len = exact._check_seq_len(seq_len, vocab)
  start = _check_context(context, vocab)
  if blocks is None:
    blocks, _ = round_law(pair, gamma, verifier)
  else:
    _check_blocks(blocks, gamma, vocab)
  return exact.chain_blocks(blocks, vocab, seq_len,
                            None if start == vocab else start)


def target_law(pair: markov.MarkovPair, seq_len: int,
               context: int | None = None) -> np.ndarray:
  """The target's own law of N tokens after `context` (None: BOS).

  context: a token id in [0, V - 1] or None, as `process_law`; a -1, V or
  non-int is refused (not read as the BOS row, or truncated).
  """
  pair = exact._check_pair(pair)  # pylint: disable=protected-access
  vocab = pair.vocab_size
  seq_len = exact._check_seq_len(seq_len, vocab)
  probs = pair.target_rows_CxV[_check_context(context, vocab)]
  for _ in range(seq_len - 1):
    probs = (probs.reshape(-1, vocab)[:, :, None]
             * pair.target_trans_VxV[None]).reshape(-1)
  return probs.reshape((vocab,) * seq_len)


def verifier_tv(pair: markov.MarkovPair, gamma: int, seq_len: int,
                verifier="token", context: int | None = None) -> float:
  """Exact TV between the process's N-token law and the target's."""
  return exact.tv(process_law(pair, gamma, seq_len, verifier, context),
                  target_law(pair, seq_len, context))


def position_tv(pair: markov.MarkovPair, verifier="token") -> np.ndarray:
  """TV(law of a judged position's token, p), float64 `[C]` per context.

  The law of the token a round emits first (its first position is always
  judged), from this module's own enumeration (`round_law` at gamma = 1):
  the reference for `specjax.harness.distortion.position_law`'s closed forms.
  """
  blocks, _ = round_law(pair, 1, verifier)
  first_CxV = blocks[0] + blocks[1].sum(-1)
  return 0.5 * np.abs(first_CxV - pair.target_rows_CxV).sum(-1)


def expected_position_tv(pair: markov.MarkovPair, gamma: int, seq_len: int,
                         verifier="token", context: int | None = None
                         ) -> float:
  """E[(1/N) sum_t d_t] over the verifier's own N-token process, exactly.

  d_t = `position_tv` at the context of token t (the token before it, or
  `context` for the first): what `specjax.harness.distortion.per_token_tv`
  estimates from samples, computed from the marginals of `process_law`.
  """
  d_C = position_tv(pair, verifier)
  vocab = pair.vocab_size
  law = process_law(pair, gamma, seq_len, verifier, context)
  total = d_C[_check_context(context, vocab)]
  for t in range(1, seq_len):
    marginal_V = law.sum(axis=tuple(a for a in range(seq_len) if a != t - 1))
    total += float(marginal_V @ d_C[:vocab])
  return float(total / seq_len)


def constant_pair(p_V, q_V) -> markov.MarkovPair:
  """A context-independent pair: every row of target / draft is p / q."""
  p_V = np.asarray(p_V, np.float64)
  q_V = np.asarray(q_V, np.float64)
  vocab = p_V.shape[-1]
  return markov.MarkovPair(p_V, np.tile(p_V, (vocab, 1)), q_V,
                           np.tile(q_V, (vocab, 1)))


def paper_example():
  """Sun et al.'s motivating example: V = {a, b}, p = (1/3, 2/3),
  q = (2/3, 1/3), gamma = 2. Expected drafts kept per round: 10/9 with token
  verification, 11/9 with block verification."""
  return constant_pair([1 / 3, 2 / 3], [2 / 3, 1 / 3]), 2


def expected_accepted(pair: markov.MarkovPair, gamma: int,
                      verifier="token") -> np.ndarray:
  """E[drafts kept per round | context], float64 `[C]` (BOS last)."""
  _, expected = round_law(pair, gamma, verifier)
  return expected - 1.0


GRID_CERTAINTY = (0.0, 0.5, 1.5, 3.0, 8.0, 1000.0)  # 1000: exact zeros
GRID_DRAFT_MATCH = (0.0, 0.25, 0.5, 0.8, 0.95, 1.0)  # 1: zero residual mass
GRID_GAMMA = (1, 2, 3, 4)
GRID_SEQ_LEN = (2, 3, 5)


def audit_grid(verifiers=("token", "block"), num_seeds: int = 3,
               certainties=GRID_CERTAINTY, draft_matches=GRID_DRAFT_MATCH,
               gammas=GRID_GAMMA, seq_lens=GRID_SEQ_LEN) -> list[dict]:
  """Exact TV and expected tokens per round for every verifier and setting.

  A setting is (certainty, draft_match, seed, gamma, seq_len); the default
  grid has 6 * 6 * 3 * 4 * 3 = 1,296. Returns one dict per (setting,
  verifier): the keys above plus "verifier", "exact" (the verifier's label),
  "tv" (exact TV of the N-token law to the target's, from BOS), and
  "tokens_per_round" (float64 `[C]`, E[tau + 1 | context]).
  """
  records = []
  for certainty, match, seed in itertools.product(certainties, draft_matches,
                                                  range(num_seeds)):
    pair = markov.make_markov_pair(certainty, match, seed)
    for gamma in gammas:
      for spec in verifiers:
        v = parse(spec)
        blocks, expected = round_law(pair, gamma, v)
        for seq_len in seq_lens:
          law = process_law(pair, gamma, seq_len, v, blocks=blocks)
          records.append(dict(
              certainty=certainty, draft_match=match, seed=seed, gamma=gamma,
              seq_len=seq_len, verifier=v.spec, exact=v.exact,
              tv=exact.tv(law, target_law(pair, seq_len)),
              tokens_per_round=expected))
  return records
