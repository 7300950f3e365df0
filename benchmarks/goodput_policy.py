r"""What `Goodput` loses to learning the acceptance, with exact costs and no timer.

  python benchmarks/goodput_policy.py [--costs=1.56,1.89,...] [--tokens=128]
      [--batch=1] [--spread=0.0] [--burst=0.0 --switch=0.05]
      [--overlap_var=0.0] [--change=0.0] [--priors=1:1,...]
      [--hystereses=0,0.1,...] [--switch_costs=0,0.5,...] [--lockstep]

Simulates (`specjax.harness.policy_sim`), at batch 1 or `--batch` rows,
the rounds `speculative_generate(gamma=rule)` runs on `Synthetic` rows:
every draft kept with probability alpha (with `--spread`, row b's own
alpha_b, uniform in alpha +- spread; with `--burst`, in easy and hard runs
of alpha_b +- burst; with `--overlap_var`, each draft's keep probability
strays from its run's), each round charged the cost of its width from
`--costs` (widths 1..gamma_max, in `generate` steps; the default is the
loop's own rounds of the quick job's distilled draft at batch 1, from
`python benchmarks/goodput_costs.py`), plus `--change` steps for each
change of width. The decisions are the library's own (`policy_sim.Rule`:
`Goodput.plan` and `Goodput.keeps` on the rows' counts, with
`measure_goodput`'s margins: `BATCHED_HYSTERESIS` above batch 1, the
default `switch_cost` in steps), priced with the same costs
(`policy_sim.rule_in_steps`), so the rule's only handicap is what it does
not know: alpha (and, with `--overlap_var`, how each draft's keep
probability strays from it). Prints, per alpha, the
speedup over `generate` of every fixed gamma in {1, 2, 4, 8} and of the
rule: from its default prior; counting kept drafts instead of their keep
probabilities ("auto counts", `estimator="accepted"`); warm-started at the
true alpha (`Goodput.warm_start`, strength 16) and at alpha -+ 0.1; from
each prior of `--priors` (pseudo-counts a:b; 1:1 is the uniform prior);
with each margin of `--hystereses` as its `hysteresis` and each cost of
`--switch_costs` as its `switch_cost`. Each with its
ratio to the best fixed gamma; speedups are tokens over the mean steps of
`--runs` rows (batches), every variant on the same simulated rows, run one
after another (`--lockstep`: all at once, faster, other draws).
Candidates the library does not have: expected tokens averaged over each
row's posterior (`Posterior`), and with `--batch` > 1 each row's estimate
shrunk toward the batch's pooled acceptance, by a fixed weight (`Shrunk`)
or by one estimated from the rows' spread (`Moments`); these count kept
drafts, as the library did before `estimator="overlap"`. They stay here,
experiments the library does not offer; `policy_sim.Rule` takes any
`Goodput`. Counts, not timings: the same numbers on any machine.
"""

import argparse
import dataclasses
import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specjax.decode import draft_length  # noqa: E402
from specjax.harness import autotune  # noqa: E402
from specjax.harness import policy_sim  # noqa: E402

# The loop's own rounds of widths 1..8, in `generate` steps: the quick job's
# distilled draft at batch 1 (results/adaptive_gamma/goodput_costs.txt).
DEFAULT_COSTS = "1.43,1.76,2.41,2.66,3.15,3.19,3.48,3.52"
# A probe round, in `generate` steps (an off round cost 1.04-1.10 steps:
# results/adaptive_gamma/planned_loop.txt).
PROBE = 1.1


@dataclasses.dataclass(frozen=True)
class Shrunk(draft_length.Goodput):
  """A candidate, not the library's rule: each row's estimate shrunk toward
  the batch's pooled acceptance, worth `pool` judged drafts (empirical
  Bayes), so that the row the plan waits for is not just the unluckiest."""
  pool: float = 32.0

  def alpha(self, stats):
    a0, b0 = self.prior
    accepted_B = stats.accepted.astype(jnp.float32)
    verified_B = stats.verified.astype(jnp.float32)
    pooled = (jnp.sum(accepted_B) + a0) / (jnp.sum(verified_B) + a0 + b0)
    return (accepted_B + self.pool * pooled) / (verified_B + self.pool)


