"""Draft distillation (DistillSpec, Zhou et al. 2023): fit q to the target's p.

Acceptance is sum_x min(p(x), q(x)) = 1 - TV(p, q) at every position, so a
draft should be trained to match the target's next-token *distribution*, not
the corpus' next token. `distillation_loss(divergence)` returns a
`losses.LossFn` that compares the student's distribution with a frozen
teacher's (the `aux` of `trainer.train`) at every position of a batch:

  forward_kl  KL(p || q): mass-covering, the usual knowledge-distillation loss.
  reverse_kl  KL(q || p): mode-seeking.
  tv          TV(p, q) itself: 1 - acceptance, the quantity speculative
              decoding pays for (DistillSpec's best choice for greedy and
              sampled decoding alike in several of their settings).

Both distributions go through the temperature of the decoding they serve
(`temperature`, 1.0 by default), since that is the p and q the coupling sees.

The data can be the corpus, or *on-policy* text the teacher generated from
corpus prompts (`teacher_corpus`), which is what the draft will be asked to
continue at decode time.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import data
from specjax import sampling as sampling_lib
from specjax.decode import loop
from specjax.train import losses

DIVERGENCES = ("forward_kl", "reverse_kl", "tv")


def divergence_BxT(divergence: str, teacher_logits_BxTxV: jax.Array,
                   student_logits_BxTxV: jax.Array) -> jax.Array:
  """float32 `[B, T]`: the divergence between p (teacher) and q (student)."""
  logp = jax.nn.log_softmax(teacher_logits_BxTxV.astype(jnp.float32), -1)
  logq = jax.nn.log_softmax(student_logits_BxTxV.astype(jnp.float32), -1)
  p, q = jnp.exp(logp), jnp.exp(logq)
  if divergence == "forward_kl":
    return jnp.sum(p * (logp - logq), axis=-1)
  if divergence == "reverse_kl":
    return jnp.sum(q * (logq - logp), axis=-1)
  if divergence == "tv":
    return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
  raise ValueError(f"divergence must be one of {DIVERGENCES}, got "
                   f"{divergence!r}.")


def distillation_loss(divergence: str = "tv", *,
                      temperature: float = 1.0) -> losses.LossFn:
  """A `LossFn` whose `aux` is the frozen teacher `TransformerLM`.

  The loss is the mean of `divergence` over non-PAD target positions; the
  metrics add `tv` (always) so runs with different divergences compare on
  the quantity that sets acceptance.
  """
  if divergence not in DIVERGENCES:
    raise ValueError(f"divergence must be one of {DIVERGENCES}, got "
                     f"{divergence!r}.")
  temperature = _checks.check_float("temperature", temperature)
  if temperature <= 0:
    raise ValueError("temperature must be > 0 for distillation (greedy "
                     f"decoding is served well by temperature 1), got "
                     f"{temperature}.")

  def loss_fn(module, batch, rng, teacher):
    del rng
    inputs_BxT, targets_BxT = losses.split_inputs_targets(batch["tokens"])
    teacher_BxTxV = jax.lax.stop_gradient(
        teacher.logits(inputs_BxT)) / temperature
    student_BxTxV = module(inputs_BxT) / temperature
    mask_BxT = losses.target_mask(targets_BxT)
    count = jnp.maximum(mask_BxT.sum(), 1.0)
    mean = lambda x_BxT: (x_BxT * mask_BxT).sum() / count
    loss = mean(divergence_BxT(divergence, teacher_BxTxV, student_BxTxV))
    tv = (loss if divergence == "tv" else
          mean(divergence_BxT("tv", teacher_BxTxV, student_BxTxV)))
    return loss, {"tv": jax.lax.stop_gradient(tv)}

  return loss_fn


def teacher_corpus(teacher, corpus: data.Corpus, directory: str, *,
                   num_sequences: int, prompt_len: int, new_tokens: int,
                   seed: int = 0, temperature: float = 1.0,
                   batch_size: int = 64) -> data.Corpus:
  """On-policy distillation data: the teacher's continuations of corpus prompts.

  Cuts `num_sequences` prompts of `prompt_len` tokens from the corpus'
  training split, samples `new_tokens` from the teacher after each (one
  compiled `generate` per batch), and writes prompt + continuation as one
  file per sequence under `directory`. Returns that directory as a corpus
  (held-out fraction 0: evaluation stays on the original held-out text).
  Files already present are reused, so a resumed run sees the same data.
  """
  num_sequences = _checks.check_int("num_sequences", num_sequences, low=1)
  prompt_len = _checks.check_int("prompt_len", prompt_len, low=1)
  new_tokens = _checks.check_int("new_tokens", new_tokens, low=1)
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  os.makedirs(directory, exist_ok=True)
  names = [os.path.join(directory, f"seq{i:06d}.txt")
           for i in range(num_sequences)]
  if not all(os.path.exists(n) for n in names):
    tokens_N = corpus.tokens("train").astype(np.int32)
    prompts_SxP = data.prompts(tokens_N, num_sequences, prompt_len, seed)
    sampling = sampling_lib.SamplingConfig(temperature=temperature)
    key = jax.random.key(seed)
    for start in range(0, num_sequences, batch_size):
      rows = np.arange(start, min(start + batch_size, num_sequences))
      # Pad the last batch to the full size: one compiled program.
      chunk = prompts_SxP[np.resize(rows, batch_size)]
      out = loop.generate(
          teacher, chunk, np.full(batch_size, prompt_len, np.int32),
          jax.random.fold_in(key, start), max_new_tokens=new_tokens,
          sampling=sampling)
      gen = np.asarray(out.tokens)
      for i, row in enumerate(rows):
        seq = np.concatenate([chunk[i], gen[i, :int(out.lengths[i])]])
        # Specials (BOS/EOS/PAD) are not bytes; the corpus frames each file
        # with BOS/EOS itself.
        with open(names[row], "wb") as fh:
          fh.write(bytes(int(t) for t in seq if t < 256))
  return data.text_corpus(directory, heldout_fraction=0.0)


def mean_tv(teacher, student, windows_NxBxT: np.ndarray, *,
            temperature: float = 1.0) -> float:
  """Mean TV(p, q) over every position of `windows` (int `[N, B, T]`).

  The per-position 1 - TV is the acceptance probability of a draft token
  there, so this is the number distillation should lower.
  """
  windows_NxBxT = _checks.check_array("windows", windows_NxBxT, rank=3,
                                      kind="i")

  @jax.jit
  def batch_tv(tokens_BxT):
    return divergence_BxT("tv", teacher.logits(tokens_BxT) / temperature,
                          student.logits(tokens_BxT) / temperature).mean()

  return float(np.mean([batch_tv(jnp.asarray(w)) for w in windows_NxBxT]))
