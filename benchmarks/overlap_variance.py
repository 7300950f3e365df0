r"""Why `Goodput` counts overlaps: the variance of the two acceptance estimates.

  python benchmarks/overlap_variance.py [DRAFTS]   # comma-separated

DRAFTS as `experiments.adaptive_gamma --drafts` names them (default:
bigram,distilled-draft-0.1m@target-3m). On 16 held-out windows of 192
bytes, teacher-forced, the quick job's target-3m against each draft at
T = 1, per position past each window's 8th byte: the
overlap o = sum_x min(p, q), a draft's keep probability under the exact
token verifier. A kept-or-not count is a Bernoulli(o) draw, of variance
alpha (1 - alpha) per draft (alpha the mean o); the overlap itself varies
only as much as o does across positions, Var(o). The difference,
E[o (1 - o)], is what counting o instead of the draw removes
(`Goodput(estimator="overlap")`, the default). Counts, not timings.
"""

import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from absl import flags  # noqa: E402
import specjax as sj  # noqa: E402
from specjax import data  # noqa: E402
from specjax.harness import distortion  # noqa: E402
from specjax.harness import drafts as drafts_lib  # noqa: E402
from configs import reproduce  # noqa: E402


def main():
  drafts = (sys.argv[1] if len(sys.argv) > 1
            else "bigram,distilled-draft-0.1m@target-3m").split(",")
  flags.FLAGS(sys.argv[:1])  # the experiment's loaders read its flags
  target = drafts_lib.load_target(reproduce.get_config("quick"))
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  windows_NxT = jnp.asarray(data.prompts(heldout, 16, 192, 1))
  sampling = sj.SamplingConfig(temperature=1.0)
  p_NxTxV = distortion._laws(target, windows_NxT, sampling)
  for name in drafts:
    draft = drafts_lib.make_draft(name, target,
                                  config=reproduce.get_config("quick")).model
    q_NxTxV = distortion._laws(draft, windows_NxT, sampling)
    o = np.asarray(jnp.minimum(p_NxTxV, q_NxTxV).sum(-1)[:, 8:]).ravel()
    alpha = o.mean()
    print(f"{name}: alpha {alpha:.3f}; per judged draft, variance of the "
          f"count {alpha * (1 - alpha):.4f}, of the overlap {o.var():.4f} "
          f"({alpha * (1 - alpha) / o.var():.0f}x less)")


if __name__ == "__main__":
  main()
