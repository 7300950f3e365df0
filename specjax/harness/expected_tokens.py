r"""Expected tokens per round of several verifiers, judged on the same drafts.

Counting tokens per target call in a decode measures a verifier's gain with
the noise of every accept/reject draw, and two verifiers decoded separately
add their noises, enough to hide a gain of a few percent. This module
removes both noises.

At a round start (a context c), the verifier keeps tau drafts and the round
emits tau + 1 tokens. Given the drafted block x_1..x_G and the laws p and q
along it, E[tau | x, p, q] has a closed form for token and block
verification (`Verifier.expected_accepted`): averaging it instead of the
drawn tau is a Rao-Blackwellised estimate of E[tau + 1 | c], unbiased, with
no variance from the verdict's uniforms. Evaluating every verifier on the
SAME sampled blocks at the SAME contexts makes the comparison paired: what
is left of the noise is the choice of contexts and drafts, shared by both.

Which contexts. `expected_tokens_per_round` takes a batch of texts (prompt +
generation: sample it from the target, e.g. with `generate`, so the contexts
follow the target's law) and uses every generated position j of row b as
a round start: the context is the prompt and the first j generated tokens.
Its mean is the expected tokens per round at a round start drawn uniformly
from those positions. A decode's tokens per target call weighs positions by
where rounds happen to start, so it can differ a little from this mean; the
paired ratio between verifiers is what this measures well.

Each model reads every row once (one teacher-forced prefill, its cache
keeping every position); a chunk of contexts then copies its rows' caches,
rolls their lengths back to the context, drafts G tokens from q and scores
them with one target pass, as a decode round does.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import sampling as sampling_lib
from specjax.decode import steps
from specjax.decode import validation
from specjax.decode import verifiers as verifiers_lib


@functools.partial(jax.jit, static_argnames=("capacity",))
def _prefill(model, seq_BxT, capacity):
  """(logits float32 `[B, T, V]`, the cache holding all T positions)."""
  cache = model.init_cache(seq_BxT.shape[0], capacity)
  return model(seq_BxT, cache)


@functools.partial(jax.jit,
                   static_argnames=("gamma", "sampling", "verifiers"))
def _chunk(target, draft, target_cache, draft_cache, p0_logits_CxV,
           q0_logits_CxV, rows_C, lengths_C, u_CxG, *, gamma, sampling,
           verifiers):
  """Expected drafts kept per verifier, float32 `[len(verifiers), C]`, for C
  contexts: row rows_C[c] of the prefilled caches cut at lengths_C[c]."""
  take = lambda cache: jax.tree.map(lambda a: a[rows_C], cache).replace(
      lengths=lengths_C)
  draft_cache, target_cache = take(draft_cache), take(target_cache)
  x_C, q_CxV = steps._sample_logits(draft, q0_logits_CxV, u_CxG[:, 0],
                                    sampling)
  drafts, qs = [x_C], [q_CxV]
  for i in range(1, gamma):  # gamma is small and static
    logits_Cx1xV, draft_cache = draft(drafts[-1][:, None], draft_cache)
    x_C, q_CxV = steps._sample_logits(draft, logits_Cx1xV[:, 0], u_CxG[:, i],
                                      sampling)
    drafts.append(x_C)
    qs.append(q_CxV)
  drafts_CxG = jnp.stack(drafts, axis=1)
  q_CxGxV = jnp.stack(qs, axis=1)
  # The target scores the G drafts at positions L .. L + G - 1; its law
  # after the context (position L - 1) came with the prefill.
  logits_CxGxV, _ = target(drafts_CxG, target_cache)
  p_CxG1xV = sampling_lib.probabilities(
      jnp.concatenate([p0_logits_CxV[:, None], logits_CxGxV], axis=1),
      sampling)
  return jnp.stack([v.expected_accepted(p_CxG1xV, q_CxGxV, drafts_CxG)
                    for v in verifiers])


def _check_models(target, draft):
  for name, model in (("target", target), ("draft", draft)):
    for flag in ("reads_target_features", "reads_target_cache"):
      if getattr(model, flag, False):
        raise ValueError(
            f"{name} has {flag}: its cache is not its own, so it cannot be "
            "cut at a context; expected_tokens_per_round takes drafts with "
            "their own cache (Transformers, n-grams, prompt lookup).")


def expected_tokens_per_round(
    target, draft, verifiers: Sequence[Any], sampling, *, gamma: int,
    prompts_BxP, prompt_lengths_B, tokens_BxN, lengths_B,
    key: jax.Array, samples: int = 1, chunk: int = 256) -> dict[str, Any]:
  """Rao-Blackwellised tokens per round of each verifier on shared drafts.

  Args:
    target, draft: `CausalLM`s (the draft with its own cache).
    verifiers: registry strings or `Verifier`s with `expected_accepted`
      ("token", "block"); the first is the reference of the ratios.
    sampling: the `SamplingConfig` applied to both models' logits.
    gamma: drafts per round, >= 1.
    prompts_BxP: int `[B, P]` right-padded prompts; prompt_lengths_B: `[B]`.
    tokens_BxN, lengths_B: the generated texts (`GenerationResult.tokens`,
      `.lengths`); every generated position of row b, j < lengths_B[b], is
      a round start (module docstring).
    key: PRNG key of the draft blocks.
    samples: draft blocks per context, >= 1.
    chunk: contexts per compiled call (memory: `chunk` copies of a row's
      caches, beside both models' float32 logits of every row and position,
      `[B, P + N, V]` each).

  Returns:
    {"verifiers": their registry strings, "tokens_per_round": mean of
    E[tau + 1] per verifier, "tokens_per_round_se": standard errors over
    rows, "ratio": each verifier's mean over the first's, "ratio_se": the
    paired ratio's standard error over rows (delta method), "contexts":
    contexts judged, "blocks": draft blocks judged (contexts x samples)}.
  """
  # Else a non-model would fail inside tracing, another vocabulary after
  # both prefills, and a bare "token" would read as the verifiers "t", "o", ...
  validation.check_pair(target, draft)
  if isinstance(verifiers, (str, verifiers_lib.Verifier)):
    raise TypeError(f"verifiers must be a sequence of verifiers, e.g. "
                    f"('token', 'block'), got the single {verifiers!r}: "
                    "pass it in a tuple.")
  verifiers = tuple(verifiers_lib.get_verifier(v) for v in verifiers)
  if not verifiers:
    raise ValueError("verifiers must name at least one verifier, e.g. "
                     "('token', 'block').")
  probe = (jnp.full((1, 2, 2), 0.5), jnp.full((1, 1, 2), 0.5),
           jnp.zeros((1, 1), jnp.int32))
  for v in verifiers:
    try:
      v.expected_accepted(*probe)
    except NotImplementedError as err:
      raise ValueError(str(err)) from None
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError("sampling must be a specjax.SamplingConfig, got "
                    f"{type(sampling).__name__}.")
  gamma = _checks.check_int("gamma", gamma, low=1)
  samples = _checks.check_int("samples", samples, low=1)
  chunk = _checks.check_int("chunk", chunk, low=1)
  _check_models(target, draft)
  key = _checks.as_single_key("key", key)
  # The last context (all generated tokens but the last) and G drafts.
  seq_BxT, p_len, n_len = _checks.check_texts(
      prompts_BxP, prompt_lengths_B, tokens_BxN, lengths_B,
      {"target": target, "draft": draft}, extra=gamma)
  if not n_len.any():
    raise ValueError("lengths_B are all 0: there is no generated position "
                     "to start a round at.")
  rows, capacity = seq_BxT.shape[0], seq_BxT.shape[1] + gamma
  target_logits, target_cache = _prefill(target, jnp.asarray(seq_BxT),
                                         capacity=capacity)
  draft_logits, draft_cache = _prefill(draft, jnp.asarray(seq_BxT),
                                       capacity=capacity)

  # Context (b, j): the prompt and j generated tokens, length p_len[b] + j.
  rows_K = np.repeat(np.arange(rows), n_len)
  cut_K = np.concatenate([p_len[b] + np.arange(n_len[b]) for b in range(rows)])
  rows_K, cut_K = np.repeat(rows_K, samples), np.repeat(cut_K, samples)
  num = rows_K.size
  kept_MxK = np.zeros((len(verifiers), num), np.float64)
  # Every block's uniforms are drawn up front, so `chunk` (a memory knob)
  # does not change which blocks are drawn.
  u_KxG = jax.random.uniform(key, (num, gamma))
  for start in range(0, num, chunk):
    # Pad the last chunk with its first context so every call has one shape.
    idx = np.arange(start, start + chunk)
    idx = np.where(idx < num, idx, start)
    r_C = jnp.asarray(rows_K[idx], jnp.int32)
    l_C = jnp.asarray(cut_K[idx], jnp.int32)
    out = _chunk(target, draft, target_cache, draft_cache,
                 target_logits[r_C, l_C - 1], draft_logits[r_C, l_C - 1],
                 r_C, l_C, u_KxG[idx],
                 gamma=gamma, sampling=sampling, verifiers=verifiers)
    take = min(chunk, num - start)
    kept_MxK[:, start:start + take] = np.asarray(out, np.float64)[:, :take]

  # Per-row means, then means and paired ratios over rows (the contexts of
  # one row are correlated, rows are independent).
  counts_B = np.bincount(rows_K, minlength=rows).astype(np.float64)
  used = counts_B > 0
  row_MxB = np.stack([np.bincount(rows_K, weights=k + 1.0, minlength=rows)
                      for k in kept_MxK])[:, used] / counts_B[used]
  n_rows = row_MxB.shape[1]
  w_B = counts_B[used] / counts_B[used].sum()
  mean_M = row_MxB @ w_B
  se = lambda resid_B: (float(np.sqrt(np.sum((w_B * resid_B) ** 2)
                                      * n_rows / (n_rows - 1)))
                        if n_rows > 1 else None)
  ratio_M = mean_M / mean_M[0]
  return {
      "verifiers": [v.spec for v in verifiers],
      "tokens_per_round": mean_M.tolist(),
      "tokens_per_round_se": [se(r - m) for r, m in zip(row_MxB, mean_M)],
      "ratio": ratio_M.tolist(),
      "ratio_se": [None if n_rows == 1
                   else se(r - q * row_MxB[0]) / float(mean_M[0])
                   for r, q in zip(row_MxB, ratio_M)],
      "contexts": num // samples, "blocks": num}
