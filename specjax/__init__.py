"""specjax: exact speculative decoding in JAX/Flax."""

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
from specjax.decode import GenerationResult
from specjax.decode import NonFiniteLogitsError
from specjax.decode import RowStats
from specjax.decode import VerifyOutput
from specjax.decode.draft_length import Confidence
from specjax.decode.draft_length import Goodput
from specjax.decode.draft_length import measure_goodput
from specjax.decode import draft_step
from specjax.decode import generate
from specjax.decode import speculative_generate
from specjax.decode import verify_step
from specjax.decode.tree import TreeTopology
from specjax.decode.verifiers import TreeVerifier
from specjax.decode.verifiers import Verifier
from specjax.decode.verifiers import available_verifiers
from specjax.decode.verifiers import get_verifier
from specjax.decode.verifiers import register_verifier
from specjax.models import CausalLM
from specjax.models import KVCache
from specjax.models import TransformerConfig
from specjax.models import TransformerLM
from specjax.models.ngram import NGramLM
from specjax.models.prompt_lookup import PromptLookupDraft
from specjax.models.self_draft import SelfDraft
from specjax.sampling import GREEDY
from specjax.sampling import SamplingConfig
from specjax.sampling import probabilities
from specjax.sampling import sample
from specjax.sharding import make_mesh

__version__ = "0.1.0"
