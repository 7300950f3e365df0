r"""What `Goodput` loses to learning the acceptance, with exact costs and no timer.

  python benchmarks/goodput_policy.py [--costs=1.56,1.89,...] [--tokens=128]
      [--batch=1] [--spread=0.0] [--burst=0.0 --switch=0.05]
      [--overlap_var=0.0] [--change=0.0] [--priors=1:1,...]
      [--hystereses=0,0.1,...] [--switch_costs=0,0.5,...]

Simulates, at batch 1 (or `--batch` rows, every round run for the whole
batch while any row is active), the rounds
`speculative_generate(gamma=rule)` runs (`loop._planned_loop`: a width kept
while `rule.keeps` it; off stretches of a probe round, then
`probe_every - 1` autoregressive steps if the rule still keeps width 0) on
rows whose every draft is accepted independently with probability alpha
(with `--spread`, row b's own alpha_b, uniform in alpha +- spread; with
`--burst`, in easy and hard runs of alpha_b +- burst), and
charges each round the cost of its width from `--costs` (widths
1..gamma_max, in `generate` steps; the default is the loop's own rounds of
the quick job's distilled draft at batch 1, from
`python benchmarks/goodput_costs.py`), plus `--change` steps for each
change of width. The decisions are the library's own
(`Goodput.remaining_time` and `Goodput.keeps` on the rows' counts, as the
loop's `RowStats` keeps them, with `measure_goodput`'s margins:
`BATCHED_HYSTERESIS` above batch 1, the default `switch_cost` in steps),
priced with the same costs, so the rule's only handicap is what it does
not know: alpha (and, with `--overlap_var`, how each draft's keep
probability strays from it). Prints, per alpha, the
speedup over `generate` of every fixed gamma in {1, 2, 4, 8} and of the
rule: from its default prior; counting kept drafts instead of their keep
probabilities ("auto counts", `estimator="accepted"`); warm-started at the
true alpha (`Goodput.warm_start`, strength 16) and at alpha -+ 0.1; from
each prior of `--priors` (pseudo-counts a:b; 1:1 is the uniform prior);
with each margin of `--hystereses` as its `hysteresis` and each cost of
`--switch_costs` as its `switch_cost`. Each with its
ratio to the best fixed gamma; means over `--runs` rows (batches),
every variant on the same simulated rows. Candidates the library does not
have: expected tokens averaged over each row's posterior (`Posterior`),
and with `--batch` > 1 each row's estimate shrunk toward the batch's
pooled acceptance, by a fixed weight (`Shrunk`) or by one estimated from
the rows' spread (`Moments`); these count kept drafts, as the library did
before `estimator="overlap"`. Counts, not timings: the same numbers on any
machine.
"""

import argparse
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specjax.decode import draft_length  # noqa: E402
from specjax.decode import state  # noqa: E402

# The loop's own rounds of widths 1..8, in `generate` steps: the quick job's
# distilled draft at batch 1 (results/adaptive_gamma/goodput_costs.txt).
DEFAULT_COSTS = "1.43,1.76,2.41,2.66,3.15,3.19,3.48,3.52"
# A probe round, in `generate` steps (an off round cost 1.04-1.10 steps:
# results/adaptive_gamma/planned_loop.txt).
PROBE = 1.1


def make_rule(costs):
  """A `Goodput` whose round of width g costs costs[g - 1] `generate` steps
  (the unit: c = overhead = 0, so a step costs 1)."""
  return draft_length.Goodput(c=0.0, r=tuple(costs), c_first=0.0,
                              overhead=0.0, probe=PROBE)


def decisions(rule, batch=1):
  """(accepted_B, verified_B, overlap_B, remaining_B, active_B) -> (best
  width, keeps per width), the rule's own `plan` and `keeps` on the rows'
  counts."""

  @jax.jit
  def fn(accepted_B, verified_B, overlap_B, remaining_B, active_B):
    stats = state.RowStats.zeros(batch, 1).replace(
        accepted=accepted_B, verified=verified_B, overlap_sum=overlap_B)
    width = draft_length.widest(
        rule.plan(stats, active_B, remaining_B), active_B)
    return width, jnp.stack([
        rule.keeps(w, stats, active_B, remaining_B)
        for w in range(rule.min_width, rule.gamma_max + 1)])
  return lambda a, v, o, n, act: jax.device_get(fn(
      jnp.asarray(a, jnp.int32), jnp.asarray(v, jnp.int32),
      jnp.asarray(o, jnp.float32), jnp.asarray(n, jnp.int32),
      jnp.asarray(act)))


