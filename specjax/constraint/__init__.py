"""Constrained decoding: the generated text must match a regular expression
or a JSON schema, and stays an exact sample of the constrained target.

`regex(pattern, tokenizer)` and `json_schema(schema, tokenizer)` compile a
`Constraint` (with outlines-core, an optional extra); `generate` and
`speculative_generate` take it as `constraint=` and mask the target's and
the draft's logits alike at every position they score (see `automaton`).
"""

from specjax.constraint.automaton import accepts
from specjax.constraint.automaton import advance
from specjax.constraint.automaton import allowed
from specjax.constraint.automaton import Constraint
from specjax.constraint.automaton import CONTROLS
from specjax.constraint.automaton import from_byte_dfa
from specjax.constraint.automaton import mask_logits
from specjax.constraint.compile import json_schema
from specjax.constraint.compile import regex
from specjax.data.token_bytes import token_bytes
