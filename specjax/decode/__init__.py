"""Decoding: draft/verify steps and whole compiled generations."""

from specjax.decode.loop import generate
from specjax.decode.loop import prompt_bucket
from specjax.decode.loop import speculative_generate
from specjax.decode.state import DecodeState
from specjax.decode.state import GenerationResult
from specjax.decode.state import RowStats
from specjax.decode.steps import VerifyOutput
from specjax.decode.steps import draft_step
from specjax.decode.steps import verify_step
from specjax.decode.steps import nonfinite_rows
from specjax.decode.validation import NonFiniteLogitsError
