"""The lab's Markov chains as `CausalLM`s, so the REAL compiled loop runs on them.

`markov_lms(pair)` returns (target, draft) bigram `NGramLM`s whose logits at a
position are log p(. | token there) and log q(. | token there), taken from
the pair's transition tables. The loop always starts from a prompt, so the
first generated token follows the prompt's last token's row (the pair's
initial distributions are not used); compare the loop's output with
`specjax.lab.verifiers.process_law(..., context=last prompt token)`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from specjax.lab import markov
from specjax.models.ngram import NGramLM


def _bigram(trans_VxV: np.ndarray) -> NGramLM:
  if np.any(trans_VxV <= 0):
    raise ValueError("markov_lms needs strictly positive transition tables "
                     "(log 0 is not a finite logit); use a pair with finite "
                     "certainty, e.g. make_markov_pair(certainty=1.5).")
  vocab = trans_VxV.shape[-1]
  return NGramLM(log_probs=jnp.asarray(np.log(trans_VxV), jnp.float32),
                 vocab_size=vocab, order=2)


def markov_lms(pair: markov.MarkovPair) -> tuple[NGramLM, NGramLM]:
  """(target, draft) CausalLMs with logits log p(.|x), log q(.|x) (float32)."""
  if not isinstance(pair, markov.MarkovPair):
    raise TypeError("pair must be a specjax.lab.MarkovPair, got "
                    f"{type(pair).__name__}.")
  return _bigram(pair.target_trans_VxV), _bigram(pair.draft_trans_VxV)
