r"""How much any draft-length rule could gain over the best fixed gamma here.

  python benchmarks/gamma_oracle.py [DRAFTS] [CALLS] [RUNS] [--batch=B]
      [--costs=c1,c2,c4,c8]
      # default: bigram,distilled-draft-0.1m@target-3m,self:1 64 200, B = 1

Counts, no timer: the same numbers on any machine. On the quick job's
target-3m at T = 1, for each draft (named as `experiments.adaptive_gamma
--drafts` names them):

1. The text. The target samples 128 bytes after each of CALLS held-out
   64-byte prompts (drawn as the adaptive_gamma grid draws its 16, but
   CALLS of them: `data.prompts` spreads its starts over the held-out text,
   so they are not the grid's 16); consecutive texts make calls of B rows.
2. Each position's acceptance a_i = sum_x min(p_i, q_i): both models' laws
   at byte i of that text, teacher-forced (the draft's law as a round
   builds it, `steps._draft_law`). A draft at position i is kept with
   probability a_i under the exact token verifier.
3. Calls simulated on those sequences, RUNS times each: a round of width w
   keeps a row's drafts while u_j < a_{i+j} (u uniform) and emits the kept
   ones plus one (the residual's or the bonus token); the B rows run every
   round together until each has 128 bytes. A round costs the cell's
   measured round of width w in `generate` steps at that batch (`--costs`;
   by default the loop's fixed-gamma rounds of widths 1, 2, 4, 8 from
   results/adaptive_gamma/T1_grid_window/report.txt, "steps/round"; widths
   3, 5, 6, 7 interpolated). Speedup = 128 / the steps the call took.

Policies, side by side on the same texts and draws:
  fixed w               one width for every call (w = 1..8);
  best w per call       each call its own best fixed width, in hindsight;
  oracle                each round plans as `Goodput` does (`simulate`),
                        from each row's true a_i at its next positions (or
                        an autoregressive step, cost 1): no rule that reads
                        only the past can know these;
  mean                  the same plan from a running mean of each row's
                        judged drafts' a_i (prior 3 : 1, as `Goodput`'s
                        estimate, which adds sum_x min(p, q) per judged
                        draft);
  ema h                 from the mean's counts (prior included) with each
                        judged draft discounting the older ones, half-life
                        h judged drafts (a rule that forgets, to follow
                        the text's easy and hard stretches);
  mean, widths 1,2,4,8  the mean planning only gamma="auto"'s widths;
    ... auto's prices   and planning with the round costs auto's
                        `measure_goodput` put them at in the same run
                        (still charged the measured ones): what its
                        pricing errors cost;
    ... from the prompt and each row starting from its prompt's last 16
                        positions' overlap (`Goodput.prompt_prior`, as
                        gamma="auto" does; the loop scores no prompt for
                        a self:K draft, which shares the target's cache);
    ... from its last 8 (4): the same with `prompt_prior` 8 (4): half (a
                        quarter) of the positions to score, each weighed
                        as one draft.
Each row: the mean speedup over calls, and its ratio to the best fixed
width and to the best of widths 1, 2, 4, 8 (the grid's fixed gammas).
The oracle shows about what a draft-length rule could gain on this text
at these costs; it is myopic (each round's plan as if every later round
had its width), so near, not at, the best plan.
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from absl import flags  # noqa: E402
import specjax as sj  # noqa: E402
from specjax import sampling as sampling_lib  # noqa: E402
from specjax.decode import steps  # noqa: E402
from specjax.harness import autotune  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from experiments import adaptive_gamma  # noqa: E402
from configs import reproduce  # noqa: E402

NEW = 128
PROMPT = 64
GAMMA_MAX = 8
WINDOW = 16  # `Goodput().prompt_window`
# The loop's fixed-gamma rounds of widths 1, 2, 4, 8, in `generate` steps
# at that batch ("steps/round" in results/adaptive_gamma/T1_grid_window/
# report.txt: 128 new tokens a call, the call's fixed costs included), by
# (draft, batch).
MEASURED = {
    ("bigram", 1): (1.31, 1.47, 1.93, 2.72),
    ("bigram", 8): (1.58, 1.92, 2.67, 3.87),
    ("distilled-draft-0.1m@target-3m", 1): (1.60, 1.92, 2.61, 4.11),
    ("distilled-draft-0.1m@target-3m", 8): (1.81, 2.36, 3.29, 4.99),
    ("self:1", 1): (1.65, 2.04, 3.11, 4.98),
    ("self:1", 8): (1.81, 2.33, 3.36, 5.21),
}
# What gamma="auto" priced those rounds at in the same run (its
# `measure_goodput`, "(priced)" in the same report).
PRICED = {
    ("bigram", 1): (1.33, 1.45, 1.88, 2.50),
    ("bigram", 8): (1.61, 2.06, 2.80, 3.87),
    ("distilled-draft-0.1m@target-3m", 1): (1.55, 1.77, 2.66, 3.60),
    ("distilled-draft-0.1m@target-3m", 8): (1.95, 2.49, 3.45, 4.97),
    ("self:1", 1): (1.67, 1.99, 2.89, 4.97),
    ("self:1", 8): (1.77, 2.33, 3.44, 5.28),
}
DOUBLING = autotune.doubling_widths(GAMMA_MAX)  # what gamma="auto" plans


def round_costs(at_1248):
  """Costs of widths 1..8 from those of widths 1, 2, 4, 8 (linear between)."""
  return np.interp(np.arange(1, GAMMA_MAX + 1), (1, 2, 4, 8), at_1248)


def acceptances(target, draft, calls):
  """(float `[calls, NEW]`, float `[calls, WINDOW]`): a_i along the
  target's own T = 1 text, and at the prompt's last WINDOW positions (the
  ones the loop scores for `Goodput.prompt_prior`)."""
  sampling = sj.SamplingConfig(temperature=1.0)
  prompts_NxP = jnp.asarray(adaptive_gamma.held_out_calls(calls, 1, PROMPT)
                            [1:, 0])
  lengths_N = jnp.full((calls,), PROMPT, jnp.int32)
  text_NxT = sj.generate(target, prompts_NxP, lengths_N, jax.random.key(0),
                         max_new_tokens=NEW, sampling=sampling).tokens
  tokens_NxS = jnp.concatenate([prompts_NxP, text_NxT], axis=1)
  # The laws of bytes PROMPT .. PROMPT + NEW - 1, read at the byte before.
  inputs_NxS = tokens_NxS[:, :-1]

  def laws(model, law):
    logits_NxSxV, _ = model(inputs_NxS, model.init_cache(
        calls, inputs_NxS.shape[1]))
    return law(logits_NxSxV[:, PROMPT - 1 - WINDOW:])

  p = laws(target, lambda x: sampling_lib.probabilities(x, sampling))
  q = laws(draft, lambda x: steps._draft_law(draft, x, sampling))  # pylint: disable=protected-access
  a_NxS = np.asarray(jnp.sum(jnp.minimum(p, q), axis=-1), np.float64)
  return a_NxS[:, WINDOW:], a_NxS[:, :WINDOW]


def simulate(a_BxT, costs_W, policy, runs, rng, plan_costs_W=None,
             widths=None, start_B=None):
  """Mean speedup over `runs` draws of a batch of texts' rounds.

  The B rows run every round together at one width, while any row is
  short of NEW bytes; the call's steps are all its rounds'. The width is
  the one `Goodput.remaining_time` picks: least (rounds the slowest row
  still needs) x (round cost), each row's rounds = bytes left / expected
  bytes a round at its acceptance estimate (one row: most expected bytes
  per step).

  policy: ("fixed", w), ("oracle",) (each row's true a_i of its next
  positions in place of the estimate, and an autoregressive step, cost 1,
  as one more choice), ("mean",) or ("ema", half_life). The estimates plan
  with `plan_costs_W` (default: the costs charged) among `widths` (default:
  1..gamma_max), from the pseudo-counts `start_B` (kept `[B]`, judged `[B]`;
  default: the prior 3 : 1).
  """
  gamma = len(costs_W)
  batch = a_BxT.shape[0]
  plan_costs_W = costs_W if plan_costs_W is None else plan_costs_W
  allowed_W = np.ones(gamma, bool)
  if widths is not None:
    allowed_W = np.isin(np.arange(1, gamma + 1), widths)
  # Past a row's end: moot (a done row's drafts are not judged).
  padded_BxT = np.concatenate([a_BxT, np.zeros((batch, gamma + 1))], axis=1)
  rows_B = np.arange(batch)
  w_W = np.arange(1, gamma + 1)
  pos_RxB = np.zeros((runs, batch), np.int64)
  steps_R = np.zeros(runs)
  # The mean's counts (prior 3 : 1), and the discounted ones of "ema".
  kept0_B, judged0_B = start_B if start_B is not None else (3.0, 4.0)
  kept = np.broadcast_to(kept0_B, (runs, batch)).astype(float)
  judged = np.broadcast_to(judged0_B, (runs, batch)).astype(float)
  keep_rate = 0.5 ** (1.0 / policy[1]) if policy[0] == "ema" else 1.0
  while True:
    live_RxB = pos_RxB < NEW
    r = np.flatnonzero(live_RxB.any(axis=1))
    if not r.size:
      break
    live = live_RxB[r]
    pos = pos_RxB[r]
    ahead_RxBxW = padded_BxT[rows_B[None, :, None],
                             pos[:, :, None] + np.arange(gamma)]
    left_RxB = np.where(live, NEW - pos, 0).astype(float)
    if policy[0] == "fixed":
      width_R = np.full(r.size, policy[1])
    else:
      if policy[0] == "oracle":
        tokens_RxBxW = 1.0 + np.cumsum(np.cumprod(ahead_RxBxW, axis=2),
                                       axis=2)
        plan_W, ok_W = costs_W, np.ones(gamma, bool)
      else:
        alpha = np.clip(kept[r] / judged[r], 0.0, 1.0 - 1e-9)[..., None]
        tokens_RxBxW = (1.0 - alpha ** (w_W + 1)) / (1.0 - alpha)
        plan_W, ok_W = plan_costs_W, allowed_W
      time_RxW = np.max(left_RxB[..., None] / tokens_RxBxW, axis=1) * plan_W
      time_RxW = np.where(ok_W, time_RxW, np.inf)
      width_R = np.argmin(time_RxW, axis=1) + 1
      if policy[0] == "oracle":  # or an autoregressive step
        width_R = np.where(np.max(left_RxB, axis=1) < time_RxW.min(axis=1),
                           0, width_R)
    width_RxB = np.where(live, width_R[:, None], 0)
    u_RxBxW = rng.random(ahead_RxBxW.shape)
    accepted = (u_RxBxW < ahead_RxBxW) & (w_W <= width_RxB[..., None])
    k_RxB = np.argmin(np.concatenate(
        [accepted, np.zeros(accepted.shape[:2] + (1,), bool)], axis=2),
        axis=2)
    # Judged drafts: the kept ones and the first rejection (if any).
    n_RxB = np.minimum(k_RxB + 1, width_RxB)
    judged_RxBxW = w_W <= n_RxB[..., None]
    k, n = kept[r], judged[r]
    for j in range(gamma):  # each judged draft discounts the older ones
      on = judged_RxBxW[..., j]
      k = np.where(on, keep_rate * k + ahead_RxBxW[..., j], k)
      n = np.where(on, keep_rate * n + 1.0, n)
    kept[r], judged[r] = k, n
    steps_R[r] += np.where(width_R > 0, costs_W[np.maximum(width_R, 1) - 1],
                           1.0)
    pos_RxB[r] = pos + np.where(live, np.where(width_RxB > 0, k_RxB + 1, 1),
                                0)
  return float(np.mean(NEW / steps_R))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  names = dict.fromkeys(name for name, _ in MEASURED)
  parser.add_argument("drafts", nargs="?", default=",".join(names))
  parser.add_argument("calls", nargs="?", type=int, default=64)
  parser.add_argument("runs", nargs="?", type=int, default=200)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--costs", default=None,
                      help="rounds of widths 1,2,4,8 in generate steps, "
                           "for every draft (default: MEASURED's)")
  args = parser.parse_args()
  drafts = args.drafts.split(",")
  if args.costs is None and any((d, args.batch) not in MEASURED
                                for d in drafts):
    parser.error(f"--costs is needed outside {list(MEASURED)}")
  if args.batch < 1 or args.calls % args.batch:
    parser.error("--batch must divide CALLS")
  flags.FLAGS(sys.argv[:1])  # the experiment's loaders read its flags
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  policies = ([(f"fixed {w}", ("fixed", w), {}) for w in range(1, 9)]
              + [("oracle", ("oracle",), {}), ("mean", ("mean",), {})]
              + [(f"ema {h}", ("ema", h), {}) for h in (4, 16, 64)]
              + [("mean, widths 1,2,4,8", ("mean",), dict(widths=DOUBLING)),
                 ("  ... auto's prices", ("mean",), "priced"),
                 ("  ... from the prompt", ("mean",), ("prompt", WINDOW)),
                 ("  ... from its last 8", ("mean",), ("prompt", 8)),
                 ("  ... from its last 4", ("mean",), ("prompt", 4))])
  for name in drafts:
    costs = (tuple(float(x) for x in args.costs.split(",")) if args.costs
             else MEASURED[name, args.batch])
    priced = costs if args.costs else PRICED[name, args.batch]
    costs_W = round_costs(costs)
    draft = drafts_lib.make_draft(name, target,
                                  config=reproduce.get_config("quick")).model
    if isinstance(draft, sj.SelfDraft):  # the same laws, on a cache of its own
      draft = draft.replace(share_cache=False)
    a_NxT, prompt_NxK = acceptances(target, draft, args.calls)
    # Where acceptance moves: its spread across texts, and within a text
    # the correlation of a_i with a_{i+1} (what a rule reading the past
    # can use).
    within = np.nanmean([np.corrcoef(a[:-1], a[1:])[0, 1] for a in a_NxT])
    print(f"{name}: {args.calls} texts of {NEW} bytes, T = 1, batch "
          f"{args.batch}; rounds of widths 1, 2, 4, 8 cost {costs} steps "
          f"(auto priced them {priced})")
    print(f"  a_i: mean {a_NxT.mean():.3f}, texts' means "
          f"{a_NxT.mean(1).min():.3f}..{a_NxT.mean(1).max():.3f} (sd "
          f"{a_NxT.mean(1).std():.3f}), within a text sd "
          f"{a_NxT.std(1).mean():.3f}, lag-1 correlation {within:.2f}")
    calls_CxBxT = a_NxT.reshape(-1, args.batch, NEW)

    def prompt_start(window, i):
      """`Goodput.initial_counts` with prompt_prior = window: the prompt's
      last `window` scored positions alone, weighed as `window` drafts."""
      overlap_B = ((prompt_NxK[:, -window:].sum(1) + 0.5) / (window + 1.0)
                   ).reshape(-1, args.batch)[i]
      return window * overlap_B, np.full(args.batch, float(window))

    speed = {}  # policy -> [calls]
    for label, policy, kw in policies:
      for i, a_BxT in enumerate(calls_CxBxT):
        if kw == "priced" or isinstance(kw, tuple):
          start = None if kw == "priced" else prompt_start(kw[1], i)
          kw_i = dict(widths=DOUBLING, plan_costs_W=round_costs(priced),
                      start_B=start)
        else:
          kw_i = kw
        speed.setdefault(label, []).append(simulate(
            a_BxT, costs_W, policy, args.runs, np.random.default_rng([i, 7]),
            **kw_i))
    speed = {label: np.array(s) for label, s in speed.items()}
    fixed = {label: s for label, s in speed.items()
             if label.startswith("fixed")}
    best = max(fixed, key=lambda label: fixed[label].mean())
    # The grid's comparator: the best of the widths it times.
    best_timed = max((f"fixed {w}" for w in DOUBLING),
                     key=lambda label: fixed[label].mean())
    speed["best w per call"] = np.max(np.stack(list(fixed.values())), axis=0)
    for label in [p[0] for p in policies[:8]] + ["best w per call"] + [
        p[0] for p in policies[8:]]:
      s = speed[label].mean()
      mark = "  <- best fixed" if label == best else ""
      if label == best_timed:
        mark += "  <- best of 1,2,4,8"
      print(f"  {label:22s} {s:.3f}  / best fixed "
            f"{s / fixed[best].mean():.3f}  / best of 1,2,4,8 "
            f"{s / fixed[best_timed].mean():.3f}{mark}")


if __name__ == "__main__":
  main()