def simulate(rule, decide, alpha, tokens, rng, fixed=None, batch=1,
             spread=0.0, burst=0.0, switch=0.05, overlap_var=0.0,
             change=0.0):
  """`generate` steps for `batch` rows to emit `tokens` tokens each with the
  rule (or a fixed gamma): the planned loop's rounds, as in
  `loop._planned_loop`; every round runs for the whole batch while any row
  is active, as the loop does. Row b keeps each draft with probability
  alpha_b, uniform in alpha +- spread (clipped to [0.01, 0.99]); with
  `burst`, the row's text alternates between easy and hard stretches
  (alpha_b + burst and alpha_b - burst, clipped; each judged draft
  switches with probability `switch`), so its acceptance comes in runs at
  the same mean, as a text's easy and hard passages give it. Each judged
  draft adds its keep probability to the row's overlap sum (what the
  library's `estimator="overlap"` counts; here a draft's sum_x min(p, q)
  is its stretch's alpha, or with `overlap_var` drawn about it from a Beta
  of that variance, as a text's drafts differ). Each change of width costs
  `change` steps more (the loop leaves one width's loop for another's)."""
  alpha_B = np.clip(alpha + spread * rng.uniform(-1.0, 1.0, batch), 0.01,
                    0.99)
  easy_B = rng.random(batch) < 0.5
  def keeps_draft(b):
    if rng.random() < switch:
      easy_B[b] = not easy_B[b]
    a = min(max(alpha_B[b] + (burst if easy_B[b] else -burst), 0.01), 0.99)
    if overlap_var:
      # This draft's own keep probability, Beta-distributed about the
      # stretch's alpha with variance overlap_var (the marginal keep
      # probability stays a).
      kappa = max(a * (1.0 - a) / overlap_var - 1.0, 1e-3)
      a = rng.beta(a * kappa, (1.0 - a) * kappa)
    overlap[b] += a  # the draft is judged
    return rng.random() < a
  costs = rule.round_costs()  # width 0 (an off stretch's mean), 1..gamma_max
  accepted, verified = np.zeros(batch, int), np.zeros(batch, int)
  overlap = np.zeros(batch)
  emitted = np.zeros(batch, int)
  time = 0.0
  going = lambda: bool((emitted < tokens).any())
  plan = lambda: decide(accepted, verified, overlap, tokens - emitted,
                        emitted < tokens)

  last = None  # the width of the last round (0: a probe round)

  def enter(w):
    nonlocal time, last
    if last is not None and w != last:
      time += change
    last = w

  def round_of(w):
    nonlocal time
    enter(w)
    for b in np.flatnonzero(emitted < tokens):
      k = 0
      while k < w and keeps_draft(b):
        k += 1
      accepted[b] += k
      verified[b] += min(k + 1, w)
      emitted[b] = min(tokens, emitted[b] + k + 1)
    time += costs[w]

  while going():
    if fixed is not None:
      round_of(fixed)
      continue
    w, _ = plan()
    if w:
      round_of(w)
      while going() and plan()[1][w]:
        round_of(w)
      continue
    # A probe round: one draft, judged by the 1-token pass, one token.
    enter(0)
    for b in np.flatnonzero(emitted < tokens):
      k = int(keeps_draft(b))
      accepted[b], verified[b], emitted[b] = (accepted[b] + k,
                                              verified[b] + 1, emitted[b] + 1)
    time += rule.probe
    if going() and plan()[1][0]:
      off = min(rule.probe_every - 1, int((tokens - emitted).max()))
      emitted[:] = np.minimum(tokens, emitted + off)
      time += off  # a step costs 1
  return time


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


def warm(rule, alpha, judged=10_000):
  """`rule.warm_start` (its default strength) of a pilot row that kept
  `alpha` (clipped to [0.01, 0.99]: a pilot's alpha +- 0.1) of `judged`
  drafts."""
  alpha = min(max(alpha, 0.01), 0.99)
  stats = state.RowStats.zeros(1, 1).replace(
      accepted=jnp.array([round(alpha * judged)], jnp.int32),
      verified=jnp.array([judged], jnp.int32))
  pilot = state.GenerationResult(tokens=jnp.zeros((1, 1), jnp.int32),
                                 lengths=jnp.ones((1,), jnp.int32),
                                 stats=stats)
  return rule.warm_start(pilot)


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
  args = parser.parse_args()
  rule = make_rule([float(x) for x in args.costs.split(",")])
  if args.batch > 1:
    rule = dataclasses.replace(
        rule, hysteresis=draft_length.BATCHED_HYSTERESIS)
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
  for alpha in (float(a) for a in args.alphas.split(",")):
    variants = {f"gamma={g}": (rule, g) for g in (1, 2, 4, 8)
                if g <= rule.gamma_max}
    variants.update({
        "auto": (rule, None),
        "auto counts": (dataclasses.replace(rule, estimator="accepted"),
                        None),
        "auto warm": (warm(rule, alpha), None),
        "auto warm -0.1": (warm(rule, alpha - 0.1), None),
        "auto warm +0.1": (warm(rule, alpha + 0.1), None),
        "auto posterior": (Posterior(**fields), None)})
    if args.batch > 1:
      variants["auto shrunk to the batch"] = (Shrunk(**fields), None)
      variants["auto shrunk by moments"] = (Moments(**fields), None)
    for prior in filter(None, args.priors.split(",")):
      a0, b0 = (float(x) for x in prior.split(":"))
      variants[f"auto prior {prior}"] = (
          dataclasses.replace(rule, prior=(a0, b0)), None)
    for m in filter(None, args.switch_costs.split(",")):
      variants[f"auto switch_cost {m}"] = (
          dataclasses.replace(rule, switch_cost=float(m)), None)
    for h in filter(None, args.hystereses.split(",")):
      variants[f"auto hysteresis {h}"] = (
          dataclasses.replace(rule, hysteresis=float(h)), None)
    if args.only:
      keep = args.only.split(",")
      variants = {k: v for k, v in variants.items()
                  if k.startswith("gamma=") or k in keep}
    speed = {}
    for name, (r, fixed) in variants.items():
      decide = decisions(r, args.batch)
      rng = np.random.default_rng(0)  # every variant sees the same rows
      speed[name] = args.tokens / np.mean(
          [simulate(r, decide, alpha, args.tokens, rng, fixed, args.batch,
                    args.spread, args.burst, args.switch,
                    args.overlap_var, args.change)
           for _ in range(args.runs)])
    best = max(v for k, v in speed.items() if k.startswith("gamma="))
    print(f"alpha {alpha:.2f}: " + "  ".join(
        f"{k} {v:.2f}x ({v / best:.3f})" for k, v in speed.items()),
          flush=True)


if __name__ == "__main__":
  main()
