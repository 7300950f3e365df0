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
3. Calls simulated on those sequences, RUNS times each
   (`specjax.harness.policy_sim`: `Recorded` rows, runs in lockstep): a
   round of width w keeps a row's drafts while u_j < a_{i+j} (u uniform)
   and emits the kept ones plus one (the residual's or the bonus token);
   the B rows run every round together until each has 128 bytes. A round
   costs the cell's measured round of width w in `generate` steps at that
   batch (`--costs`; by default the loop's fixed-gamma rounds of widths 1,
   2, 4, 8 from results/adaptive_gamma/T1_grid_window/report.txt,
   "steps/round"; widths 3, 5, 6, 7 interpolated). Speedup = 128 / the
   steps the call took, averaged over the RUNS draws
   (`Simulated.mean_speedup`).

Policies, side by side on the same texts and draws:
  fixed w               one width for every call (w = 1..8);
  best w per call       each call its own best fixed width, in hindsight;
  oracle                each round plans as `Goodput` does (`Oracle`),
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
from specjax.harness import policy_sim  # noqa: E402
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
  for name in drafts:
    costs = (tuple(float(x) for x in args.costs.split(",")) if args.costs
             else MEASURED[name, args.batch])
    priced = costs if args.costs else PRICED[name, args.batch]
    costs_W = policy_sim.interpolate_costs((1, 2, 4, 8), costs, GAMMA_MAX)
    priced_W = policy_sim.interpolate_costs((1, 2, 4, 8), priced, GAMMA_MAX)
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
    prompts_CxBxK = prompt_NxK.reshape(-1, args.batch, WINDOW)

    def auto_mean(initial=(3.0, 4.0)):
      """The mean over gamma="auto"'s widths, planning at its prices."""
      return policy_sim.Estimate(widths=DOUBLING, plan_costs_W=priced_W,
                                 initial=initial)

    def from_prompt(window):
      return lambda i: auto_mean(
          policy_sim.prompt_counts(prompts_CxBxK[i], window))

    same = lambda policy: lambda i: policy  # every call the same policy
    policies = ([(f"fixed {w}", same(policy_sim.Fixed(w)))
                 for w in range(1, 9)]
                + [("oracle", same(policy_sim.Oracle())),
                   ("mean", same(policy_sim.Estimate()))]
                + [(f"ema {h}", same(policy_sim.Estimate(half_life=h)))
                   for h in (4, 16, 64)]
                + [("mean, widths 1,2,4,8",
                    same(policy_sim.Estimate(widths=DOUBLING))),
                   ("  ... auto's prices", lambda i: auto_mean()),
                   ("  ... from the prompt", from_prompt(WINDOW)),
                   ("  ... from its last 8", from_prompt(8)),
                   ("  ... from its last 4", from_prompt(4))])
    speed = {}  # policy -> [calls]
    for label, policy in policies:
      speed[label] = [policy_sim.simulate(
          policy_sim.Recorded(a_BxT), costs_W, policy(i), args.runs,
          np.random.default_rng([i, 7])).mean_speedup()
                      for i, a_BxT in enumerate(calls_CxBxT)]
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
