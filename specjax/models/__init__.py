"""Models: anything mapping `(tokens[B, T], cache) -> (logits[B, T, V], cache)`."""

from specjax.models.cache import KVCache
from specjax.models.exit_adapter import ExitAdapter
from specjax.models.exit_adapter import ExitAdapterConfig
from specjax.models.protocol import CausalLM
from specjax.models.string_level import StringLevelDraft
from specjax.models.string_rejection import StringRejectionDraft
from specjax.models.token_intersection import TokenIntersectionDraft
from specjax.models.transformer import TransformerConfig
from specjax.models.transformer import TransformerLM
from specjax.models.vocab import PaddedVocabLM
from specjax.models.vocab import ReducedVocabLM
