"""The rejection-sampling lab: the exactness oracle.

Toy Markov target/draft pairs over 8 tokens whose every distribution can be
enumerated exactly in float64: the distribution of the first N tokens under
the full speculative process (`speculative_distribution`), its exact TV to the
target (`exact_tv`, 0 up to rounding for the residual rule and clearly positive
for the negative controls), the exact outcome of one coupling step for
checking samplers (`coupling_table`), and a seeded trace with a cost ledger
(`run_trace`). `specjax.lab.audit` is the full audit (`python -m
experiments.lab_audit` prints it); `specjax.lab.controls` defines the negative
controls once for the lab, the harness (`specjax.testing`) and the tests.
"""

from specjax.lab.exact import CouplingTable
from specjax.lab.exact import RULES
from specjax.lab.exact import acceptance_rates
from specjax.lab.exact import chain_blocks
from specjax.lab.exact import coupling_table
from specjax.lab.exact import exact_tv
from specjax.lab.exact import round_distribution
from specjax.lab.exact import speculative_distribution
from specjax.lab.exact import target_distribution
from specjax.lab.exact import tv
from specjax.lab.markov import DEFAULT_CERTAINTY
from specjax.lab.markov import DEFAULT_DRAFT_MATCH
from specjax.lab.markov import DEFAULT_SEED
from specjax.lab.markov import VOCAB_SIZE
from specjax.lab.markov import MarkovPair
from specjax.lab.markov import make_markov_pair
from specjax.lab.trace import DEFAULT_NUM_TOKENS
from specjax.lab.trace import Trace
from specjax.lab.trace import run_trace
from specjax.lab.verifiers import paper_example
from specjax.lab.verifiers import process_law
from specjax.lab.verifiers import round_law
from specjax.lab.verifiers import verifier_tv
