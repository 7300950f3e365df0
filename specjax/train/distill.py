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

import hashlib
import json
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import data
from specjax import sampling as sampling_lib
from specjax.decode import loop
from specjax.train import checkpoint as checkpoint_lib
from specjax.train import losses

DIVERGENCES = ("forward_kl", "reverse_kl", "tv")
# Part of every teacher_corpus key: bump when the files' meaning changes.
TEACHER_CORPUS_FORMAT = "specjax.teacher_corpus/2"


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


def check_divergence(divergence) -> str:
  """`divergence` if it is one of `DIVERGENCES`; a ValueError naming them if
  not (before tracing: `divergence_BxT` would raise only inside a trace)."""
  if divergence not in DIVERGENCES:
    raise ValueError(f"divergence must be one of {DIVERGENCES}, got "
                     f"{divergence!r}.")
  return divergence


def check_vocabularies(teacher_vocab: int, student_vocab: int) -> None:
  """Raises unless teacher and student score the same vocabulary (p and q
  are compared token by token)."""
  if teacher_vocab != student_vocab:
    raise ValueError(
        f"the teacher's vocab_size is {teacher_vocab} and the student's "
        f"{student_vocab}: distillation compares p and q token by token, so "
        "give the student the teacher's vocabulary.")


def check_temperature(temperature, why: str) -> float:
  """`temperature` as a float in [MIN_TEMPERATURE, MAX_TEMPERATURE]: the
  logits are divided by it, and outside that range float32 logits overflow
  (a TV of inf, a loss of NaN) just as they would in decoding."""
  temperature = _checks.check_float("temperature", temperature)
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0 {why}, got {temperature}.")
  sampling_lib.SamplingConfig(temperature=temperature)  # raises, naming it
  return temperature


def _check_teacher(teacher) -> None:
  if not callable(getattr(teacher, "logits", None)):
    raise TypeError("aux must be the frozen teacher (a TransformerLM, with "
                    f"a .logits method), got {type(teacher).__name__}.")


def distillation_loss(divergence: str = "tv", *,
                      temperature: float = 1.0) -> losses.LossFn:
  """A `LossFn` whose `aux` is the frozen teacher `TransformerLM`.

  The loss is the mean of `divergence` over non-PAD target positions; the
  metrics add `tv` (always) so runs with different divergences compare on
  the quantity that sets acceptance. The batch is checked as
  `losses.check_tokens` says (ids only on an eager call), against the
  student's max_positions and the teacher's vocabulary.
  """
  check_divergence(divergence)
  temperature = check_temperature(
      temperature, "for distillation (greedy decoding is served well by "
      "temperature 1)")

  def check_aux(student_config, teacher):
    # What the traced loss checks, before `trainer.train` does any work:
    # else an int aux would reach the loss as a tracer, and a vocabulary
    # mismatch be found only while the step is traced, after the workdir is
    # made.
    _check_teacher(teacher)
    teacher_vocab = losses.module_limits(teacher)[0]
    student_vocab = getattr(student_config, "vocab_size", None)
    if teacher_vocab is not None and student_vocab is not None:
      check_vocabularies(teacher_vocab, student_vocab)

  def loss_fn(module, batch, rng, teacher):
    del rng
    _check_teacher(teacher)
    # The student's max_positions where it records it (a bare logits
    # function, e.g. a SelfDraft's, checks its own); the teacher's
    # vocabulary, which the student must share.
    max_positions = losses.module_limits(module)[1]
    vocab_size = losses.module_limits(teacher)[0]
    tokens_BxT1 = losses.check_tokens(losses.batch_tokens(batch),
                                      max_positions=max_positions,
                                      whose="the student's ")
    losses.check_tokens(tokens_BxT1, vocab_size=vocab_size,
                        whose="the teacher's ")
    inputs_BxT, targets_BxT = losses.split_inputs_targets(tokens_BxT1)
    teacher_BxTxV = jax.lax.stop_gradient(
        teacher.logits(inputs_BxT)) / temperature
    student_BxTxV = module(inputs_BxT) / temperature
    # Static shapes: raised while the step is first traced, before any run.
    check_vocabularies(teacher_BxTxV.shape[-1], student_BxTxV.shape[-1])
    if vocab_size is None:  # a teacher that does not record it
      vocab_size = teacher_BxTxV.shape[-1]
      losses.check_tokens(tokens_BxT1, vocab_size=vocab_size,
                          whose="the teacher's ")
    mask_BxT = losses.target_mask(targets_BxT, losses.pad_id_for(vocab_size))
    count = jnp.maximum(mask_BxT.sum(), 1.0)
    mean = lambda x_BxT: (x_BxT * mask_BxT).sum() / count
    loss = mean(divergence_BxT(divergence, teacher_BxTxV, student_BxTxV))
    tv = (loss if divergence == "tv" else
          mean(divergence_BxT("tv", teacher_BxTxV, student_BxTxV)))
    return loss, {"tv": jax.lax.stop_gradient(tv)}

  loss_fn.check_aux = check_aux  # called by `trainer.train` before tracing
  return loss_fn


