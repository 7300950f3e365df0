r"""Decode speed: `generate` vs `speculative_generate`, measured and predicted.

  python benchmarks/decode.py --target=byte-85m --draft=truncated:0 \
      --batch=1 --gamma=4 --max_new_tokens=256 --prompt_len=64 --repeats=5

One run measures, for one target, one draft, batch and gamma (after
compilation; every number is the median of `--repeats` runs, the variants
interleaved so that a loaded machine slows them alike):

* tokens/s of whole `generate` and `speculative_generate` calls;
* alpha (accepted / judged drafts) of the speculative run;
* c = draft forward (T=1) / target forward (T=1), and r = target forward on
  gamma + 1 tokens / target forward on 1 token, each timed as jitted loops of
  cached forward passes at a cache length from the middle of the generation;
* the speedup `walltime_improvement(alpha, gamma, c, r)` predicts from those
  measured values, the measured speedup, and their ratio (efficiency);
* the rate at which autoregressive decoding streams the target's weights
  (param bytes * target steps/s) against the machine's memory copy bandwidth
  and against the fastest XLA reads those weights (a sum over them);
* the share of a round spent outside the two models' forward passes
  (sampling, coupling, token and cache bookkeeping): the same
  `speculative_generate` with both models replaced by stubs that keep real-size
  KV caches and write them as the models do, but compute no layers.

Drafts (`--draft`), until trained drafts exist:
  truncated:N   the target's embeddings, first N blocks, final norm and head
                (truncated:0 of byte-85m is a 0.99M-parameter draft);
  perturbed:S   the whole target with Gaussian noise of S times each weight
                array's RMS added (alpha near 1, but c near 1);
  small:D,L     an independent random model of the target's flavour with width
                D and L layers;
  PRESET        an independent random model from `TransformerConfig.PRESETS`.
The table names the draft used. An untrained GPT-2 target (tied embeddings)
is near-uniform at temperature 1, but its argmax mostly repeats the current
token, as does any shallow draft's: greedy, truncated:0 of byte-85m agrees
with it ~95% of the time (and ~2% at temperature 1, where truncated:1 gets
~70%). `--target_logit_scale` multiplies the target's final-norm scale (so
its logits) to make it peakier or flatter.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, ClassVar

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

import specjax as sj
from specjax import measure
from specjax.decode import loop as decode_loop
from specjax.models import KVCache
from specjax.models import TransformerConfig
from specjax.models import TransformerLM
from specjax.models import transformer as transformer_lib

_TARGET = flags.DEFINE_string("target", "byte-85m", "Target preset name.")
_DRAFT = flags.DEFINE_string(
    "draft", "truncated:0",
    "'truncated:N', 'perturbed:S', 'small:D,L' or a preset name.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows decoded together.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per round.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Tokens per row.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per variant.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.0, "Sampling temperature; 0 is greedy.")
_LOGIT_SCALE = flags.DEFINE_float(
    "target_logit_scale", 1.0, "Multiplies the target's final-norm scale.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights, prompts and keys.")
_LOOP_SECONDS = flags.DEFINE_float(
    "loop_seconds", 0.5, "Duration of the timed loops of forward passes that "
    "give c and r (each is also run at twice the length; the difference is "
    "what is timed).")
_COPY_MB = flags.DEFINE_integer(
    "copy_mb", 512, "Array size for the memory bandwidth measurement.")


# ----------------------------------------------------------------- models --


def _truncated(target: TransformerLM, num_layers: int) -> TransformerLM:
  """The target's bottom `num_layers` blocks with its embeddings and head."""
  if not 0 <= num_layers <= target.config.num_layers:
    raise ValueError(f"truncated:{num_layers} needs 0 <= N <= "
                     f"{target.config.num_layers}.")
  # TransformerConfig requires >= 1 layer: build with max(N, 1) blocks, keep
  # N, and for N = 0 set the field afterwards (a KV cache of zero layers).
  config = dataclasses.replace(target.config, num_layers=max(num_layers, 1))
  module = transformer_lib.Transformer(config, nnx.Rngs(0))
  source = target.module()
  for name in ("embed", "pos_embed", "final_norm", "lm_head"):
    if hasattr(source, name):
      setattr(module, name, getattr(source, name))
  module.blocks = nnx.List([source.blocks[i] for i in range(num_layers)])
  if num_layers == 0:
    object.__setattr__(config, "num_layers", 0)
  return TransformerLM.from_module(module)