@dataclasses.dataclass(frozen=True)
class Moments(draft_length.Goodput):
  """A candidate, not the library's rule: `Shrunk` with the pool's weight
  estimated from the rows themselves (beta-binomial, method of moments).
  The spread of the rows' rates beyond what binomial noise explains is
  the spread of their true alphas, tau^2; the pool is worth
  p (1 - p) / tau^2 - 1 judged drafts (capped at `cap`): much where the
  rows are alike, little where they differ, none at batch 1."""
  cap: float = 256.0

  def alpha(self, stats):
    a0, b0 = self.prior
    k_B = stats.accepted.astype(jnp.float32)
    n_B = stats.verified.astype(jnp.float32)
    total = jnp.maximum(jnp.sum(n_B), 1.0)
    pooled = (jnp.sum(k_B) + a0) / (jnp.sum(n_B) + a0 + b0)
    w_B = n_B / total
    rate_B = k_B / jnp.maximum(n_B, 1.0)
    spread = jnp.sum(w_B * (rate_B - pooled) ** 2)
    judged_rows = jnp.sum(n_B > 0)
    noise = pooled * (1.0 - pooled) * jnp.maximum(judged_rows - 1, 0) / total
    tau2 = (spread - noise) / jnp.maximum(1.0 - jnp.sum(w_B ** 2), 1e-6)
    pool = jnp.where(
        judged_rows > 1,
        jnp.clip(pooled * (1.0 - pooled) / jnp.maximum(tau2, 1e-9) - 1.0,
                 0.0, self.cap), 0.0)
    return (k_B + a0 + pool * pooled) / (n_B + a0 + b0 + pool)


