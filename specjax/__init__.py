"""specjax: exact speculative decoding in JAX/Flax.

Layers, from the bottom up; a layer imports only from the layers below it
(pyproject.toml's import-linter contracts, run by tests/test_layers.py):

  core     the math (`coupling`, `accounting`, `stats`), `sampling`,
           `models`, `decode`, `data`, `train`, `sharding`, `distributed`:
           what a user decodes and trains with. It never times itself.
  oracle   `lab` (exact enumeration on toy Markov models, negative controls)
           and `testing` (the statistical harness): they reach the core only
           through its public API and compute laws with their own code.
  harness  `specjax.harness`: the zoo, the sweep, timers and the cost model,
           goodput autotuning, figures and tables, expected-token and
           distortion estimates, the draft registry, text generation.

Above them, the entry points (`experiments/`, `configs/`, `benchmarks/`,
`colab/`) parse flags or configs and call the library.
"""

import importlib.abc
import sys

from specjax import _moved
from specjax.accounting import batch_speedups
from specjax.accounting import crossover_batch
from specjax.accounting import expected_rounds
from specjax.accounting import expected_tokens_per_call
from specjax.accounting import expected_tokens_per_pass
from specjax.accounting import loop_speedup
from specjax.accounting import operations_increase
from specjax.accounting import optimal_gamma
from specjax.accounting import rounds_distribution
from specjax.accounting import walltime_improvement
from specjax.coupling import acceptance_probability
from specjax.coupling import coupling_sample
from specjax.coupling import residual
from specjax.coupling import tv_distance
from specjax.decode import draft_step
from specjax.decode import generate
from specjax.decode import GenerationResult
from specjax.decode import NonFiniteLogitsError
from specjax.decode import RowStats
from specjax.decode import speculative_generate
from specjax.decode import verify_step
from specjax.decode import VerifyOutput
from specjax.decode.draft_length import Confidence
from specjax.decode.draft_length import Goodput
from specjax.decode.tree import TreeTopology
from specjax.decode.verifiers import available_verifiers
from specjax.decode.verifiers import get_verifier
from specjax.decode.verifiers import register_verifier
from specjax.decode.verifiers import TreeVerifier
from specjax.decode.verifiers import Verifier
from specjax.models import CausalLM
from specjax.models import KVCache
from specjax.models import TransformerConfig
from specjax.models import TransformerLM
from specjax.models.eagle import EagleDraft
from specjax.models.eagle import EagleHead
from specjax.models.exit_adapter import ExitAdapter
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models.self_draft import SelfDraft
from specjax.sampling import GREEDY
from specjax.sampling import probabilities
from specjax.sampling import sample
from specjax.sampling import SamplingConfig
from specjax.sharding import make_mesh

__version__ = "0.1.0"

# Names that moved to the harness: `import specjax.zoo` and
# `specjax.measure_goodput` raise an error naming the new home.
_MOVED_MODULES = {f"specjax.{name}": f"specjax.harness.{name}" for name in (
    "zoo", "sweep", "measure", "figures", "expected_tokens", "distortion",
    "textgen")}
__getattr__ = _moved.module_getattr("specjax", {
    "measure_goodput": "specjax.harness.autotune.measure_goodput",
    "expected_tokens_per_round":
        "specjax.harness.expected_tokens.expected_tokens_per_round",
    **{old.split(".")[1]: new for old, new in _MOVED_MODULES.items()},
})


class _MovedFinder(importlib.abc.MetaPathFinder):
  """Refuses `import specjax.<moved>` with the module's new home."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    new = _MOVED_MODULES.get(fullname)
    if new is not None:
      raise ImportError(f"{fullname} moved to {new} (the research harness, "
                        "above the core); import it from there.",
                        name=fullname)
    return None


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
  sys.meta_path.insert(0, _MovedFinder())
