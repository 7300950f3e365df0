"""Hugging Face checkpoints as `TransformerLM`s: `load(path_or_hf_id, dtype=...)`.

Reads a local directory laid out as `save_pretrained` writes it: config.json,
`model.safetensors` or a sharded `model.safetensors.index.json`, optional
generation_config.json and tokenizer files. No torch: weights are read with
the `safetensors` package into numpy (bfloat16 through ml_dtypes).

Architectures (config.json `architectures`):

| architecture        | flavour | notes                                        |
| ------------------- | ------- | -------------------------------------------- |
| GPT2LMHeadModel     | gpt2    | gpt2 .. gpt2-xl, distilgpt2                  |
| LlamaForCausalLM    | llama   | Llama 2 / 3.x, rope_scaling llama3 / linear, |
|                     |         | GQA, tied embeddings (Llama 3.2, SmolLM2)    |
| Qwen2ForCausalLM    | llama   | + q/k/v biases                               |
| MistralForCausalLM  | llama   | only where sliding_window >= max_positions   |

Anything else in config.json that would change the function the model
computes (an unknown rope type, a sliding window shorter than the context,
attention_bias on Llama, another activation, quantization...) raises
`UnsupportedConfigError` naming the field; nothing is silently ignored.

`hf:<repo_id>` resolves through `huggingface_hub.snapshot_download` (imported
only then); offline, the error says how to pass a local directory instead.

Dtypes: the weights keep the checkpoint's dtype (e.g. bfloat16) unless
`dtype=` is given, and the model computes in that dtype; the logits the model
returns are float32, and so are the probabilities and the coupling math of the
decode loop, whatever the model dtype.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
from typing import Any
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import _checks
from specjax.data.hf_tokenizer import HFTokenizer
from specjax.data.hf_tokenizer import read_json
from specjax.models import transformer as transformer_lib
from specjax.models.transformer import TransformerConfig
from specjax.models.transformer import TransformerLM

ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM",
                 "MistralForCausalLM")

# Tensors in some checkpoints that are not weights (causal-mask buffers of
# old GPT-2 exports, cached RoPE frequencies): skipped on purpose.
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


class UnsupportedConfigError(ValueError):
  """A config.json field whose value specjax does not implement."""

  def __init__(self, field: str, value: Any, why: str):
    self.field = field
    super().__init__(f"config.json field {field!r} = {value!r}: {why}")


def _download_command(repo_id: str) -> str:
  """The shell command that downloads `repo_id` into DIR with the installed
  huggingface_hub: its `hf` CLI (0.34 and later; `huggingface-cli`, the
  older one, is gone from 1.0)."""
  try:
    has_hf = importlib.util.find_spec("huggingface_hub.cli.hf") is not None
  except ImportError:  # no huggingface_hub.cli package
    has_hf = False
  cli = "hf" if has_hf else "huggingface-cli"
  return f"{cli} download {repo_id} --local-dir DIR"


def resolve(path: str | os.PathLike) -> pathlib.Path:
  """A local checkpoint directory for a path or `hf:<repo_id>`.

  `hf:` ids download (or reuse the local cache) with
  `huggingface_hub.snapshot_download`, weights as safetensors only.
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError("path must be a checkpoint directory (str or os.PathLike) "
                    f"or 'hf:<repo_id>', got {type(path).__name__}.")
  spec = os.fspath(path)
  if isinstance(spec, bytes):
    spec = os.fsdecode(spec)
  if spec.startswith("hf:"):
    repo_id = spec[3:]
    if not repo_id:
      raise ValueError("path 'hf:' names no repository; use hf:<owner>/<name>.")
    try:
      import huggingface_hub  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise ImportError(
          f"{spec} needs huggingface_hub (pip install huggingface_hub); or "
          "download the checkpoint elsewhere and pass its local directory "
          f"instead of {spec}.") from None
    try:
      local = huggingface_hub.snapshot_download(
          repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                   "*.model"])
    except Exception as e:  # offline, unknown repo, gated, ...
      # One line: the hub's own messages may span several.
      why = " ".join(f"{type(e).__name__}: {e}".split())
      raise OSError(
          f"Could not fetch {repo_id!r} from the Hugging Face Hub ({why}). "
          "Without network access, download the checkpoint on a machine "
          f"that has it (`{_download_command(repo_id)}`), copy that local "
          f"directory here and pass it instead of {spec}.") from e
    return pathlib.Path(local)
  local = pathlib.Path(spec)
  if not (local / "config.json").is_file():
    raise FileNotFoundError(
        f"{spec!r} is not a Hugging Face checkpoint directory (no "
        "config.json); pass a directory written by save_pretrained or "
        "'hf:<repo_id>'.")
  return local