@dataclasses.dataclass(frozen=True)
class Posterior(draft_length.Goodput):
  """A candidate, not the library's rule: a round's expected tokens averaged
  over the row's Beta posterior of alpha instead of taken at its mean.
  Tokens a round, sum_{i <= g} alpha^i, are convex in alpha, so what the
  row does not yet know (or a text whose acceptance comes in runs) is
  worth more to a long round than the mean says; under Beta(a, b),
  E[alpha^i] = prod_{j < i} (a + j) / (a + b + j)."""

  def row_tokens(self, stats):
    a0, b0 = self.prior
    a_B = stats.accepted.astype(jnp.float32) + a0
    n_B = stats.verified.astype(jnp.float32) + a0 + b0
    j_G = jnp.arange(self.gamma_max, dtype=jnp.float32)
    moments_BxG = jnp.cumprod((a_B[:, None] + j_G) / (n_B[:, None] + j_G),
                              axis=1)  # E[alpha^1], ..., E[alpha^G]
    # Widths 0..G: sum_{i <= g} E[alpha^i] (width 0, a probe round: one).
    tokens_BxW = jnp.cumsum(jnp.concatenate(
        [jnp.ones_like(moments_BxG[:, :1]), moments_BxG], axis=1), axis=1)
    return tokens_BxW[:, self.min_width:]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--costs", default=DEFAULT_COSTS)
  parser.add_argument("--tokens", type=int, default=128)
  parser.add_argument("--runs", type=int, default=200)
  parser.add_argument("--alphas", default="0.3,0.6,0.8,0.9,0.97")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--spread", type=float, default=0.0)
  parser.add_argument("--burst", type=float, default=0.0)
  parser.add_argument("--switch", type=float, default=0.05)
  parser.add_argument("--overlap_var", type=float, default=0.0,
                      help="variance of a judged draft's keep probability "
                      "about its stretch's alpha (benchmarks/"
                      "overlap_variance.py measures it; 0: none)")
  parser.add_argument("--change", type=float, default=0.0,
                      help="steps a change of width costs (0: none)")
  parser.add_argument("--switch_costs", default="",
                      help="more switch costs to compare, in steps ('s,...')")
  parser.add_argument("--priors", default="",
                      help="more priors to compare, pseudo-counts 'a:b,...'")
  parser.add_argument("--hystereses", default="",
                      help="more hysteresis margins to compare, 'h,...'")
  parser.add_argument("--only", default="",
                      help="comma-separated variant names to run besides "
                      "the fixed gammas, which the ratios need (all: '')")
  parser.add_argument("--lockstep", action="store_true",
                      help="simulate a cell's runs at once: faster, with "
                      "other draws than the default's one run after another")
  args = parser.parse_args()
  costs_W = [float(x) for x in args.costs.split(",")]
  rule = policy_sim.rule_in_steps(costs_W, probe=PROBE)
  if args.batch > 1:
    rule = dataclasses.replace(rule, hysteresis=autotune.BATCHED_HYSTERESIS)
  print(f"batch {args.batch}, {args.tokens} tokens, {args.runs} "
        f"{'rows' if args.batch == 1 else 'batches'} per cell; round "
        f"costs of widths 1..{rule.gamma_max} in generate steps: "
        f"{args.costs}; row alphas uniform in alpha +- {args.spread}"
        + (f", in runs of +- {args.burst} (switch {args.switch} a judged draft)"
           if args.burst else "")
        + (f"; keep probabilities' variance {args.overlap_var}"
           if args.overlap_var else "")
        + (f"; a change of width costs {args.change} steps"
           if args.change else "") + "; "
        "speedup over generate (ratio to the best fixed)")
  fields = {f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)}
  auto = policy_sim.Rule  # the rule deciding as the loop does
  for alpha in (float(a) for a in args.alphas.split(",")):
    variants = {f"gamma={g}": policy_sim.Fixed(g) for g in (1, 2, 4, 8)
                if g <= rule.gamma_max}
    variants.update({
        "auto": auto(rule),
        "auto counts": auto(dataclasses.replace(rule, estimator="accepted")),
        "auto warm": auto(policy_sim.warm_rule(rule, alpha)),
        "auto warm -0.1": auto(policy_sim.warm_rule(rule, alpha - 0.1)),
        "auto warm +0.1": auto(policy_sim.warm_rule(rule, alpha + 0.1)),
        "auto posterior": auto(Posterior(**fields))})
    if args.batch > 1:
      variants["auto shrunk to the batch"] = auto(Shrunk(**fields))
      variants["auto shrunk by moments"] = auto(Moments(**fields))
    for prior in filter(None, args.priors.split(",")):
      a0, b0 = (float(x) for x in prior.split(":"))
      variants[f"auto prior {prior}"] = auto(
          dataclasses.replace(rule, prior=(a0, b0)))
    for m in filter(None, args.switch_costs.split(",")):
      variants[f"auto switch_cost {m}"] = auto(
          dataclasses.replace(rule, switch_cost=float(m)))
    for h in filter(None, args.hystereses.split(",")):
      variants[f"auto hysteresis {h}"] = auto(
          dataclasses.replace(rule, hysteresis=float(h)))
    if args.only:
      keep = args.only.split(",")
      variants = {k: v for k, v in variants.items()
                  if k.startswith("gamma=") or k in keep}
    rows = policy_sim.Synthetic(
        alpha, args.tokens, args.batch, spread=args.spread, burst=args.burst,
        switch=args.switch, overlap_var=args.overlap_var)
    speed = {}
    for name, policy in variants.items():
      # Every variant sees the same rows (the same seed).
      speed[name] = policy_sim.simulate(
          rows, costs_W, policy, args.runs, np.random.default_rng(0),
          probe=PROBE, change=args.change,
          lockstep=args.lockstep).speedup_of_mean()
    best = max(v for k, v in speed.items() if k.startswith("gamma="))
    print(f"alpha {alpha:.2f}: " + "  ".join(
        f"{k} {v:.2f}x ({v / best:.3f})" for k, v in speed.items()),
          flush=True)


if __name__ == "__main__":
  main()
