"""A decoder-only Transformer in two flavours, as a `CausalLM` pytree.

* 'gpt2': learned positions, LayerNorm, GELU (tanh), biases, tied embeddings.
* 'llama': RoPE (rotate-half convention, as in Hugging Face), RMSNorm, SwiGLU,
  grouped-query attention, no biases, untied LM head.

Both are pre-norm stacks of `num_layers` blocks held as a Python list of
per-layer modules (unrolled under jit), with a cache of per-layer
`[B, kv_heads, max_len, head_dim]` arrays (cache.py). Both choices are for
decode steps inside a jitted loop that carries the cache: a `lax.scan` over
stacked layers runs each step slower than the unrolled list, and per-layer
`[B, K, S, H]` caches need none of the per-step copies that a stacked or
`[B, S, K, H]` cache makes, which matters most for a small draft, whose
step is short next to them. cache.py says why stacked layouts cost more.

Usage: `TransformerLM` is a `flax.struct.PyTreeNode`; its config and nnx
GraphDef are static (hashable) fields and the nnx State is its pytree leaves,
so it is passed to `jax.jit` as an ordinary argument and a model with other
weights but the same config does not retrace. Inside, `__call__` rebuilds the
nnx module with `nnx.merge`, which costs nothing at run time. For training,
`model.module()` returns the nnx `Transformer` (whose `__call__` is the
full-sequence causal forward) and `TransformerLM.from_module` wraps it back.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

from specjax import _checks
from specjax.models import wrapped
from specjax.models.cache import KVCache

FLAVOURS = ("gpt2", "llama")

# RoPE rescalings implemented, with the fields each needs besides rope_type.
_ROPE_SCALING_FIELDS = {
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
}

# Finite, so a softmax over an all-masked row is uniform instead of NaN, and
# small enough in magnitude that subtracting the row max cannot overflow.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

# RoPE turns the features at position p (int32, so p < 2**31) by p * freq
# radians, in float32: a frequency above float32 max / 2**31 makes that
# angle inf and the logits NaN. Half of it leaves room for the float32
# rounding of the frequencies. (A frequency that underflows to 0 is no
# error: its true angle is below 2**31 * 1.2e-38 rad at every position.)
_MAX_ROPE_FREQUENCY = float(np.finfo(np.float32).max) / 2**32

# Under jax_enable_x64 jax keeps a seed's 64 bits (`_checks.MAX_SEED` is
# the bound without it), and refuses one past int64.
_MAX_SEED_X64 = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters; frozen and hashable (a static jit argument).

  Attributes:
    vocab_size: number of tokens V.
    d_model: residual width D.
    num_layers: number of blocks L.
    num_heads: query heads N.
    num_kv_heads: key/value heads K (N % K == 0); None means N (no GQA).
    head_dim: H per head; None means D // N.
    mlp_dim: hidden width F of the MLP; None means 4 D for 'gpt2' and
      8 D / 3 rounded up to a multiple of 64 for 'llama' (SwiGLU has three
      matrices, so this keeps the parameter count of a 4 D GELU MLP).
    max_positions: longest sequence the model attends over (size of the
      learned position table for 'gpt2').
    flavour: 'gpt2' or 'llama' (see the module docstring).
    rope_theta: RoPE base ('llama' only); a normal float32 (the forward
      computes the frequencies in float32) whose frequencies, rescaled by
      `rope_scaling`, are at most float32 max / 2**32, so that no angle
      overflows (`rope_frequencies`).
    norm_eps: epsilon of LayerNorm / RMSNorm.
    tie_embeddings: whether the LM head is the transposed token embedding;
      None means True for 'gpt2' and False for 'llama'.
    dtype: compute dtype name ('float32' default; 'bfloat16' is several
      times slower on XLA CPU). Logits are always returned as float32, and
      attention scores and softmax run in float32. None is refused (numpy
      would read it as float64).
    param_dtype: storage dtype of the parameters ('float32' default;
      'bfloat16' halves parameter memory and bandwidth). Training keeps
      its optimizer moments in this dtype too. None is refused, as for
      dtype.
    qkv_bias: 'llama' only: biases on the query/key/value projections (as
      in Qwen2); 'gpt2' always has every bias.
    rope_scaling: 'llama' only: None, or the RoPE frequency rescaling as
      sorted (name, value) pairs (a dict is accepted and converted, so the
      config stays hashable), Hugging Face's fields: rope_type 'linear'
      (factor) or 'llama3' (factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings).
  """
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int | None = None
  head_dim: int | None = None
  mlp_dim: int | None = None
  max_positions: int = 1024
  flavour: str = "gpt2"
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-5
  tie_embeddings: bool | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  qkv_bias: bool = False
  rope_scaling: Any = None

  def __post_init__(self):
    # Derived fields are filled in here, so every consumer sees final values
    # and two configs that mean the same model compare (and hash) equal.
    set_ = lambda name, value: object.__setattr__(self, name, value)
    # Stored as checked: a numpy int would pass, then fail JSON (checkpoints).
    for name in ("vocab_size", "d_model", "num_layers", "num_heads",
                 "max_positions"):
      set_(name, _checks.check_int(f"TransformerConfig.{name}",
                                   getattr(self, name), low=1))
    if self.flavour not in FLAVOURS:
      raise ValueError(f"TransformerConfig.flavour must be one of {FLAVOURS}, "
                       f"got {self.flavour!r}.")
    if self.num_kv_heads is None:
      set_("num_kv_heads", self.num_heads)
    set_("num_kv_heads", _checks.check_int("TransformerConfig.num_kv_heads",
                                           self.num_kv_heads, low=1))
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"TransformerConfig.num_heads ({self.num_heads}) must be a multiple "
          f"of num_kv_heads ({self.num_kv_heads}).")
    if self.head_dim is None:
      if self.d_model % self.num_heads:
        raise ValueError(
            f"TransformerConfig.d_model ({self.d_model}) is not divisible by "
            f"num_heads ({self.num_heads}); pass head_dim explicitly.")
      set_("head_dim", self.d_model // self.num_heads)
    set_("head_dim", _checks.check_int("TransformerConfig.head_dim",
                                       self.head_dim, low=1))
    if self.flavour == "llama" and self.head_dim % 2:
      raise ValueError("TransformerConfig.head_dim must be even for RoPE, got "
                       f"{self.head_dim}.")
    if self.mlp_dim is None:
      mlp_dim = 4 * self.d_model
      if self.flavour == "llama":
        mlp_dim = -(-8 * self.d_model // 3 // 64) * 64
      set_("mlp_dim", mlp_dim)
    set_("mlp_dim", _checks.check_int("TransformerConfig.mlp_dim",
                                      self.mlp_dim, low=1))
    if self.tie_embeddings is None:
      set_("tie_embeddings", self.flavour == "gpt2")
    set_("tie_embeddings", _checks.check_bool("TransformerConfig.tie_embeddings",
                                              self.tie_embeddings))
    set_("rope_theta", _checks.check_float("TransformerConfig.rope_theta",
                                           self.rope_theta))
    set_("norm_eps", _checks.check_float("TransformerConfig.norm_eps",
                                         self.norm_eps))
    # theta <= 0 gives NaN frequencies, eps < 0 the square root of a
    # negative: NaN logits, never an error, unless refused here.
    if self.rope_theta <= 0:
      raise ValueError(f"TransformerConfig.rope_theta must be > 0, got "
                       f"{self.rope_theta}.")
    # The forward raises theta to powers in float32: one that is not a
    # normal float32 becomes 0 (inf frequencies, NaN logits), inf (zero
    # frequencies where they are not) or a subnormal (imprecise powers).
    # (Python floats: a comparison with np.float32 would cast, and warn.)
    tiny, top = (float(x) for x in (np.finfo(np.float32).tiny,
                                    np.finfo(np.float32).max))
    if not tiny <= self.rope_theta <= top:
      raise ValueError(
          f"TransformerConfig.rope_theta must be a normal float32, in "
          f"[{tiny:.4g}, {top:.4g}] (RoPE computes in float32), got "
          f"{self.rope_theta}.")
    if self.norm_eps < 0:
      raise ValueError(f"TransformerConfig.norm_eps must be >= 0, got "
                       f"{self.norm_eps}.")
    for field in ("dtype", "param_dtype"):
      set_(field, float_dtype_name(f"TransformerConfig.{field}",
                                   getattr(self, field)))
    set_("qkv_bias", _checks.check_bool("TransformerConfig.qkv_bias",
                                        self.qkv_bias))
    if self.qkv_bias and self.flavour != "llama":
      raise ValueError("TransformerConfig.qkv_bias is for flavour 'llama' "
                       "('gpt2' always has every bias).")
    if self.rope_scaling is not None:
      try:
        scaling = dict(self.rope_scaling)
      except (TypeError, ValueError):
        raise TypeError(
            "TransformerConfig.rope_scaling must be a mapping (Hugging Face's "
            "rope_scaling dict, e.g. {'rope_type': 'linear', 'factor': 2.0}) "
            f"or None, got {self.rope_scaling!r}.") from None
      if self.flavour != "llama":
        raise ValueError("TransformerConfig.rope_scaling needs flavour 'llama'.")
      need = _ROPE_SCALING_FIELDS.get(scaling.get("rope_type"))
      if need is None:
        raise ValueError(
            f"TransformerConfig.rope_scaling rope_type "
            f"{scaling.get('rope_type')!r} is not implemented; choose from "
            f"{sorted(_ROPE_SCALING_FIELDS)}.")
      if set(scaling) != need | {"rope_type"}:
        raise ValueError(
            f"TransformerConfig.rope_scaling of rope_type "
            f"{scaling['rope_type']!r} needs exactly the fields "
            f"{sorted(need)}, got {sorted(set(scaling) - {'rope_type'})}.")
      for key in need:
        value = _checks.check_float(
            f"TransformerConfig.rope_scaling[{key!r}]", scaling[key])
        if value <= 0:
          raise ValueError(f"TransformerConfig.rope_scaling[{key!r}] must be "
                           f"> 0, got {value}.")
      if (scaling["rope_type"] == "llama3"
          and scaling["high_freq_factor"] <= scaling["low_freq_factor"]):
        raise ValueError(
            "TransformerConfig.rope_scaling needs high_freq_factor > "
            f"low_freq_factor (llama3 blends the band between them), got "
            f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}.")
      set_("rope_scaling", tuple(sorted(scaling.items())))
    if self.flavour == "llama":
      _check_rope_frequencies(self)

  @classmethod
  def preset(cls, name: str, **overrides) -> TransformerConfig:
    """A named configuration from `PRESETS`, with fields overridden."""
    if name not in PRESETS:
      raise ValueError(f"Unknown preset {name!r}; choose from {sorted(PRESETS)}.")
    return cls(**{**PRESETS[name], **overrides})


def architecture(config: TransformerConfig) -> TransformerConfig:
  """`config` without its dtypes: a cast of a model (`TransformerLM.astype`)
  is the same model to what reads its features (an EAGLE head, an exit
  adapter)."""
  return dataclasses.replace(config, dtype="float32", param_dtype="float32")


def _check_rope_frequencies(config: TransformerConfig) -> None:
  """Raises, naming rope_theta (and rope_scaling), unless every RoPE
  frequency of `config` is finite and at most `_MAX_ROPE_FREQUENCY`."""
  with np.errstate(all="ignore"):  # an extreme factor overflows: refused below
    top = float(np.max(_rope_frequencies64(config)))
  if top <= _MAX_ROPE_FREQUENCY:  # False for NaN too
    return
  what = f"rope_theta={config.rope_theta}"
  if config.rope_scaling is None:
    # theta ** (-i / half) is largest at i = half - 1 when theta < 1 (half
    # is > 1 here: for half = 1 the only frequency is 1).
    half = config.head_dim // 2
    fix = (f"use rope_theta >= "
           f"{_MAX_ROPE_FREQUENCY ** (-half / (half - 1)):.4g}")
  else:
    what += f" with rope_scaling={dict(config.rope_scaling)}"
    fix = "use a larger rope_theta or rope_scaling factor"
  raise ValueError(
      f"TransformerConfig.{what} gives RoPE frequencies up to {top:.4g} "
      f"(head_dim={config.head_dim}); position * frequency, positions < "
      f"2**31, must stay finite in float32, so they must be <= "
      f"{_MAX_ROPE_FREQUENCY:.4g}: {fix}.")


def float_dtype_name(name: str, value: Any) -> str:
  """The canonical name ('float32', 'bfloat16', ...) of a floating dtype.

  None is refused: numpy reads it as float64, which JAX then truncates to
  float32 at every use unless x64 is on.
  """
  if value is None:
    raise TypeError(f"{name} must be a floating dtype such as 'float32', "
                    "'bfloat16' or 'float16', got None.")
  try:
    dtype = np.dtype(jnp.dtype(value)).name
  except TypeError:
    raise ValueError(f"{name} {value!r} is not a dtype; use e.g. 'float32' or "
                     "'bfloat16'.") from None
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f"{name} must be a floating dtype, got {dtype}.")
  return dtype


# Byte-level vocabulary: 256 bytes + 3 specials (bos, eos, pad).
PRESETS: dict[str, dict[str, Any]] = {
    # The GPT-2 small architecture (124M with the GPT-2 BPE vocabulary).
    "gpt2-124m": dict(vocab_size=50257, d_model=768, num_layers=12,
                      num_heads=12, max_positions=1024, flavour="gpt2"),
    # The same trunk over bytes: 86,041,344 parameters. The default target.
    "byte-85m": dict(vocab_size=259, d_model=768, num_layers=12, num_heads=12,
                     max_positions=1024, flavour="gpt2"),
    # Llama-style with GQA (12 query / 4 kv heads): 86,531,328 parameters.
    "byte-85m-llama": dict(vocab_size=259, d_model=768, num_layers=12,
                           num_heads=12, num_kv_heads=4, mlp_dim=2432,
                           max_positions=1024, flavour="llama"),
    # Draft-sized: 3,488,000 and 3,084,032 parameters.
    "byte-3m": dict(vocab_size=259, d_model=256, num_layers=4, num_heads=4,
                    max_positions=1024, flavour="gpt2"),
    "byte-3m-llama": dict(vocab_size=259, d_model=256, num_layers=4,
                          num_heads=4, num_kv_heads=2, max_positions=1024,
                          flavour="llama"),
    # The Llama 3.2 1B architecture (1,235,814,400 parameters), for
    # benchmarks of its shapes with random weights (HF checkpoints load
    # through specjax.models.hf).
    "llama-3.2-1b": dict(vocab_size=128256, d_model=2048, num_layers=16,
                         num_heads=32, num_kv_heads=8, mlp_dim=8192,
                         max_positions=131072, flavour="llama",
                         rope_theta=500000.0, tie_embeddings=True,
                         rope_scaling=dict(
                             rope_type="llama3", factor=32.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)),
}


def _linear(config: TransformerConfig, d_in: int, d_out: int,
            rngs: nnx.Rngs, *, std: float = 0.02,
            bias: bool = False) -> nnx.Linear:
  """A projection; biased for 'gpt2', or where `bias` asks (Qwen2's q/k/v)."""
  return nnx.Linear(d_in, d_out, use_bias=config.flavour == "gpt2" or bias,
                    dtype=config.dtype, param_dtype=config.param_dtype,
                    kernel_init=nnx.initializers.normal(std), rngs=rngs)


def _norm(config: TransformerConfig, rngs: nnx.Rngs) -> nnx.Module:
  if config.flavour == "gpt2":
    return nnx.LayerNorm(config.d_model, epsilon=config.norm_eps,
                         dtype=config.dtype, param_dtype=config.param_dtype,
                         rngs=rngs)
  return nnx.RMSNorm(config.d_model, epsilon=config.norm_eps,
                     dtype=config.dtype, param_dtype=config.param_dtype,
                     rngs=rngs)


def rope_frequencies(config: TransformerConfig) -> np.ndarray:
  """float32 `[head_dim / 2]` RoPE inverse frequencies, rescaled as configured.

  Computed on the host in float64 (a constant of the compiled program);
  'llama3' follows Hugging Face's `_compute_llama3_parameters`: wavelengths
  longer than original_max_position_embeddings / low_freq_factor are divided
  by factor, shorter than .../high_freq_factor kept, and in between blended.
  """
  return _rope_frequencies64(config).astype(np.float32)


def _rope_frequencies64(config: TransformerConfig) -> np.ndarray:
  """`rope_frequencies` before its cast to float32."""
  half = config.head_dim // 2
  freq_h = config.rope_theta ** (-np.arange(half, dtype=np.float64) / half)
  scaling = dict(config.rope_scaling or ())
  if scaling.get("rope_type") == "linear":
    freq_h = freq_h / scaling["factor"]
  elif scaling.get("rope_type") == "llama3":
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen_h = 2 * np.pi / freq_h
    smooth_h = (old_len / wavelen_h - low) / (high - low)
    blended_h = (1 - smooth_h) * freq_h / factor + smooth_h * freq_h
    freq_h = np.where(wavelen_h > old_len / low, freq_h / factor,
                      np.where(wavelen_h < old_len / high, freq_h, blended_h))
  return freq_h


def _rope(x_BxTxNxH: jax.Array, positions_BxT: jax.Array,
          theta: float, freq_h: np.ndarray | None = None) -> jax.Array:
  """Rotary embedding, rotate-half convention (Hugging Face Llama).

  `freq_h` (from `rope_frequencies`) overrides the plain `theta` frequencies.
  """
  half = x_BxTxNxH.shape[-1] // 2
  if freq_h is None:
    freq_h = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_BxTx1xh = (positions_BxT.astype(jnp.float32)[:, :, None, None]
                   * freq_h)
  sin, cos = jnp.sin(angle_BxTx1xh), jnp.cos(angle_BxTx1xh)
  x1, x2 = jnp.split(x_BxTxNxH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def check_token_indices(at_BxQ: Any, tokens_BxT: Any) -> jax.Array:
  """`at_BxQ` (a `logits_at` argument) as an int array, one row per row of
  `tokens_BxT`; raises naming it otherwise."""
  if at_BxQ is None:
    raise TypeError("at_BxQ must be an int [B, Q] array of token indices, got "
                    "None.")
  at_BxQ = _checks.check_array("at_BxQ", at_BxQ, rank=2, kind="i")
  if at_BxQ.shape[0] != np.shape(tokens_BxT)[0]:
    raise ValueError(f"at_BxQ has {at_BxQ.shape[0]} rows; tokens_BxT has "
                     f"{np.shape(tokens_BxT)[0]}: one row of indices per row.")
  return jnp.asarray(at_BxQ)


def take_tokens(x, at_BxQ):
  """`x` (`[B, T]` or `[B, T, D]`) at token indices `at_BxQ` (int `[B, Q]`,
  clipped to [0, T))."""
  at = at_BxQ if x.ndim == 2 else at_BxQ[..., None]
  return jnp.take_along_axis(x, at, axis=1, mode="clip")


def _attend(q_BxTxNxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS):
  """Softmax attention with grouped-query heads; float32 scores.

  Keys/values are `[B, K, S, H]` (the cache layout), so both matmuls batch
  over (B, K) without transposing the cache.
  """
  b, t, n, h = q_BxTxNxH.shape
  kv = k_BxKxSxH.shape[1]
  # Query head n = k * G + g uses kv head k (Hugging Face `repeat_kv` order).
  q_BxTxKxGxH = q_BxTxNxH.reshape(b, t, kv, n // kv, h)
  s_BxKxGxTxS = jnp.einsum("btkgh,bksh->bkgts", q_BxTxKxGxH, k_BxKxSxH,
                           preferred_element_type=jnp.float32) / math.sqrt(h)
  s_BxKxGxTxS = jnp.where(mask_BxTxS[:, None, None], s_BxKxGxTxS, _MASK_VALUE)
  p_BxKxGxTxS = jax.nn.softmax(s_BxKxGxTxS, axis=-1).astype(v_BxKxSxH.dtype)
  # Keep the output in the matmul's natural [B, K, G, T, H] order and
  # transpose the small result: asking einsum for "btkgh" directly makes XLA
  # CPU transpose all of V to [B, K, H, S] every call (a large share of a
  # small model's decode step).
  o_BxKxGxTxH = jnp.einsum("bkgts,bksh->bkgth", p_BxKxGxTxS, v_BxKxSxH)
  return o_BxKxGxTxH.transpose(0, 3, 1, 2, 4).reshape(b, t, n * h)


class Attention(nnx.Module):
  """Multi-head (grouped-query when num_kv_heads < num_heads) attention."""

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    self.config = config
    c = config
    # GPT-2's scaled init of the residual-stream projections.
    out_std = 0.02 / math.sqrt(2 * c.num_layers)
    self.query = _linear(c, c.d_model, c.num_heads * c.head_dim, rngs,
                         bias=c.qkv_bias)
    self.key = _linear(c, c.d_model, c.num_kv_heads * c.head_dim, rngs,
                       bias=c.qkv_bias)
    self.value = _linear(c, c.d_model, c.num_kv_heads * c.head_dim, rngs,
                         bias=c.qkv_bias)
    self.out = _linear(c, c.num_heads * c.head_dim, c.d_model, rngs,
                       std=out_std)

  def __call__(self, x_BxTxD, positions_BxT, cache: KVCache | None, layer,
               tree=None, at_BxQ=None):
    """Keys and values at every position; queries, so outputs `[B, Q, D]`,
    only at the token indices `at_BxQ` when given (else Q = T, all)."""
    c = self.config
    b, t, _ = x_BxTxD.shape
    xq_BxQxD, q_positions_BxQ = x_BxTxD, positions_BxT
    if at_BxQ is not None:
      xq_BxQxD = take_tokens(x_BxTxD, at_BxQ)
      q_positions_BxQ = take_tokens(positions_BxT, at_BxQ)
    q_BxQxNxH = self.query(xq_BxQxD).reshape(b, -1, c.num_heads, c.head_dim)
    k_BxTxKxH = self.key(x_BxTxD).reshape(b, t, c.num_kv_heads, c.head_dim)
    v_BxTxKxH = self.value(x_BxTxD).reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.flavour == "llama":
      freq_h = rope_frequencies(c) if c.rope_scaling else None
      q_BxQxNxH = _rope(q_BxQxNxH, q_positions_BxQ, c.rope_theta, freq_h)
      k_BxTxKxH = _rope(k_BxTxKxH, positions_BxT, c.rope_theta, freq_h)
    if cache is None:
      # Full-sequence causal attention (training, reference).
      mask_BxQxT = positions_BxT[:, None, :] <= q_positions_BxQ[:, :, None]
      o_BxQxNH = _attend(q_BxQxNxH, k_BxTxKxH.transpose(0, 2, 1, 3),
                         v_BxTxKxH.transpose(0, 2, 1, 3), mask_BxQxT)
    else:
      # Write first so each new token sees itself and earlier new tokens.
      # tree = (slots_BxT, mask_BxTxS): a draft tree's nodes go to
      # consecutive slots but sit at positions = depth (see `tree_decode`).
      slots_BxT = positions_BxT if tree is None else tree[0]
      cache = cache.write(layer, k_BxTxKxH, v_BxTxKxH, slots_BxT)
      o_BxQxNH = _attend(q_BxQxNxH, cache.k[layer], cache.v[layer],
                         cache.attention_mask(q_positions_BxQ) if tree is None
                         else tree[1])
    return self.out(o_BxQxNH), cache


class Mlp(nnx.Module):
  """GELU MLP ('gpt2') or SwiGLU ('llama')."""

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    c = config
    self.flavour = c.flavour
    out_std = 0.02 / math.sqrt(2 * c.num_layers)
    self.up = _linear(c, c.d_model, c.mlp_dim, rngs)
    if c.flavour == "llama":
      self.gate = _linear(c, c.d_model, c.mlp_dim, rngs)
    self.down = _linear(c, c.mlp_dim, c.d_model, rngs, std=out_std)

  def __call__(self, x_BxTxD):
    if self.flavour == "llama":
      h_BxTxF = jax.nn.silu(self.gate(x_BxTxD)) * self.up(x_BxTxD)
    else:
      h_BxTxF = jax.nn.gelu(self.up(x_BxTxD), approximate=True)
    return self.down(h_BxTxF)


class Block(nnx.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    self.attn_norm = _norm(config, rngs)
    self.attn = Attention(config, rngs)
    self.mlp_norm = _norm(config, rngs)
    self.mlp = Mlp(config, rngs)

  def __call__(self, x_BxTxD, positions_BxT, cache, layer, tree=None,
               at_BxQ=None):
    """`[B, T, D]`, or `[B, Q, D]` at the token indices `at_BxQ` alone (the
    cache still gets every token's keys and values)."""
    h_BxQxD, cache = self.attn(self.attn_norm(x_BxTxD), positions_BxT, cache,
                               layer, tree, at_BxQ)
    if at_BxQ is not None:
      x_BxTxD = take_tokens(x_BxTxD, at_BxQ)
    x_BxQxD = x_BxTxD + h_BxQxD
    return x_BxQxD + self.mlp(self.mlp_norm(x_BxQxD)), cache


def tree_layout(cache: KVCache, depth_T, ancestor_TxT, nodes_L=None):
  """Where the nodes of (part of) a draft tree go in a cached forward.

  Node t of a T-node tree goes to cache slot `cache.lengths[b] + t` and sits
  at position `cache.lengths[b] + depth_T[t]`; it attends to the row's
  committed slots `< cache.lengths[b]` and to its ancestors' slots.

  Args:
    cache: the `KVCache` the tree is written into (its `lengths`: where the
      tree region starts). depth_T, ancestor_TxT: static numpy `[T]`,
      `[T, T]`. nodes_L: None (the whole tree) or static tree indices.

  Returns:
    `(positions_BxL, (slots_BxL, mask_BxLxS), advance)`: the nodes'
    positions, the `tree` argument of the blocks, and how far `lengths`
    moves (T for the whole tree; 0 for a part, so that the next part, the
    next draft level, shares the same tree region).
  """
  t = len(depth_T)
  whole = nodes_L is None
  nodes_L = np.arange(t) if whole else np.asarray(nodes_L, np.int32)
  slots_BxL = cache.lengths[:, None] + jnp.asarray(nodes_L, jnp.int32)
  positions_BxL = cache.lengths[:, None] + jnp.asarray(depth_T[nodes_L],
                                                       jnp.int32)
  slot_S = jnp.arange(cache.max_len, dtype=jnp.int32)
  offset_BxS = slot_S[None, :] - cache.lengths[:, None]
  in_tree_BxS = (offset_BxS >= 0) & (offset_BxS < t)
  ancestor_BxLxS = jnp.asarray(ancestor_TxT[nodes_L], bool)[
      :, jnp.clip(offset_BxS, 0, t - 1)].transpose(1, 0, 2)
  mask_BxLxS = (offset_BxS[:, None, :] < 0) | (
      in_tree_BxS[:, None, :] & ancestor_BxLxS)
  return positions_BxL, (slots_BxL, mask_BxLxS), t if whole else 0


def check_tree_call(tokens_BxL, depth_T, ancestor_TxT, nodes):
  """Validates a `tree_decode` call outside jit; returns `(depth_T,
  ancestor_TxT, nodes)` as numpy int32 `[T]`, bool `[T, T]` and a tuple of
  ints (or None)."""
  depth_T = np.asarray(depth_T, np.int32)
  ancestor_TxT = np.asarray(ancestor_TxT, bool)
  t = depth_T.shape[0] if depth_T.ndim == 1 else -1
  if depth_T.ndim != 1 or ancestor_TxT.shape != (t, t):
    raise ValueError(f"depth_T {depth_T.shape} and ancestor_TxT "
                     f"{ancestor_TxT.shape} must be [T] and [T, T]; build "
                     "them with TreeTopology.depth_with_root() / "
                     "ancestor_table().")
  if not ancestor_TxT.diagonal().all() or np.any(np.triu(ancestor_TxT, 1)):
    raise ValueError("ancestor_TxT must be reflexive and list only earlier "
                     "tokens (topological order): use "
                     "TreeTopology.ancestor_table().")
  if nodes is not None:
    nodes = tuple(_checks.check_int(f"nodes[{i}]", u, low=0, high=t - 1)
                  for i, u in enumerate(nodes))
    if not nodes or len(set(nodes)) != len(nodes):
      raise ValueError(f"nodes must be distinct tree indices, got {nodes}.")
  want = t if nodes is None else len(nodes)
  if tokens_BxL.shape[1] != want:
    raise ValueError(f"tokens_BxL has {tokens_BxL.shape[1]} tokens per row; "
                     f"expected {want} (one per "
                     f"{'tree token' if nodes is None else 'entry of nodes'}"
                     ").")
  return depth_T, ancestor_TxT, nodes


class Transformer(nnx.Module):
  """The nnx module. `__call__` is the full-sequence causal forward."""

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    c = config
    self.config = config
    self.embed = nnx.Embed(c.vocab_size, c.d_model, dtype=c.dtype,
                           param_dtype=c.param_dtype,
                           embedding_init=nnx.initializers.normal(0.02),
                           rngs=rngs)
    if c.flavour == "gpt2":
      self.pos_embed = nnx.Embed(c.max_positions, c.d_model, dtype=c.dtype,
                                 param_dtype=c.param_dtype,
                                 embedding_init=nnx.initializers.normal(0.01),
                                 rngs=rngs)
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.num_layers)])
    self.final_norm = _norm(c, rngs)
    if not c.tie_embeddings:
      self.lm_head = nnx.Linear(c.d_model, c.vocab_size, use_bias=False,
                                dtype=c.dtype, param_dtype=c.param_dtype,
                                kernel_init=nnx.initializers.normal(0.02),
                                rngs=rngs)

  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    """float32 `[B, T, V]` logits of causal attention over positions 0..T-1."""
    b, t = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits_BxTxV, _ = self.forward(tokens_BxT, positions_BxT, None)
    return logits_BxTxV

  def decode(self, tokens_BxT: jax.Array,
             cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Cached forward; see `TransformerLM.__call__`."""
    positions_BxT = cache.positions(tokens_BxT.shape[1])
    logits_BxTxV, cache = self.forward(tokens_BxT, positions_BxT, cache)
    return logits_BxTxV, cache.replace(lengths=positions_BxT[:, -1] + 1)

  def tree_decode(self, tokens_BxL, cache: KVCache, depth_T, ancestor_TxT,
                  nodes_L=None, return_hidden=False):
    """Cached forward of (part of) a draft tree; see `TransformerLM.tree_decode`."""
    positions_BxL, tree, advance = tree_layout(cache, depth_T, ancestor_TxT,
                                               nodes_L)
    hidden_BxLxD, cache = self.features(tokens_BxL, positions_BxL, cache, tree)
    cache = cache.replace(lengths=cache.lengths + advance)
    if return_hidden:
      return self.head(hidden_BxLxD), hidden_BxLxD, cache
    return self.head(hidden_BxLxD), cache

  def forward(self, tokens_BxT, positions_BxT, cache: KVCache | None):
    features_BxTxD, cache = self.features(tokens_BxT, positions_BxT, cache)
    return self.head(features_BxTxD), cache

  def embed_inputs(self, tokens_BxT, positions_BxT):
    """What the first block reads `[B, T, D]`: the token embedding, plus the
    learned position embedding for 'gpt2' ('llama' ropes inside attention)."""
    x_BxTxD = self.embed(tokens_BxT)
    if self.config.flavour == "gpt2":
      # Clamped: a padded prefill may score positions past the table (their
      # cache writes are dropped); an out-of-range take would give NaN.
      table_positions_BxT = jnp.minimum(positions_BxT,
                                        self.config.max_positions - 1)
      x_BxTxD = x_BxTxD + self.pos_embed(table_positions_BxT)
    return x_BxTxD

  def features(self, tokens_BxT, positions_BxT, cache: KVCache | None,
               tree=None, at_BxQ=None):
    """The final-norm output `[B, T, D]` (compute dtype): what `head` reads;
    `[B, Q, D]` at the token indices `at_BxQ` alone when given, which the
    last block computes there alone (its queries, its MLP)."""
    if tree is not None and at_BxQ is not None:
      raise ValueError("features: a tree call scores every node; at_BxQ is "
                       "for a chain's prefill.")
    x_BxTxD = self.embed_inputs(tokens_BxT, positions_BxT)
    last = len(self.blocks) - 1
    for layer, block in enumerate(self.blocks):
      x_BxTxD, cache = block(x_BxTxD, positions_BxT, cache, layer, tree,
                             at_BxQ if layer == last else None)
    return self.final_norm(x_BxTxD), cache

  def head(self, features_BxTxD):
    """float32 `[B, T, V]` logits of features (tied or untied LM head)."""
    if self.config.tie_embeddings:
      logits_BxTxV = self.embed.attend(features_BxTxD)
    else:
      logits_BxTxV = self.lm_head(features_BxTxD)
    return logits_BxTxV.astype(jnp.float32)


# (module, parameter) -> logical axis names, for `TransformerLM.logical_axes`.
_PARAM_AXES = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("pos_embed", "embedding"): ("length", "embed"),
    ("query", "kernel"): ("embed", "heads"),
    ("query", "bias"): ("heads",),
    ("key", "kernel"): ("embed", "kv_heads"),
    ("key", "bias"): ("kv_heads",),
    ("value", "kernel"): ("embed", "kv_heads"),
    ("value", "bias"): ("kv_heads",),
    ("out", "kernel"): ("heads", "embed"),
    ("out", "bias"): ("embed",),
    ("up", "kernel"): ("embed", "mlp"),
    ("up", "bias"): ("mlp",),
    ("gate", "kernel"): ("embed", "mlp"),
    ("gate", "bias"): ("mlp",),
    ("down", "kernel"): ("mlp", "embed"),
    ("down", "bias"): ("embed",),
    ("lm_head", "kernel"): ("embed", "vocab"),
}


def as_rngs(rngs: Any) -> nnx.Rngs:
  """`rngs` (an int seed, one PRNG key or `nnx.Rngs`) as `nnx.Rngs`.

  Refuses a key array of more than one key (e.g. `jax.random.split`'s) and a
  seed outside [0, 2**32 - 1] ([0, 2**63 - 1] under jax_enable_x64): without
  x64 jax keeps only a seed's low 32 bits, so 2**32 would silently give seed
  0's weights, and -1 seed 2**32 - 1's.
  """
  if isinstance(rngs, nnx.Rngs):
    return rngs
  if isinstance(rngs, (int, np.integer)) and not isinstance(rngs, bool):
    x64 = jax.config.read("jax_enable_x64")
    high = _MAX_SEED_X64 if x64 else _checks.MAX_SEED
    if not 0 <= rngs <= high:
      raise ValueError(
          f"rngs must be a single PRNG key or an int seed in [0, 2**"
          f"{63 if x64 else 32} - 1], got {rngs}: jax would refuse it, or "
          "keep only its low 32 bits and repeat another seed's weights. Use "
          "a seed in that range.")
    return nnx.Rngs(int(rngs))
  key = _checks.as_key("rngs", rngs)
  if key.shape:
    raise ValueError(
        f"rngs must be a single PRNG key or an int seed, got a key array of "
        f"shape {key.shape} (e.g. from jax.random.split): pass one of its "
        "keys, such as keys[0].")
  return nnx.Rngs(key)


class TransformerLM(wrapped.WrapsModule, struct.PyTreeNode):
  """A `Transformer` as a `CausalLM` pytree: static config + graphdef, State leaves.

  Build with `TransformerLM.create(config, seed)`. Pass it to `jax.jit` as an
  ordinary argument; models sharing a config share one compilation.
  """
  config: TransformerConfig = struct.field(pytree_node=False)
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  state: nnx.State

  one_hot_q: ClassVar[bool] = False
  module_type: ClassVar[type] = Transformer

  @classmethod
  def create(cls, config: TransformerConfig,
             rngs: int | jax.Array | nnx.Rngs = 0) -> TransformerLM:
    """Freshly initialised weights from a seed, a PRNG key or `nnx.Rngs`
    (`as_rngs` says which seeds and keys are refused)."""
    if not isinstance(config, TransformerConfig):
      raise TypeError(f"config must be a TransformerConfig, got "
                      f"{type(config).__name__}.")
    return cls.from_module(Transformer(config, as_rngs(rngs)))

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def max_positions(self) -> int:
    return self.config.max_positions

  def logical_axes(self) -> TransformerLM:
    """This model with a tuple of logical axis names at every parameter.

    The names (see `specjax.sharding`): `vocab`, `embed`, `length` (the
    position table), `heads` / `kv_heads` (the fused `heads * head_dim`
    projection widths; `sharding` splits them only at head boundaries) and
    `mlp`. A parameter this table does not know is replicated (None).
    """
    def names(path, x):
      # Dict keys name modules and parameters; attribute keys (a Variable's
      # `.value`) do not.
      keys = [str(getattr(k, "key", getattr(k, "idx", "")))
              for k in path if not isinstance(k, jax.tree_util.GetAttrKey)]
      if len(keys) >= 2 and keys[-2].endswith("norm") and np.ndim(x) == 1:
        return ("embed",)  # LayerNorm / RMSNorm scale and bias
      return _PARAM_AXES.get(tuple(keys[-2:]))
    return self.replace(state=jax.tree_util.tree_map_with_path(names,
                                                               self.state))

  def astype(self, dtype: Any = None, param_dtype: Any = None
             ) -> TransformerLM:
    """This model computing in `dtype`, its parameters stored in
    `param_dtype` (None: unchanged), e.g. a float32-trained model decoded in
    bfloat16. Logits stay float32 whatever the dtypes."""
    changes = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype))
               if v is not None}
    if not changes:
      return self
    config = dataclasses.replace(self.config, **changes)  # validates names
    abstract = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))
    graphdef, shapes = nnx.split(abstract)
    state = jax.tree.map(lambda x, s: jnp.asarray(x, s.dtype), self.state,
                         shapes)
    return TransformerLM(config=config, graphdef=graphdef, state=state)

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    """An empty `KVCache` (see cache.py for the layout) in the compute dtype."""
    batch_size = _checks.check_int("batch_size", batch_size, low=1)
    max_len = _checks.check_int("max_len", max_len, low=1,
                                high=self.config.max_positions)
    c = self.config
    return KVCache.create(num_layers=c.num_layers, batch_size=batch_size,
                          max_len=max_len, num_kv_heads=c.num_kv_heads,
                          head_dim=c.head_dim, dtype=c.dtype)

  def __call__(self, tokens_BxT: jax.Array,
               cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Scores T >= 1 new tokens per row against the cache.

    Args:
      tokens_BxT: int `[B, T]` token ids.
      cache: a `KVCache` from `init_cache` with batch B.

    Returns:
      `(logits_BxTxV, cache)`: float32 logits, where token t of row b sits at
      position `cache.lengths[b] + t` and attends to the row's positions
      `<= cache.lengths[b] + t`; and the cache with the new keys/values
      written and `lengths` advanced by T. Inside jit, writes at positions
      >= max_len are dropped (`check_inputs` rules that out beforehand);
      called eagerly, the call itself refuses them, and ids outside the
      vocabulary, as `check_inputs` does.
    """
    self._check_call(tokens_BxT, cache)
    return self.module().decode(tokens_BxT, cache)

  def features(self, tokens_BxT: jax.Array, cache: KVCache,
               at_BxQ: jax.Array | None = None
               ) -> tuple[jax.Array, KVCache]:
    """`__call__` up to the LM head: the features it reads.

    Args:
      tokens_BxT, cache: as `__call__`.
      at_BxQ: None (every new token), or int `[B, Q]` indices into each
        row's T new tokens (clipped to [0, T); repeats allowed).

    Returns:
      `(hidden_BxQxD, cache)`: the final norm's output (compute dtype) at
      the chosen new tokens (Q = T when `at_BxQ` is None), so that
      `head_logits(hidden)` is `__call__`'s logits there, and the same
      cache as `__call__`'s. Given `at_BxQ`, only the last block's queries
      and MLP and the final norm run at the Q tokens alone; every block
      still writes keys and values at all T.
    """
    self._check_call(tokens_BxT, cache)
    if at_BxQ is not None:
      at_BxQ = check_token_indices(at_BxQ, tokens_BxT)
    return self._features(tokens_BxT, cache, at_BxQ)

  def _features(self, tokens_BxT, cache, at_BxQ):
    """`features` on checked inputs."""
    positions_BxT = cache.positions(tokens_BxT.shape[1])
    hidden_BxQxD, cache = self.module().features(tokens_BxT, positions_BxT,
                                                 cache, at_BxQ=at_BxQ)
    return hidden_BxQxD, cache.replace(lengths=positions_BxT[:, -1] + 1)

  def forward_with_hidden(self, tokens_BxT: jax.Array, cache: KVCache
                          ) -> tuple[jax.Array, jax.Array, KVCache]:
    """`__call__` that also returns the features its LM head read.

    Returns `(logits_BxTxV, hidden_BxTxD, cache)`: `hidden` is the final
    norm's output at each new position (compute dtype), so
    `logits == self.head_logits(hidden)`. Feature-level drafts
    (`specjax.EagleDraft`) draft from it.
    """
    hidden_BxTxD, cache = self.features(tokens_BxT, cache)
    return self.head_logits(hidden_BxTxD), hidden_BxTxD, cache

  def head_logits(self, features_BxTxD: jax.Array) -> jax.Array:
    """float32 `[B, T, V]`: the LM head (tied embedding or `lm_head`) alone."""
    return self.module().head(features_BxTxD)

  def logits_at(self, tokens_BxT: jax.Array, cache: KVCache, at_BxQ: jax.Array
                ) -> tuple[jax.Array, KVCache]:
    """`__call__` whose logits are read only at some of the new tokens.

    Args:
      tokens_BxT, cache: as `__call__`.
      at_BxQ: int `[B, Q]`, indices into each row's T new tokens (clipped
        to [0, T)); repeats allowed.

    Returns:
      `(logits_BxQxV, cache)`: float32 `[B, Q, V]` equal to `__call__`'s
      logits at those tokens, and the same cache as `__call__`'s. Only the
      last block's queries and MLP, the final norm and the LM head run at
      the Q tokens alone (`features`), so a prefill that scores a prompt's
      last Q positions (the decode loop, for `Goodput.prompt_prior`) costs
      Q positions of them, not T.
    """
    self._check_call(tokens_BxT, cache)
    at_BxQ = check_token_indices(at_BxQ, tokens_BxT)  # None is refused here
    hidden_BxQxD, cache = self._features(tokens_BxT, cache, at_BxQ)
    return self.head_logits(hidden_BxQxD), cache

  def tree_decode(self, tokens_BxL: jax.Array, cache: KVCache, depth_T,
                  ancestor_TxT, nodes=None, *, return_hidden: bool = False):
    """Scores a static draft tree of T tokens per row in ONE pass.

    Tree token t goes to cache slot `cache.lengths[b] + t` but sits at
    position `cache.lengths[b] + depth_T[t]` (RoPE / learned positions), and
    attends to the row's committed slots `< cache.lengths[b]` and to the tree
    tokens u with `ancestor_TxT[t, u]` (its ancestors and itself). Token 0 is
    usually the root (the last committed token, depth 0).

    Args:
      tokens_BxL: int `[B, L]`, the tokens of the tree nodes `nodes` (all T
        in topological order by default).
      cache: a `KVCache`; depth_T: static int `[T]`; ancestor_TxT: static
        bool `[T, T]` (reflexive, ancestors only).
      nodes: None (score the whole tree), or a static sequence of L distinct
        tree indices in [0, T): score only those (a draft level), writing
        each to its own slot; their ancestors must already be in the cache's
        tree slots (an earlier call).

      return_hidden: static; also return the features the LM head read at
        each node (as `forward_with_hidden`), for feature-level drafts.

    Returns:
      `(logits_BxLxV, cache)`, or `(logits_BxLxV, hidden_BxLxD, cache)` with
      `return_hidden`; `lengths` advanced by T for the whole tree and
      unchanged for a part (the tree region still starts there). Logits at
      a node equal the causal forward of the root-to-node path. Move the
      kept path's entries with `KVCache.move` before the next call.
    """
    self._check_call(tokens_BxL, cache)
    depth_T, ancestor_TxT, nodes = check_tree_call(tokens_BxL, depth_T,
                                                   ancestor_TxT, nodes)
    return self.module().tree_decode(tokens_BxL, cache, depth_T, ancestor_TxT,
                                     nodes, bool(return_hidden))

  def logits(self, tokens_BxT: jax.Array) -> jax.Array:
    """float32 `[B, T, V]` full-sequence causal forward, no cache (training)."""
    tokens_BxT = _checks.check_array("tokens_BxT", tokens_BxT, rank=2, kind="i")
    if min(tokens_BxT.shape) < 1:
      raise ValueError("tokens_BxT must hold at least one row of at least one "
                       f"token, got shape {tuple(tokens_BxT.shape)}.")
    if tokens_BxT.shape[1] > self.config.max_positions:
      raise ValueError(f"tokens_BxT has {tokens_BxT.shape[1]} positions; the "
                       f"model has max_positions={self.config.max_positions}.")
    if _checks.is_concrete(tokens_BxT):
      # An id past the table embeds as NaN, a negative one as another token.
      _checks.check_token_range("tokens_BxT", tokens_BxT, self.vocab_size)
    return _causal_logits(self, tokens_BxT)

  def check_inputs(self, tokens_BxT: Any, cache: KVCache) -> None:
    """Raises ValueError/TypeError naming the argument if a call would misbehave.

    Beyond the shape checks, this reads the concrete `cache.lengths` and
    `tokens_BxT` (so call it outside jit, before a jitted call; an eager
    `__call__` runs it itself): every token must be in [0, vocab_size) (an
    id past the table embeds as NaN, a negative one as another token), and
    every row's `lengths[b] + T` must fit both `cache.max_len` and
    `max_positions`.
    """
    if not (_checks.is_concrete(cache.lengths)
            and _checks.is_concrete(tokens_BxT)):
      raise ValueError("check_inputs needs concrete tokens_BxT and "
                       "cache.lengths; call it outside jit.")
    self._check_call(tokens_BxT, cache)  # concrete: checks the values too

  def _check_call(self, tokens_BxT, cache):
    check_call(tokens_BxT, cache, self.config, self.config.num_layers)


def check_call(tokens_BxT: Any, cache: Any, config: TransformerConfig,
               num_layers: int, cache_type: type = KVCache) -> None:
  """Raises ValueError/TypeError naming the argument unless `tokens_BxT` is an
  int `[B, T >= 1]` array and `cache` a `cache_type` of `num_layers` k/v
  layers `[B, num_kv_heads, max_len, head_dim]` of `config` and lengths
  `[B]` (a Transformer's, a self-draft's kept blocks', a head's block). On
  concrete values (an eager call) also unless every id is in [0,
  vocab_size) and every row's lengths + T fits max_len and max_positions."""
  tokens_BxT = _checks.check_array("tokens_BxT", tokens_BxT, rank=2, kind="i")
  if tokens_BxT.shape[1] < 1:
    raise ValueError("tokens_BxT must hold at least one token per row (T >= "
                     f"1), got shape {tuple(tokens_BxT.shape)}.")
  if not isinstance(cache, cache_type):
    raise TypeError(f"cache must be the model's {cache_type.__name__} (from "
                    f"its init_cache), got {type(cache).__name__}.")
  want = (tokens_BxT.shape[0], config.num_kv_heads, cache.max_len,
          config.head_dim)
  got = [tuple(x.shape) for x in cache.k + cache.v]
  if (len(cache.k) != num_layers or any(g != want for g in got)
      or tuple(cache.lengths.shape) != want[:1]):
    raise ValueError(
        f"cache does not fit tokens_BxT {tuple(tokens_BxT.shape)} and this "
        f"model: expected {num_layers} layers of k/v {want} and lengths "
        f"({want[0]},), got {len(cache.k)} layers of k/v "
        f"{sorted(set(got))}, lengths {tuple(cache.lengths.shape)}. The "
        "batch sizes of tokens_BxT and the cache must match.")
  if _checks.is_concrete(tokens_BxT) and _checks.is_concrete(cache.lengths):
    # An eager call (traced ones cannot read values): else an id past the
    # table would give NaN logits, a negative one another token's, and writes
    # past the cache would be dropped, leaving lengths past max_len.
    _check_call_values(tokens_BxT, cache, config)


def _check_call_values(tokens_BxT, cache, config) -> None:
  _checks.check_token_range("tokens_BxT", tokens_BxT, config.vocab_size)
  t = np.shape(tokens_BxT)[1]
  lengths_B = np.asarray(cache.lengths)
  if lengths_B.min() < 0:
    raise ValueError(f"cache.lengths must be >= 0, got {lengths_B}.")
  limit = min(cache.max_len, config.max_positions)
  if lengths_B.max() + t > limit:
    b = int(lengths_B.argmax())
    raise ValueError(
        f"tokens_BxT: row {b} holds {lengths_B[b]} positions and T={t} more "
        f"would exceed {limit} (cache.max_len={cache.max_len}, "
        f"max_positions={config.max_positions}). Make the cache with a "
        "larger init_cache max_len, or pass fewer tokens.")


# Called eagerly (exact laws in tests, evaluation, a notebook cell), a
# forward would dispatch its hundred-odd operations one by one, each compiled
# on first use; as one program it compiles once per (config, shape).
@jax.jit
def _causal_logits(model: TransformerLM, tokens_BxT: jax.Array) -> jax.Array:
  return model.module()(tokens_BxT)