def _field(hf: dict[str, Any], name: str) -> Any:
  """A config.json field the architecture cannot do without."""
  if name not in hf:
    raise ValueError(f"config.json has no field {name!r}, which a "
                     f"{hf['architectures'][0]} config needs; is the file "
                     "complete?")
  return hf[name]


def _layer_rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
  """`rope_parameters` as one dict, also from the per-layer-type layout.

  transformers >= 5 may key it by layer type ({"full_attention": {...},
  "sliding_attention": {...}}); one set of parameters is implemented, so
  every layer type the model uses must have the same.
  """
  params = hf.get("rope_parameters") or {}
  if not isinstance(params, dict):
    raise UnsupportedConfigError("rope_parameters", params,
                                 "expected a JSON object.")
  if not any(isinstance(v, dict) for v in params.values()):
    return dict(params)
  used = sorted(set(_layer_types(hf) or ["full_attention"]))
  missing = [t for t in used if not isinstance(params.get(t), dict)]
  if missing:
    raise UnsupportedConfigError(
        "rope_parameters", params, f"no parameters for layer type(s) "
        f"{missing} (layer_types uses {used}).")
  if any(params[t] != params[used[0]] for t in used):
    raise UnsupportedConfigError(
        "rope_parameters", params, "layer types with different RoPE "
        "parameters are not implemented.")
  return dict(params[used[0]])