def _model_identity(model) -> dict:
  """What identifies a model's outputs: its type, config and parameters."""
  return {"type": f"{type(model).__module__}.{type(model).__qualname__}",
          "config": repr(getattr(model, "config", None)),
          "vocab_size": int(model.vocab_size),
          "params_sha256": checkpoint_lib.tree_checksum(model)}


def teacher_corpus(teacher, corpus: data.Corpus, directory: str, *,
                   num_sequences: int, prompt_len: int, new_tokens: int,
                   seed: int = 0, temperature: float = 1.0,
                   batch_size: int = 64) -> data.Corpus:
  """On-policy distillation data: the teacher's continuations of corpus prompts.

  Cuts `num_sequences` prompts of `prompt_len` tokens from the corpus'
  training split, samples `new_tokens` from the teacher after each (one
  compiled `generate` per batch), and writes prompt + continuation as one
  file per sequence. Returns them as a corpus (held-out fraction 0:
  evaluation stays on the original held-out text).

  The files live in `directory/<key>/`, where the key is a sha256 over every
  argument that shapes them: the teacher (type, config, and a checksum of its
  parameters), the corpus' content, num_sequences, prompt_len, new_tokens,
  seed, temperature and batch_size (which sets the per-batch keys); the
  arguments are recorded in `directory/<key>.json`. A later call with the
  same arguments reuses the files (a resumed run sees the same data); any
  change makes a new set, never the old one. The set is written to a
  temporary directory and renamed into place, so it is complete or absent.
  """
  num_sequences = _checks.check_int("num_sequences", num_sequences, low=1)
  prompt_len = _checks.check_int("prompt_len", prompt_len, low=1)
  new_tokens = _checks.check_int("new_tokens", new_tokens, low=1)
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  seed = _checks.check_int("seed", seed, low=0)
  # Up front, not where the sampling starts: raises naming temperature.
  temperature = sampling_lib.SamplingConfig(temperature=temperature).temperature
  if not isinstance(corpus, data.Corpus):
    raise TypeError("corpus must be a specjax.data.Corpus (e.g. "
                    f"data.text_corpus(path)), got {type(corpus).__name__}.")
  if not _checks.dir_or_creatable(directory):
    raise NotADirectoryError(
        f"directory={directory!r} is not a directory and cannot be created "
        "there (it, or a parent, is a file or not writable).")
  losses.check_vocab_size(getattr(teacher, "vocab_size", None),
                          "the teacher's vocab_size",
                          "distil from a teacher over the byte vocabulary.")
  max_positions = getattr(teacher, "max_positions", None)
  # Sampling the last new token reads position prompt_len + new_tokens - 2.
  if (isinstance(max_positions, int)
      and prompt_len + new_tokens - 1 > max_positions):
    raise ValueError(
        f"prompt_len={prompt_len} and new_tokens={new_tokens} need "
        f"prompt_len + new_tokens - 1 = {prompt_len + new_tokens - 1} "
        f"positions, more than the teacher's max_positions={max_positions}: "
        "lower prompt_len or new_tokens.")
  fingerprint = corpus.fingerprint()
  manifest = {
      "format": TEACHER_CORPUS_FORMAT,
      "teacher": _model_identity(teacher),
      "corpus": {k: fingerprint[k] for k in ("sha256", "bytes",
                                             "heldout_fraction", "tokenizer")},
      "num_sequences": num_sequences, "prompt_len": prompt_len,
      "new_tokens": new_tokens, "seed": seed, "temperature": temperature,
      "batch_size": batch_size}
  key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()
                       ).hexdigest()[:16]
  final = os.path.join(os.path.abspath(directory), key)
  if not os.path.isdir(final):
    os.makedirs(directory, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{key}-", dir=directory)
    try:
      _write_teacher_text(teacher, corpus, tmp, manifest)
      with open(final + ".json", "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
      try:
        os.rename(tmp, final)
      except OSError:
        if not os.path.isdir(final):  # not a concurrent writer's finished set
          raise
    finally:
      if os.path.isdir(tmp):
        shutil.rmtree(tmp)
  return data.text_corpus(final, heldout_fraction=0.0)


def _write_teacher_text(teacher, corpus, directory: str, m: dict) -> None:
  """Samples and writes the files of `teacher_corpus` (args in `m`)."""
  num_sequences, batch_size = m["num_sequences"], m["batch_size"]
  tokens_N = corpus.tokens("train").astype(np.int32)
  prompts_SxP = data.prompts(tokens_N, num_sequences, m["prompt_len"],
                             m["seed"])
  sampling = sampling_lib.SamplingConfig(temperature=m["temperature"])
  key = jax.random.key(m["seed"])
  for start in range(0, num_sequences, batch_size):
    rows = np.arange(start, min(start + batch_size, num_sequences))
    # Pad the last batch to the full size: one compiled program.
    chunk = prompts_SxP[np.resize(rows, batch_size)]
    out = loop.generate(
        teacher, chunk, np.full(batch_size, m["prompt_len"], np.int32),
        jax.random.fold_in(key, start), max_new_tokens=m["new_tokens"],
        sampling=sampling)
    gen = np.asarray(out.tokens)
    for i, row in enumerate(rows):
      seq = np.concatenate([chunk[i], gen[i, :int(out.lengths[i])]])
      # Specials (BOS/EOS/PAD) are not bytes; the corpus frames each file
      # with BOS/EOS itself.
      with open(os.path.join(directory, f"seq{row:06d}.txt"), "wb") as fh:
        fh.write(bytes(int(t) for t in seq if t < 256))


def mean_tv(teacher, student, windows_NxBxT: np.ndarray, *,
            temperature: float = 1.0) -> float:
  """Mean TV(p, q) over every position of `windows` (int `[N, B, T]`).

  The per-position 1 - TV is the acceptance probability of a draft token
  there, so this is the number distillation should lower. Raises, naming
  the argument, unless temperature > 0, N >= 1 and every id lies in the
  (shared) vocabulary.
  """
  temperature = check_temperature(temperature, "(it divides the logits)")
  windows_NxBxT = np.asarray(_checks.check_array("windows", windows_NxBxT,
                                                 rank=3, kind="i"))
  if windows_NxBxT.shape[0] < 1:
    raise ValueError("windows must hold at least one window batch (int "
                     f"[N, B, T] with N >= 1), got shape "
                     f"{windows_NxBxT.shape}.")
  check_vocabularies(teacher.vocab_size, student.vocab_size)
  _checks.check_token_range("windows", windows_NxBxT, teacher.vocab_size,
                            whose="the teacher's ")

  @jax.jit
  def batch_tv(tokens_BxT):
    return divergence_BxT("tv", teacher.logits(tokens_BxT) / temperature,
                          student.logits(tokens_BxT) / temperature).mean()

  return float(np.mean([batch_tv(jnp.asarray(w)) for w in windows_NxBxT]))