def _perturbed(target: TransformerLM, scale: float, seed: int) -> TransformerLM:
  leaves, treedef = jax.tree.flatten(target.state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jnp.sqrt(jnp.mean(x * x)) * jax.random.normal(k, x.shape)
           for x, k in zip(leaves, keys)]
  return target.replace(state=jax.tree.unflatten(treedef, noisy))


def make_draft(spec: str, target: TransformerLM, seed: int
               ) -> tuple[TransformerLM, str]:
  """A draft from `--draft` and a one-line description of it."""
  kind, _, arg = spec.partition(":")
  if kind == "truncated":
    draft = _truncated(target, int(arg))
    what = (f"target truncated to its first {arg} of "
            f"{target.config.num_layers} blocks (shared embeddings and head)")
  elif kind == "perturbed":
    scale = float(arg or 0.1)
    draft = _perturbed(target, scale, seed + 1)
    what = f"target + Gaussian noise of {scale} x each array's RMS"
  elif kind == "small":
    d, layers = (int(x) for x in arg.split(","))
    draft = TransformerLM.create(dataclasses.replace(
        target.config, d_model=d, num_layers=layers,
        num_heads=max(1, d // 64), num_kv_heads=None, head_dim=None,
        mlp_dim=None), seed + 1)
    what = f"independent random model, d_model {d}, {layers} layers"
  elif spec in transformer_lib.PRESETS:
    draft = TransformerLM.create(TransformerConfig.preset(spec), seed + 1)
    what = f"independent random '{spec}'"
  else:
    raise app.UsageError(f"Unknown --draft {spec!r}.")
  return draft, f"{spec}: {what}, {draft.param_count() / 1e6:.2f}M params"


class StubLM(struct.PyTreeNode):
  """A `CausalLM` with a real-size KV cache but no layers: a bigram table.

  Each call writes zeros into every layer of the cache at the new positions,
  as the Transformer does, and returns `table[tokens]`; so a generation with
  stubs costs everything a real one does except the models' arithmetic.
  """
  config: TransformerConfig = struct.field(pytree_node=False)
  table: jax.Array  # float32 [V, V] logits of the next token given this one
  one_hot_q: ClassVar[bool] = False

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def max_positions(self) -> int:
    return self.config.max_positions

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    c = self.config
    return KVCache.create(num_layers=c.num_layers, batch_size=batch_size,
                          max_len=max_len, num_kv_heads=c.num_kv_heads,
                          head_dim=c.head_dim, dtype=c.dtype)

  def __call__(self, tokens_BxT, cache):
    b, t = tokens_BxT.shape
    positions_BxT = cache.positions(t)
    c = self.config
    kv_BxTxKxH = jnp.zeros((b, t, c.num_kv_heads, c.head_dim), c.dtype)
    for layer in range(cache.num_layers):
      cache = cache.write(layer, kv_BxTxKxH, kv_BxTxKxH, positions_BxT)
    return (self.table[tokens_BxT],
            cache.replace(lengths=positions_BxT[:, -1] + 1))


def _stub(model: TransformerLM, table: jax.Array) -> StubLM:
  return StubLM(config=model.config, table=table)


# ----------------------------------------------------------------- timing --


def _copy_calls(megabytes: int) -> tuple[dict[str, Callable[[], Any]], int]:
  """Calls that each copy `megabytes`, and the bytes one moves (read + write).

  numpy copies on one thread into a preallocated array; XLA's elementwise
  `x + 1` runs on all threads and, donated, writes into the buffer it reads
  (no fresh pages to fault in).
  """
  n = megabytes * 2**20 // 4
  src = np.ones(n, np.float32)
  dst = np.empty_like(src)
  xla_copy = jax.jit(lambda x: x + 1.0, donate_argnums=0)
  box = [jnp.ones(n, jnp.float32)]

  def xla():
    box[0] = xla_copy(box[0])
    return box[0]

  calls = {"copy numpy": lambda: np.copyto(dst, src), "copy XLA": xla}
  return calls, 2 * src.nbytes


# ------------------------------------------------------------------- main --


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  batch, gamma, new = _BATCH.value, _GAMMA.value, _MAX_NEW.value
  sampling = (sj.GREEDY if _TEMPERATURE.value == 0 else
              sj.SamplingConfig(temperature=_TEMPERATURE.value))

  target = TransformerLM.create(TransformerConfig.preset(_TARGET.value),
                                _SEED.value)
  if _LOGIT_SCALE.value != 1.0:
    scale = _LOGIT_SCALE.value
    module = target.module()
    norm_scale = module.final_norm.scale
    norm_scale.set_value(norm_scale.get_value() * scale)
    target = TransformerLM.from_module(module)
  draft, draft_desc = make_draft(_DRAFT.value, target, _SEED.value)

  rng = np.random.default_rng(_SEED.value)
  prompts = rng.integers(0, 256, size=(batch, _PROMPT_LEN.value),
                         dtype=np.int32)
  lengths = np.full((batch,), _PROMPT_LEN.value, np.int32)
  key = jax.random.key(_SEED.value)

  # The generation's own cache size, and a fill from its middle.
  width = decode_loop.prompt_bucket(_PROMPT_LEN.value)
  cache_len = min(width + new + gamma + 1, target.max_positions)
  fill = min(_PROMPT_LEN.value + new // 2, cache_len - gamma - 1)

  rand_table = jax.random.normal(jax.random.key(1), (target.vocab_size,) * 2)
  stub_target, stub_draft = _stub(target, rand_table), _stub(draft, rand_table)

  ar = functools.partial(sj.generate, target, prompts, lengths, key,
                         max_new_tokens=new, sampling=sampling)
  spec = functools.partial(sj.speculative_generate, target, draft, prompts,
                           lengths, key, gamma=gamma, max_new_tokens=new,
                           sampling=sampling)
  stub_spec = functools.partial(sj.speculative_generate, stub_target,
                                stub_draft, prompts, lengths, key, gamma=gamma,
                                max_new_tokens=new, sampling=sampling)
  stub_ar = functools.partial(sj.generate, stub_target, prompts, lengths, key,
                              max_new_tokens=new, sampling=sampling)
  prefill = jax.jit(decode_loop._prefill, static_argnums=2)
  padded = jnp.zeros((batch, width), jnp.int32).at[:, :_PROMPT_LEN.value].set(
      prompts[:, :width])
  lengths_j = jnp.asarray(lengths)
  buffer_len = width + new + gamma + 1
  fns = {
      "generate": ar, "speculative": spec,
      "stub speculative": stub_spec, "stub generate": stub_ar,
  }
  passes = {}  # name -> n: the loops "name xn" and "name x2n"
  for name, model, tokens in (("target T=1", target, 1),
                              (f"target T={gamma + 1}", target, gamma + 1),
                              ("draft T=1", draft, 1)):
    n, once, twice = measure.forward_loops(model, batch, tokens, cache_len, fill,
                                    _LOOP_SECONDS.value)
    passes[name] = n
    fns[f"{name} x{n}"], fns[f"{name} x{2 * n}"] = once, twice
  fns |= {
      "target prefill": lambda: prefill(target, padded, buffer_len, lengths_j),
      "draft prefill": lambda: prefill(draft, padded, buffer_len, lengths_j),
  }
  copy_fns, copy_bytes = _copy_calls(_COPY_MB.value)
  fns.update(copy_fns)
  # The fastest XLA reads the target's weights: a sum over every array.
  params = jax.tree.leaves(target.state)
  read_all = jax.jit(lambda leaves: sum(jnp.sum(x) for x in leaves))
  fns["read weights"] = lambda: read_all(params)
  load_before = os.getloadavg()[0]
  t = measure.median_times(fns, _REPEATS.value)
  load_after = os.getloadavg()[0]

  ar_out, spec_out, stub_out = ar(), spec(), stub_spec()
  s = spec_out.summary()
  if sampling.greedy:  # a cheap end-to-end check of exactness
    np.testing.assert_array_equal(ar_out.tokens, spec_out.tokens)

  per_pass = lambda name: (t[f"{name} x{2 * passes[name]}"]
                           - t[f"{name} x{passes[name]}"]) / passes[name]
  t1, tg = per_pass("target T=1"), per_pass(f"target T={gamma + 1}")
  td = per_pass("draft T=1")
  c, r = td / t1, tg / t1
  alpha = s["alpha_hat"]
  predicted = float(sj.walltime_improvement(alpha, gamma, c, r))
  expected = float(sj.expected_tokens_per_pass(alpha, gamma))
  tokens = int(np.asarray(ar_out.lengths).sum())
  assert tokens == s["generated_tokens"]
  ar_tps = tokens / t["generate"]
  spec_tps = tokens / t["speculative"]
  measured = spec_tps / ar_tps
  # Decode only: the calls minus their prefills.
  ar_decode = t["generate"] - t["target prefill"]
  spec_decode = t["speculative"] - t["target prefill"] - t["draft prefill"]
  measured_decode = ar_decode / spec_decode
  # Loop iterations = the most rounds any row ran.
  rounds = int(np.asarray(spec_out.stats.rounds).max())
  stub_rounds = int(np.asarray(stub_out.stats.rounds).max())
  round_s = spec_decode / rounds
  stub_round_s = t["stub speculative"] / stub_rounds
  ar_step_s = ar_decode / new
  stub_ar_step_s = t["stub generate"] / new
  param_bytes = sum(x.nbytes for x in params)
  stream = param_bytes / ar_step_s
  read_bw = param_bytes / t["read weights"]
  bandwidth = {k: copy_bytes / t[f"copy {k}"] for k in ("numpy", "XLA")}
  copy_bw = max(bandwidth.values())
  ms = lambda x: f"{x * 1e3:.3f} ms" if x < 1e-2 else f"{x * 1e3:.2f} ms"

  rows = [
      ("target", f"{_TARGET.value}: {target.param_count() / 1e6:.2f}M params"
       + ("" if _LOGIT_SCALE.value == 1 else
          f", final-norm scale x{_LOGIT_SCALE.value:g}")),
      ("draft", draft_desc),
      ("setup", f"batch {batch}, gamma {gamma}, prompt {_PROMPT_LEN.value}, "
                f"max_new_tokens {new}, temperature {sampling.temperature:g}"
                f"{' (greedy)' if sampling.greedy else ''}, cache {cache_len}"
                " slots"),
      ("machine", f"{os.cpu_count()} CPUs ({jax.devices()[0].platform}), "
                  f"load average {load_before:.1f} -> {load_after:.1f} "
                  "(shared with other jobs: timings are noisy); medians of "
                  f"{_REPEATS.value} interleaved runs"),
      ("", ""),
      ("generate", f"{ar_tps:9.1f} tokens/s  ({t['generate'] * 1e3:.0f} ms "
                   f"per call, prefill {t['target prefill'] * 1e3:.1f} ms)"),
      ("speculative_generate",
       f"{spec_tps:9.1f} tokens/s  ({t['speculative'] * 1e3:.0f} ms per call, "
       f"{rounds} rounds, draft prefill {t['draft prefill'] * 1e3:.1f} ms)"),
      ("alpha (measured)", f"{alpha:.3f}  (1 - TV {s['one_minus_tv']:.3f}; "
                           f"{s['tokens_per_target_call']:.2f} tokens per "
                           f"target call, formula {expected:.2f})"),
      ("target forward T=1", f"{ms(t1)}  (cache {fill} of {cache_len} slots)"),
      (f"target forward T={gamma + 1}", ms(tg)),
      ("draft forward T=1", ms(td)),
      ("c = draft / target", f"{c:.4f}"),
      (f"r = T={gamma + 1} / T=1", f"{r:.3f}"),
      ("speedup predicted", f"{predicted:.2f}x  = walltime_improvement("
                            "alpha, gamma, c, r)"),
      ("speedup measured", f"{measured:.2f}x  (whole calls; decode only, "
                           f"prefill excluded: {measured_decode:.2f}x)"),
      ("efficiency", f"{measured / predicted:.3f}  = measured / predicted "
                     f"(decode only: {measured_decode / predicted:.3f})"),
      ("", ""),
      ("copy bandwidth", f"{copy_bw / 1e9:.1f} GB/s read+write, best of numpy "
                         f"{bandwidth['numpy'] / 1e9:.1f} and XLA "
                         f"{bandwidth['XLA'] / 1e9:.1f} ({_COPY_MB.value} MB "
                         "arrays)"),
      ("target weight stream", f"{stream / 1e9:.1f} GB/s = "
                               f"{param_bytes / 1e6:.0f} MB x "
                               f"{1 / ar_step_s:.1f} AR steps/s: "
                               f"{stream / copy_bw:.0%} of read+write, "
                               f"{2 * stream / copy_bw:.0%} of bytes copied/s"),
      ("weight read bandwidth", f"{read_bw / 1e9:.1f} GB/s (XLA sum over the "
                                "target's params); the stream is "
                                f"{stream / read_bw:.0%} of it"),
      ("AR step, real / stub", f"{ms(ar_step_s)} / {ms(stub_ar_step_s)}  "
                               f"({stub_ar_step_s / ar_step_s:.1%})"),
      ("round, real / stub", f"{ms(round_s)} / {ms(stub_round_s)}  "
                             f"({stub_round_s / round_s:.1%} of a round outside"
                             " the forward passes)"),
  ]
  key_width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f"{k:<{key_width}}  {v}" if k else "")


if __name__ == "__main__":
  app.run(main)