# The fields each implemented RoPE scaling reads (rope_type included).
_ROPE_FIELDS = {
    "linear": {"rope_type", "factor"},
    "llama3": {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
}


def _rope_params(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
  """(rope_theta, rope_scaling) from either config layout.

  transformers < 5 writes `rope_theta` and `rope_scaling`; >= 5 writes
  `rope_parameters` (rope_type, rope_theta, partial_rotary_factor and the
  scaling fields together, possibly per layer type).
  """
  params = _layer_rope_parameters(hf)
  theta = params.pop("rope_theta", hf.get("rope_theta", 10_000.0))
  # An empty rope_scaling says nothing: rope_parameters, if any, decide.
  if hf.get("rope_scaling") not in (None, {}):
    scaling, field = hf["rope_scaling"], "rope_scaling"
  else:
    scaling, field = params, "rope_parameters"
  if not isinstance(scaling, dict):
    raise UnsupportedConfigError(field, scaling, "expected a JSON object.")
  scaling = dict(scaling)
  partial = scaling.pop("partial_rotary_factor", 1.0)
  if partial != 1.0:
    raise UnsupportedConfigError(f"{field}.partial_rotary_factor", partial,
                                 "RoPE on part of each head is not "
                                 "implemented.")
  if "type" in scaling:  # the old spelling; transformers 4.x writes both
    kind = scaling.pop("type")
    if scaling.setdefault("rope_type", kind) != kind:
      raise UnsupportedConfigError(
          f"{field}.type", kind, f"it contradicts {field}.rope_type = "
          f"{scaling['rope_type']!r}; name one RoPE kind.")
  if "rope_type" not in scaling and scaling:
    # transformers reads the kind from rope_type (or type): a dict of
    # scaling fields without one is not plain RoPE.
    raise UnsupportedConfigError(
        f"{field}.rope_type", None, f"{field} has fields "
        f"{sorted(scaling)} but no rope_type; name the RoPE kind.")
  kind = scaling.get("rope_type", "default")
  if kind == "default":
    return theta, None
  if kind not in ("linear", "llama3"):
    raise UnsupportedConfigError(
        f"{field}.rope_type", kind, "only default, linear and llama3 RoPE "
        "are implemented.")
  if scaling.get("attention_factor", 1.0) != 1.0:
    raise UnsupportedConfigError(f"{field}.attention_factor",
                                 scaling["attention_factor"],
                                 "only 1.0 is implemented.")
  scaling.pop("attention_factor", None)
  # transformers reads only its kind's fields and logs the rest as
  # unrecognised (e.g. original_max_position_embeddings beside a linear
  # factor, which re-saved 4.x configs carry): so do we, with a warning.
  extra = sorted(set(scaling) - _ROPE_FIELDS[kind])
  if extra:
    warnings.warn(f"config.json {field}: fields {extra} are not used by "
                  f"{kind!r} RoPE scaling (transformers ignores them too).",
                  UserWarning, stacklevel=2)
    scaling = {k: v for k, v in scaling.items() if k not in extra}
  return theta, scaling


def _require(hf: dict[str, Any], field: str, allowed: tuple[Any, ...],
             default: Any, why: str) -> None:
  value = hf.get(field, default)
  if value not in allowed:
    raise UnsupportedConfigError(field, value, why)


def config_from_hf(hf: dict[str, Any], *, dtype: str = "float32",
                   max_positions: int | None = None) -> TransformerConfig:
  """The `TransformerConfig` of a config.json dict, or UnsupportedConfigError.

  Args:
    hf: the parsed config.json.
    dtype: compute dtype of the model.
    max_positions: the longest context to allow; None means the checkpoint's
      max_position_embeddings (n_positions for GPT-2). Lower it to use a
      Mistral/Qwen2 checkpoint whose sliding window is shorter than that.
  """
  if not isinstance(hf, dict):
    raise ValueError(f"config.json must hold a JSON object, got "
                     f"{type(hf).__name__}.")
  archs = hf.get("architectures") or []
  if (not isinstance(archs, list) or len(archs) != 1
      or archs[0] not in ARCHITECTURES):
    raise UnsupportedConfigError(
        "architectures", archs, f"supported: one of {list(ARCHITECTURES)}.")
  arch = archs[0]
  if hf.get("quantization_config"):
    raise UnsupportedConfigError("quantization_config",
                                 hf["quantization_config"],
                                 "quantized checkpoints are not implemented.")
  if arch == "GPT2LMHeadModel":
    _require(hf, "activation_function", ("gelu_new", "gelu_pytorch_tanh"),
             "gelu_new", "GPT-2 blocks use the tanh GELU only.")
    _require(hf, "scale_attn_weights", (True,), True,
             "attention scores are always scaled by 1/sqrt(head_dim).")
    _require(hf, "scale_attn_by_inverse_layer_idx", (False,), False,
             "per-layer attention scaling is not implemented.")
    _require(hf, "add_cross_attention", (False,), False,
             "cross-attention is not implemented.")
    positions = _field(hf, "n_positions")
    kwargs = dict(
        flavour="gpt2", vocab_size=_field(hf, "vocab_size"),
        d_model=_field(hf, "n_embd"), num_layers=_field(hf, "n_layer"),
        num_heads=_field(hf, "n_head"), mlp_dim=hf.get("n_inner") or None,
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=hf.get("tie_word_embeddings", True))
  else:
    _require(hf, "hidden_act", ("silu",), "silu",
             "the SwiGLU MLP is implemented with silu only.")
    _require(hf, "mlp_bias", (False,), False, "MLP biases are not implemented.")
    if arch != "Qwen2ForCausalLM":
      _require(hf, "attention_bias", (False,), False,
               "attention projection biases are implemented only as Qwen2's "
               "q/k/v biases.")
    _require(hf, "partial_rotary_factor", (1.0,), 1.0,
             "RoPE on part of each head is not implemented.")
    theta, scaling = _rope_params(hf)
    positions = _field(hf, "max_position_embeddings")
    heads = _field(hf, "num_attention_heads")
    kwargs = dict(
        flavour="llama", vocab_size=_field(hf, "vocab_size"),
        d_model=_field(hf, "hidden_size"),
        num_layers=_field(hf, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or None,
        mlp_dim=_field(hf, "intermediate_size"),
        rope_theta=theta, rope_scaling=scaling,
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        qkv_bias=arch == "Qwen2ForCausalLM")
  if max_positions is not None:
    max_positions = _checks.check_int("max_positions", max_positions, low=1)
    if not isinstance(positions, int) or max_positions > positions:
      raise ValueError(f"max_positions={max_positions} exceeds the "
                       f"checkpoint's {positions!r} positions.")
    positions = max_positions
  _check_sliding_window(arch, hf, positions)
  try:
    return TransformerConfig(max_positions=positions, dtype=dtype,
                             param_dtype=dtype, **kwargs)
  except (TypeError, ValueError) as e:  # e.g. a string where a size goes
    raise ValueError(f"config.json does not describe a valid "
                     f"{arch}: {e}") from None


def context_length(hf: Any) -> Any:
  """A config.json's own context (n_positions for GPT-2, else
  max_position_embeddings), unchecked; None when it names none."""
  if not isinstance(hf, dict):
    return None
  gpt2 = hf.get("architectures") == ["GPT2LMHeadModel"]
  return hf.get("n_positions" if gpt2 else "max_position_embeddings")


def _layer_types(hf: dict[str, Any]) -> list[str]:
  """config.json's per-layer attention kinds ([] when absent)."""
  layer_types = hf.get("layer_types") or []
  # A string would be read letter by letter as layer types.
  if not isinstance(layer_types, list) or not all(
      isinstance(t, str) for t in layer_types):
    raise UnsupportedConfigError("layer_types", layer_types,
                                 "expected a list of layer type strings.")
  return layer_types


def _check_sliding_window(arch: str, hf: dict[str, Any], positions: int):
  """Full attention equals sliding-window attention over <= window tokens."""
  window = hf.get("sliding_window")
  if arch == "MistralForCausalLM" and "sliding_window" not in hf:
    window = 4096  # MistralConfig's default: absent is not "no window"
  if window is not None and (isinstance(window, bool)
                             or not isinstance(window, int)):
    raise UnsupportedConfigError("sliding_window", window,
                                 "expected an integer or null.")
  if window is not None and window < 1:
    # Else the advice below would be to pass max_positions={window}.
    raise UnsupportedConfigError("sliding_window", window,
                                 "a window covers at least one position.")
  uses_window = window is not None
  if arch == "Qwen2ForCausalLM":
    # As transformers' Qwen2Config: no window unless use_sliding_window,
    # and then only on the layers layer_types names (by default those from
    # max_window_layers on, so none when it is >= the layer count).
    layer_types = _layer_types(hf)
    if not layer_types:
      first = hf.get("max_window_layers", 28)
      if isinstance(first, bool) or not isinstance(first, int):
        raise UnsupportedConfigError("max_window_layers", first,
                                     "expected an integer.")
      layer_types = ["sliding_attention" if i >= first else "full_attention"
                     for i in range(_field(hf, "num_hidden_layers"))]
    uses_window = (window is not None and hf.get("use_sliding_window", False)
                   and "sliding_attention" in layer_types)
  elif arch == "GPT2LMHeadModel":
    uses_window = False
  # A query at position i sees keys j with i - j < window, so contexts of at
  # most `window` positions are unaffected.
  if uses_window and window < positions:
    raise UnsupportedConfigError(
        "sliding_window", window,
        f"sliding-window attention is not implemented and the window is "
        f"shorter than the {positions} positions the model would allow; pass "
        f"max_positions={window} (or less) to load() to use it as full "
        "attention.")


# ------------------------------------------------------------------ weights --


def read_safetensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  """Every tensor of model.safetensors or of the shards of its index."""
  # pylint: disable-next=g-import-not-at-top
  from safetensors import safe_open, SafetensorError
  index = read_json(directory, "model.safetensors.index.json")
  if index is not None:
    if not isinstance(index, dict) or not isinstance(
        index.get("weight_map"), dict):
      raise ValueError(f"{directory / 'model.safetensors.index.json'} has no "
                       "'weight_map' object (tensor name -> shard file).")
    files = sorted(set(index["weight_map"].values()))
    if not all(isinstance(f, str) for f in files):
      raise ValueError(f"{directory / 'model.safetensors.index.json'}: "
                       "weight_map maps tensor names to shard file names "
                       f"(strings), got {files}.")
  elif (directory / "model.safetensors").is_file():
    files = ["model.safetensors"]
  else:
    raise FileNotFoundError(
        f"{directory} holds neither model.safetensors nor "
        "model.safetensors.index.json (only safetensors weights are read; "
        "re-save with save_pretrained(..., safe_serialization=True)).")
  tensors = {}
  for name in files:
    try:
      with safe_open(str(directory / name), framework="numpy") as f:
        for key in f.keys():
          try:
            tensors[key] = f.get_tensor(key)
          except TypeError:  # bfloat16: numpy needs ml_dtypes, via flax
            with safe_open(str(directory / name), framework="flax") as g:
              tensors[key] = np.asarray(g.get_tensor(key))
    except FileNotFoundError:
      raise FileNotFoundError(f"{directory / name} is missing (a shard the "
                              "index names?).") from None
    except (SafetensorError, OSError) as e:  # truncated or not safetensors
      raise ValueError(f"{directory / name} could not be read as "
                       f"safetensors ({type(e).__name__}: {e}).") from None
  return tensors


def _strip(tensors: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
  out = {}
  for key, value in tensors.items():
    if key.endswith(_BUFFER_SUFFIXES):
      continue
    out[key[len(prefix):] if key.startswith(prefix) else key] = value
  return out


def _taker(t: dict[str, np.ndarray], prefix: str):
  """`t.pop`, raising a ValueError that names a missing tensor."""
  def take(name):
    if name not in t:
      raise ValueError(f"The checkpoint has no tensor {prefix + name!r} (nor "
                       f"{name!r}), which the config's model needs; is "
                       "config.json the checkpoint's own?")
    return t.pop(name)
  return take


def _gpt2_params(config: TransformerConfig, t: dict[str, np.ndarray]):
  take = _taker(t, "transformer.")
  d = config.d_model
  norm = lambda name: {"scale": take(f"{name}.weight"),
                       "bias": take(f"{name}.bias")}
  # Conv1D weights are already [in, out], as flax kernels are.
  dense = lambda name: {"kernel": take(f"{name}.weight"),
                        "bias": take(f"{name}.bias")}
  blocks = {}
  for i in range(config.num_layers):
    p = f"h.{i}"
    qkv_w, qkv_b = take(f"{p}.attn.c_attn.weight"), take(f"{p}.attn.c_attn.bias")
    # Split below into thirds: a fused tensor of another width would be cut
    # silently, so its shape is checked whole.
    for name, x, want in (("weight", qkv_w, (d, 3 * d)),
                          ("bias", qkv_b, (3 * d,))):
      if tuple(x.shape) != want:
        raise ValueError(f"Checkpoint tensor {p}.attn.c_attn.{name} has shape "
                         f"{tuple(x.shape)}, the config implies {want}.")
    blocks[i] = {
        "attn_norm": norm(f"{p}.ln_1"), "mlp_norm": norm(f"{p}.ln_2"),
        "attn": {
            name: {"kernel": qkv_w[:, j * d:(j + 1) * d],
                   "bias": qkv_b[j * d:(j + 1) * d]}
            for j, name in enumerate(("query", "key", "value"))
        } | {"out": dense(f"{p}.attn.c_proj")},
        "mlp": {"up": dense(f"{p}.mlp.c_fc"), "down": dense(f"{p}.mlp.c_proj")},
    }
  params = {"embed": {"embedding": take("wte.weight")},
            "pos_embed": {"embedding": take("wpe.weight")},
            "blocks": blocks, "final_norm": norm("ln_f")}
  return params, "lm_head.weight"


def _llama_params(config: TransformerConfig, t: dict[str, np.ndarray]):
  take = _taker(t, "model.")
  # torch Linear weights are [out, in]; flax kernels are [in, out].
  dense = lambda name, bias=False: (
      {"kernel": take(f"{name}.weight").T}
      | ({"bias": take(f"{name}.bias")} if bias else {}))
  blocks = {}
  for i in range(config.num_layers):
    p = f"layers.{i}"
    attn = {mine: dense(f"{p}.self_attn.{theirs}", config.qkv_bias)
            for mine, theirs in (("query", "q_proj"), ("key", "k_proj"),
                                 ("value", "v_proj"))}
    blocks[i] = {
        "attn_norm": {"scale": take(f"{p}.input_layernorm.weight")},
        "mlp_norm": {"scale": take(f"{p}.post_attention_layernorm.weight")},
        "attn": attn | {"out": dense(f"{p}.self_attn.o_proj")},
        "mlp": {"gate": dense(f"{p}.mlp.gate_proj"),
                "up": dense(f"{p}.mlp.up_proj"),
                "down": dense(f"{p}.mlp.down_proj")},
    }
  params = {"embed": {"embedding": take("embed_tokens.weight")},
            "blocks": blocks, "final_norm": {"scale": take("norm.weight")}}
  return params, "lm_head.weight"


def model_from_tensors(config: TransformerConfig,
                       tensors: dict[str, np.ndarray],
                       dtype: Any = None) -> TransformerLM:
  """A `TransformerLM` of `config` holding the checkpoint's tensors.

  Raises ValueError naming a tensor that is missing, left over, or of the
  wrong shape. Arrays are cast to `dtype` (default: kept as they are).
  """
  tensors = dict(tensors)
  if config.flavour == "gpt2":
    tensors = _strip(tensors, "transformer.")
    params, head = _gpt2_params(config, tensors)
  else:
    head_tensor = tensors.pop("lm_head.weight", None)
    tensors = _strip(tensors, "model.")
    if head_tensor is not None:
      tensors["lm_head.weight"] = head_tensor
    params, head = _llama_params(config, tensors)
  head_tensor = tensors.pop(head, None)
  if config.tie_embeddings and head_tensor is not None and not (
      head_tensor.shape == params["embed"]["embedding"].shape
      and np.array_equal(head_tensor, params["embed"]["embedding"])):
    # transformers >= 5 then keeps the file's head (untied) and warns;
    # dropping it would silently change every logit.
    warnings.warn(
        f"config.json ties the head to the embeddings "
        f"(tie_word_embeddings), but the checkpoint's {head} differs from "
        "them: it is used as an untied head, as transformers >= 5 does "
        "(transformers 4.x overwrote it with the embeddings).", UserWarning,
        stacklevel=2)
    config = dataclasses.replace(config, tie_embeddings=False)
  if not config.tie_embeddings:
    if head_tensor is None:
      raise ValueError("The checkpoint has untied embeddings "
                       "(tie_word_embeddings false) but no lm_head.weight.")
    params["lm_head"] = {"kernel": head_tensor.T}
  if tensors:
    raise ValueError(f"Checkpoint tensors not used by a {config.flavour} "
                     f"model: {sorted(tensors)[:8]}; is config.json right?")
  abstract = nnx.eval_shape(
      lambda: transformer_lib.Transformer(config, nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  want = nnx.to_pure_dict(state)

  def put(path, spec, value):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if tuple(value.shape) != tuple(spec.shape):
      raise ValueError(f"Checkpoint tensor for {name} has shape "
                       f"{tuple(value.shape)}, the config implies "
                       f"{tuple(spec.shape)}.")
    return jnp.asarray(value, dtype=dtype or value.dtype)

  try:
    filled = jax.tree_util.tree_map_with_path(put, want, params)
  except ValueError as e:
    if "shape" in str(e):
      raise
    raise ValueError(f"Checkpoint tensors do not match the config's "
                     f"parameters ({e}).") from None
  nnx.replace_by_pure_dict(state, filled)
  return TransformerLM(config=config, graphdef=graphdef, state=state)


def load(path: str | os.PathLike, *, dtype: Any = None,
         max_positions: int | None = None, tokenizer: bool = True):
  """Loads a Hugging Face causal LM checkpoint as a specjax `TransformerLM`.

  Args:
    path: a local directory (config.json + safetensors weights, as written
      by `save_pretrained`) or `hf:<repo_id>` (downloaded lazily through
      huggingface_hub; see `resolve`).
    dtype: weight and compute dtype (e.g. 'bfloat16', jnp.float32); None
      keeps the checkpoint's dtype. Logits are returned as float32 and the
      decode loop's probabilities and coupling math are float32 regardless.
    max_positions: cap the context (see `config_from_hf`).
    tokenizer: also load the tokenizer (tokenizer.json); False returns None.

  Returns:
    `(model, tokenizer)`: the `TransformerLM` and an `HFTokenizer` (None when
    the directory has no tokenizer.json or `tokenizer=False`). The
    tokenizer's `eos_ids` are those transformers' generate stops on:
    generation_config.json's (none if it sets none), or where that file is
    missing config.json's, else the tokenizer's eos_token.

  Raises:
    UnsupportedConfigError naming the config.json field the model does not
    implement; FileNotFoundError / OSError for missing files or downloads.
  """
  if dtype is not None:
    dtype = transformer_lib.float_dtype_name("dtype", dtype)
  if max_positions is not None:
    max_positions = _checks.check_int("max_positions", max_positions, low=1)
  tokenizer = _checks.check_bool("tokenizer", tokenizer)
  directory = resolve(path)
  hf = read_json(directory, "config.json")
  tensors = read_safetensors(directory)
  if dtype is None:
    # The embedding's dtype stands for the checkpoint's (norm scales are
    # sometimes stored wider).
    emb = [v for k, v in tensors.items()
           if k.endswith(("wte.weight", "embed_tokens.weight"))]
    if not emb:
      raise ValueError(f"{directory} holds no token embedding (wte.weight or "
                       "embed_tokens.weight); is it a causal LM checkpoint?")
    dtype = transformer_lib.float_dtype_name("the checkpoint's dtype",
                                             emb[0].dtype)
    if dtype == "float64" and not jax.config.read("jax_enable_x64"):
      dtype = "float32"  # what JAX would make of it anyway, said up front
  config = config_from_hf(hf, dtype=dtype, max_positions=max_positions)
  if config.flavour == "gpt2" and max_positions is not None:
    # A capped context keeps the first rows of the position table.
    for key in [k for k in tensors if k.endswith("wpe.weight")]:
      tensors[key] = tensors[key][:config.max_positions]
  model = model_from_tensors(config, tensors, dtype=jnp.dtype(dtype))
  tok = None
  if tokenizer and (directory / "tokenizer.json").is_file():
    tok = HFTokenizer.from_dir(directory)
  return model, tok
