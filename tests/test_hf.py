"""Hugging Face checkpoints: parity with transformers' committed outputs.

tests/data/hf holds tiny random checkpoints written by transformers'
`save_pretrained` and its outputs (tests/data/hf/make_reference.py). These
tests need no torch; `test_live_parity` rebuilds the references with
transformers when torch and transformers are importable.
"""

import dataclasses
import importlib.util
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax import sampling as sampling_lib
from specjax.data import ByteTokenizer
from specjax.data import HFTokenizer
from specjax.data import encode_batch
from specjax.models import derived
from specjax.models import hf
from specjax.models import vocab

DATA = pathlib.Path(__file__).resolve().parent / "data" / "hf"
NAMES = ("gpt2", "llama_gqa", "llama3_tied", "qwen2", "mistral")
ATOL = 1e-4


# GPT-2, Llama (GQA) and Qwen2 in the fast tier; Llama 3's tied head and
# Mistral's sliding window in the full tier.
@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=pytest.mark.full)
    if name in ("llama3_tied", "mistral") else name for name in NAMES])
def checkpoint(request):
  name = request.param
  model, tok = hf.load(DATA / name)
  ref = dict(np.load(DATA / name / "reference.npz"))
  ref.update(json.loads((DATA / name / "reference.json").read_text()))
  return name, model, tok, ref


def test_full_logits_match_transformers(checkpoint):
  _, model, _, ref = checkpoint
  logits = np.asarray(model.logits(jnp.asarray(ref["tokens"])))
  assert logits.dtype == np.float32
  np.testing.assert_allclose(logits, ref["logits"], atol=ATOL, rtol=0)


def test_incremental_logits_after_ragged_prompts(checkpoint):
  _, model, _, ref = checkpoint
  tokens_BxT, want_BxTxV = ref["tokens"], ref["logits"]
  lengths = np.array([5, 9])
  cache = model.init_cache(2, 16)
  prompts = np.where(np.arange(9)[None] < lengths[:, None], tokens_BxT[:, :9],
                     0)
  _, cache = model(jnp.asarray(prompts), cache)
  cache = cache.replace(lengths=jnp.asarray(lengths, jnp.int32))
  step = jax.jit(lambda m, t, c: m(t, c))
  for width in (1, 2):  # a decode step, then a 2-token verify window
    cols = lengths[:, None] + np.arange(width)[None]
    new = np.take_along_axis(tokens_BxT, cols, axis=1)
    logits, cache = step(model, jnp.asarray(new), cache)
    want = np.take_along_axis(want_BxTxV, cols[:, :, None], axis=1)
    np.testing.assert_allclose(np.asarray(logits), want, atol=ATOL, rtol=0)
    lengths = lengths + width


def _prompts(ref):
  lengths = ref["prompt_lengths"]
  return np.where(ref["prompts"] >= 0, ref["prompts"], 0), lengths


def _check_stream(result, ref):
  got_len = np.asarray(result.lengths)
  np.testing.assert_array_equal(got_len, ref["generated_lengths"])
  for row, n in enumerate(got_len):
    np.testing.assert_array_equal(np.asarray(result.tokens)[row, :n],
                                  ref["generated"][row, :n])


def test_greedy_generate_matches_transformers(checkpoint):
  _, model, tok, ref = checkpoint
  assert list(tok.eos_ids) == ref["eos_ids"]
  prompts, lengths = _prompts(ref)
  out = sj.generate(model, prompts, lengths, jax.random.key(0),
                    max_new_tokens=32, sampling=sj.GREEDY, eos_id=tok.eos_ids)
  _check_stream(out, ref)
  texts = [tok.decode(np.asarray(out.tokens)[r, :n])
           for r, n in enumerate(np.asarray(out.lengths))]
  assert texts == ref["decoded"]


def test_speculative_generate_matches_transformers(checkpoint):
  _, model, tok, ref = checkpoint
  prompts, lengths = _prompts(ref)
  draft = derived.truncate(model, 1)
  out = sj.speculative_generate(model, draft, prompts, lengths,
                                jax.random.key(0), gamma=3, max_new_tokens=32,
                                sampling=sj.GREEDY, eos_id=tok.eos_ids)
  _check_stream(out, ref)


def test_tokenizer_ids_match_transformers(checkpoint):
  _, _, tok, ref = checkpoint
  for case in ref["tokenizer"]:
    assert tok.encode(case["text"], add_special_tokens=True).tolist() == \
        case["ids"], case["text"]
    assert tok.encode(case["text"]).tolist() == case["ids_no_special"]
    assert tok.decode(case["ids_no_special"]) == case["text"]


def test_encode_batch_right_pads():
  tok = HFTokenizer.from_dir(DATA / "llama3_tied")
  prompts, lengths = encode_batch(tok, ["hi", "a longer prompt"], add_bos=True)
  assert prompts.dtype == np.int32 and lengths.tolist()[0] < lengths[1]
  assert prompts.shape == (2, lengths.max())
  assert (prompts[:, 0] == tok.bos_id).all()
  assert (prompts[0, lengths[0]:] == tok.pad_id).all()
  byte_prompts, byte_lengths = encode_batch(ByteTokenizer(), ["ab", "c"])
  assert byte_prompts.tolist() == [[97, 98], [99, 258]]
  assert byte_lengths.tolist() == [2, 1]
  with pytest.raises(ValueError, match="no tokens"):
    encode_batch(tok, ["", "x"])
  with pytest.raises(ValueError, match="sequence of strings"):
    encode_batch(tok, "one string")
  from specjax.data import Tokenizer  # pylint: disable=g-import-not-at-top
  assert isinstance(tok, Tokenizer) and isinstance(ByteTokenizer(), Tokenizer)


def test_several_eos_ids_stop_a_row():
  model, tok = hf.load(DATA / "llama3_tied")
  ref = np.load(DATA / "llama3_tied" / "reference.npz")
  # Row 1 of the reference stops at the second EOS id of three.
  n = ref["generated_lengths"][1]
  assert n < 32 and ref["generated"][1, n - 1] == tok.eos_ids[1]
  prompts, lengths = _prompts(ref)
  only_first = sj.generate(model, prompts, lengths, jax.random.key(0),
                           max_new_tokens=32, sampling=sj.GREEDY,
                           eos_id=tok.eos_ids[0])
  assert int(only_first.lengths[1]) > n  # the other ids are what stop it
  # No ids (a tokenizer whose generation_config.json sets none): no EOS.
  never = sj.generate(model, prompts, lengths, jax.random.key(0),
                      max_new_tokens=32, sampling=sj.GREEDY, eos_id=())
  assert (np.asarray(never.lengths) == 32).all()
  with pytest.raises(ValueError, match="eos_id"):
    sj.generate(model, prompts, lengths, jax.random.key(0), max_new_tokens=4,
                eos_id=(1, model.vocab_size))


# --------------------------------------------------------- dtypes and files --


def test_bfloat16_weights_compute_in_bf16_return_float32_logits(tmp_path):
  model32, _ = hf.load(DATA / "llama_gqa")
  model16, _ = hf.load(DATA / "llama_gqa", dtype="bfloat16")
  assert model16.config.dtype == "bfloat16"
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(model16.state))
  tokens = jnp.asarray(np.load(DATA / "llama_gqa" / "reference.npz")["tokens"])
  logits16 = model16.logits(tokens)
  assert logits16.dtype == jnp.float32
  np.testing.assert_allclose(logits16, model32.logits(tokens), atol=0.15)
  # A bfloat16 checkpoint keeps its dtype without dtype=.
  from safetensors.flax import save_file  # pylint: disable=g-import-not-at-top
  shutil.copytree(DATA / "llama_gqa", tmp_path / "bf16")
  tensors = hf.read_safetensors(DATA / "llama_gqa")
  save_file({k: jnp.asarray(v, jnp.bfloat16) for k, v in tensors.items()},
            str(tmp_path / "bf16" / "model.safetensors"))
  loaded, _ = hf.load(tmp_path / "bf16")
  assert loaded.config.dtype == "bfloat16"
  np.testing.assert_array_equal(loaded.logits(tokens), logits16)


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  src = DATA / "qwen2"
  for f in ("config.json", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"):
    shutil.copy(src / f, tmp_path / f)
  tensors = hf.read_safetensors(src)
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  for file, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
  sharded, _ = hf.load(tmp_path)
  single, _ = hf.load(src)
  tokens = jnp.asarray([[1, 2, 3, 4]])
  np.testing.assert_array_equal(sharded.logits(tokens), single.logits(tokens))


def test_ids_past_the_tokenizer_decode_to_nothing():
  tok = HFTokenizer.from_dir(DATA / "gpt2")
  # Past u32 the tokenizers library raised an OverflowError.
  assert tok.decode([2**40, 5, tok.vocab_size]) == tok.decode([5])


def test_damaged_files_are_named(tmp_path):
  for name in ("config.json", "model.safetensors", "tokenizer.json"):
    shutil.copy(DATA / "gpt2" / name, tmp_path / name)
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match="config.json is not valid JSON"):
    hf.load(tmp_path)
  shutil.copy(DATA / "gpt2" / "config.json", tmp_path / "config.json")
  weights = (tmp_path / "model.safetensors").read_bytes()
  (tmp_path / "model.safetensors").write_bytes(weights[:len(weights) // 2])
  with pytest.raises(ValueError, match="model.safetensors could not be read"):
    hf.load(tmp_path)
  shutil.copy(DATA / "gpt2" / "tokenizer.json", tmp_path / "tokenizer.json")
  for config, match in (([], "config.json must hold a JSON object"),
                        ({"eos_token_id": "abc"}, "eos_token_id must be a"),
                        ({"bos_token_id": 99_999_999}, "outside the")):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
      HFTokenizer.from_dir(tmp_path)
  (tmp_path / "config.json").write_text("{}")
  # A special token that is no string, or an EOS nothing resolves (the
  # generation would never stop): refused, naming the file.
  for cfg, match in (({"bos_token": ["a"]}, "bos_token must be a token "
                      "string"),
                     ({"eos_token": "<nothere>"}, "eos_token '<nothere>' is "
                      "not in tokenizer.json's vocabulary")):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
      HFTokenizer.from_dir(tmp_path)
  with pytest.raises(TypeError, match="directory must be a checkpoint"):
    HFTokenizer.from_dir(None)
  (tmp_path / "tokenizer.json").write_text("{}")
  with pytest.raises(ValueError, match="tokenizer.json could not be read"):
    HFTokenizer.from_dir(tmp_path)


def test_an_eos_id_past_the_tokenizer_is_dropped_with_a_warning(tmp_path):
  """As transformers loads it: a GPT-2 config saved beside a small tokenizer
  keeps GPT2Config's default EOS 50256, which no generation can emit."""
  for name in ("config.json", "model.safetensors", "tokenizer.json"):
    shutil.copy(DATA / "gpt2" / name, tmp_path / name)
  generation = tmp_path / "generation_config.json"
  generation.write_text(json.dumps({"eos_token_id": 50256}))
  with pytest.warns(UserWarning, match=r"dropped \[50256\].*only at "
                    "max_new_tokens"):
    model, tok = hf.load(tmp_path)
  assert tok.eos_ids == () and model.vocab_size < 50256
  generation.write_text(json.dumps({"eos_token_id": [50256, 7]}))
  with pytest.warns(UserWarning, match=r"dropped \[50256\]"):
    assert HFTokenizer.from_dir(tmp_path).eos_ids == (7,)


def test_missing_files_and_hub_ids_name_the_fix(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf.load(tmp_path)
  shutil.copy(DATA / "gpt2" / "config.json", tmp_path / "config.json")
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf.load(tmp_path)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
  error = ImportError if importlib.util.find_spec("huggingface_hub") is None \
      else OSError
  with pytest.raises(error, match="local directory"):
    hf.load("hf:specjax-tests/does-not-exist")


# ------------------------------------------------- unsupported config fields --


def _config(name):
  return json.loads((DATA / name / "config.json").read_text())


UNSUPPORTED = [
    ("gpt2", {"architectures": ["GPT2Model"]}, "architectures"),
    ("gpt2", {"activation_function": "relu"}, "activation_function"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True},
     "scale_attn_by_inverse_layer_idx"),
    ("gpt2", {"scale_attn_weights": False}, "scale_attn_weights"),
    ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
    ("llama_gqa", {"attention_bias": True}, "attention_bias"),
    ("llama_gqa", {"mlp_bias": True}, "mlp_bias"),
    ("llama_gqa", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama_gqa", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama_gqa", {"quantization_config": {"quant_method": "gptq"}},
     "quantization_config"),
    ("llama_gqa", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                       "rope_theta": 1e4}},
     "rope_parameters.rope_type"),
    ("llama_gqa", {"rope_parameters": None, "rope_theta": 1e4,
                   "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling.rope_type"),
    ("llama_gqa", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                       "attention_factor": 2.0}},
     "rope_parameters.attention_factor"),
    ("llama_gqa", {"rope_parameters": {"rope_type": "default",
                                       "rope_theta": 1e4,
                                       "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor"),
    # A scaling dict without its kind is not plain RoPE.
    ("llama_gqa", {"rope_parameters": None, "rope_theta": 1e4,
                   "rope_scaling": {"factor": 4.0}}, "rope_scaling.rope_type"),
    # transformers >= 5's per-layer-type layout: one set is implemented.
    ("qwen2", {"layer_types": ["full_attention", "sliding_attention"],
               "rope_parameters": {
                   "full_attention": {"rope_type": "default",
                                      "rope_theta": 1e4},
                   "sliding_attention": {"rope_type": "default",
                                         "rope_theta": 1e6}}},
     "rope_parameters"),
    ("mistral", {"sliding_window": 32}, "sliding_window"),
    ("mistral", {"sliding_window": "32"}, "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 32,
               "layer_types": None, "max_window_layers": 1},
     "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 32,
               "layer_types": ["full_attention", "sliding_attention"]},
     "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 32,
               "layer_types": None, "max_window_layers": "1"},
     "max_window_layers"),
    # Refused as a window, not advised as max_positions=-5.
    ("mistral", {"sliding_window": -5}, "sliding_window"),
    # Not read letter by letter as layer types.
    ("qwen2", {"layer_types": "full_attention"}, "layer_types"),
    ("qwen2", {"layer_types": "full_attention", "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "layer_types"),
]


@pytest.mark.parametrize("name,change,field", UNSUPPORTED,
                         ids=[f"{n}-{f}" for n, _, f in UNSUPPORTED])
def test_unsupported_config_field_is_named(name, change, field):
  config = _config(name) | change
  with pytest.raises(hf.UnsupportedConfigError) as info:
    hf.config_from_hf(config)
  assert info.value.field == field
  assert repr(field) in str(info.value)


def test_config_values_that_would_give_nan_or_raw_errors_are_refused():
  cases = [
      ({"rope_parameters": {"rope_type": "linear", "factor": 0.0,
                            "rope_theta": 1e4}}, "factor"),
      ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}},
       "rope_theta"),
      ({"rms_norm_eps": -1.0}, "norm_eps"),
      ({"intermediate_size": None}, "intermediate_size"),
      ({"num_hidden_layers": "2"}, "num_layers"),
      ({"tie_word_embeddings": "false"}, "tie_embeddings"),
  ]
  for change, named in cases:
    config = _config("llama_gqa") | change
    if change.get("intermediate_size", 0) is None:
      del config["intermediate_size"]
    with pytest.raises(ValueError, match=named):
      hf.config_from_hf(config)
  with pytest.raises(ValueError, match="JSON object"):
    hf.config_from_hf([_config("gpt2")])
  # MistralConfig's default window is 4096: a config without the key has
  # one, and it is shorter than the 32k positions below.
  mistral = _config("mistral") | {"max_position_embeddings": 32768}
  del mistral["sliding_window"]
  with pytest.raises(hf.UnsupportedConfigError, match="4096"):
    hf.config_from_hf(mistral)


def test_per_layer_type_rope_parameters_are_read():
  nested = _config("qwen2") | {"layer_types": ["full_attention"] * 2}
  flat = nested["rope_parameters"]
  nested["rope_parameters"] = {"full_attention": dict(flat, rope_theta=50.0)}
  assert hf.config_from_hf(nested).rope_theta == 50.0


def test_tensors_and_arguments_are_checked_by_name(tmp_path):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  def write(name, change):
    d = tmp_path / name
    shutil.copytree(DATA / "gpt2", d)
    tensors = hf.read_safetensors(DATA / "gpt2")
    change(tensors)
    save_file(tensors, str(d / "model.safetensors"))
    return d
  # A fused q/k/v tensor of another width would be cut into thirds
  # silently: its whole shape is checked.
  def widen(t):
    key = next(k for k in t if k.endswith("h.0.attn.c_attn.weight"))
    t[key] = np.concatenate([t[key], t[key][:, :4]], 1)
  with pytest.raises(ValueError, match="c_attn.weight has shape"):
    hf.load(write("wide", widen))
  def drop(t):
    del t[next(k for k in t if k.endswith("ln_f.weight"))]
  with pytest.raises(ValueError, match="no tensor .*ln_f.weight"):
    hf.load(write("missing", drop))
  with pytest.raises(ValueError, match="no token embedding"):
    hf.load(write("no_embedding", lambda t: [t.pop(k) for k in list(t)
                                             if "wte" in k]))
  (tmp_path / "index").mkdir()
  shutil.copy(DATA / "gpt2" / "config.json", tmp_path / "index")
  (tmp_path / "index" / "model.safetensors.index.json").write_text("{}")
  with pytest.raises(ValueError, match="weight_map"):
    hf.load(tmp_path / "index")
  (tmp_path / "index" / "model.safetensors.index.json").write_text(
      '{"weight_map": {"a": 5}}')
  with pytest.raises(ValueError, match=r"shard file names \(strings\)"):
    hf.load(tmp_path / "index")
  with pytest.raises(TypeError, match="path must be a checkpoint directory"):
    hf.load(None)
  with pytest.raises(TypeError, match="tokenizer must be a bool"):
    hf.load(DATA / "gpt2", tokenizer="no")
  with pytest.raises(ValueError, match="dtype"):
    hf.load(DATA / "gpt2", dtype="foo")
  with pytest.raises(TypeError, match="max_positions"):
    hf.load(DATA / "gpt2", max_positions="32")
  # A capped GPT-2 context keeps the first rows of its position table.
  full, _ = hf.load(DATA / "gpt2", tokenizer=False)
  capped, _ = hf.load(DATA / "gpt2", max_positions=8, tokenizer=False)
  assert capped.config.max_positions == 8
  tokens = jnp.asarray([[1, 2, 3, 4, 5]])
  np.testing.assert_array_equal(capped.logits(tokens), full.logits(tokens))


def test_sliding_window_is_full_attention_within_the_window():
  config = _config("mistral") | {"sliding_window": 32}
  assert hf.config_from_hf(config, max_positions=32).max_positions == 32


def test_qwen2_window_applies_only_where_transformers_applies_it():
  """transformers' Qwen2Config: a window only with use_sliding_window, and
  only on the layers from max_window_layers on (or as layer_types say)."""
  full = hf.config_from_hf(_config("qwen2"))
  for change in (
      # max_window_layers (28, its default) >= the 2 layers: none slides.
      {"use_sliding_window": True, "sliding_window": 32, "layer_types": None},
      {"use_sliding_window": True, "sliding_window": 32,
       "layer_types": ["full_attention", "full_attention"]},
      # Sliding layer types, but use_sliding_window false: no window.
      {"sliding_window": 32,
       "layer_types": ["sliding_attention", "sliding_attention"]}):
    assert hf.config_from_hf(_config("qwen2") | change) == full, change


def test_unused_rope_scaling_fields_are_dropped_with_a_warning():
  """transformers 4.x re-saves a linear scaling with the llama3 field
  original_max_position_embeddings, which linear RoPE does not read."""
  base = _config("llama_gqa") | {"rope_parameters": None, "rope_theta": 1e4}
  linear = {"type": "linear", "factor": 4.0}
  want = hf.config_from_hf(base | {"rope_scaling": linear})
  with pytest.warns(UserWarning, match=r"\['original_max_position_embeddings'"
                    r"\] are not used by 'linear'"):
    got = hf.config_from_hf(base | {"rope_scaling": linear | {
        "original_max_position_embeddings": 16}})
  assert got == want and want.rope_scaling is not None


@pytest.mark.full
def test_a_tied_config_with_a_different_head_in_the_file_uses_the_head(
    tmp_path):
  """transformers >= 5 keeps a checkpoint's lm_head.weight that differs from
  the embeddings, whatever tie_word_embeddings says; it was dropped."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  src = DATA / "llama3_tied"
  tied, _ = hf.load(src)
  tensors = hf.read_safetensors(src)
  embedding = tensors["model.embed_tokens.weight"]
  shutil.copytree(src, tmp_path / "same")
  save_file(tensors | {"lm_head.weight": embedding.copy()},
            str(tmp_path / "same" / "model.safetensors"))
  same, _ = hf.load(tmp_path / "same")  # an equal copy: still tied
  assert same.config == tied.config and same.config.tie_embeddings
  head = np.random.default_rng(0).normal(size=embedding.shape).astype(
      embedding.dtype)
  shutil.copytree(src, tmp_path / "head")
  save_file(tensors | {"lm_head.weight": head},
            str(tmp_path / "head" / "model.safetensors"))
  with pytest.warns(UserWarning, match="lm_head.weight differs"):
    untied, _ = hf.load(tmp_path / "head")
  assert not untied.config.tie_embeddings
  tokens = jnp.asarray([[1, 2, 3, 4]])
  _, hidden, _ = untied.forward_with_hidden(tokens, untied.init_cache(1, 8))
  np.testing.assert_allclose(untied.logits(tokens), hidden @ head.T,
                             rtol=1e-5, atol=1e-5)


def test_eos_ids_are_those_transformers_generate_stops_on(tmp_path):
  src = DATA / "llama3_tied"
  config_eos = _config("llama3_tied")["eos_token_id"]
  shutil.copytree(src, tmp_path / "c")
  # generation_config.json present without eos_token_id: no EOS, as in
  # transformers; config.json's ids stopped rows that transformers runs on.
  generation = json.loads((src / "generation_config.json").read_text())
  del generation["eos_token_id"]
  (tmp_path / "c" / "generation_config.json").write_text(
      json.dumps(generation))
  assert HFTokenizer.from_dir(tmp_path / "c").eos_ids == ()
  (tmp_path / "c" / "generation_config.json").unlink()  # then config.json's
  assert HFTokenizer.from_dir(tmp_path / "c").eos_ids == tuple(
      config_eos if isinstance(config_eos, list) else [config_eos])


def test_older_rope_layouts_are_read_as_the_new_one():
  # Old-style (transformers < 5) rope fields.
  old = _config("llama3_tied")
  params = old.pop("rope_parameters")
  old["rope_theta"] = params.pop("rope_theta")
  old["rope_scaling"] = params
  assert hf.config_from_hf(old) == hf.config_from_hf(_config("llama3_tied"))
  # transformers 4.x re-saves an old `type` beside its `rope_type`.
  both = old | {"rope_scaling": params | {"type": params["rope_type"]}}
  assert hf.config_from_hf(both) == hf.config_from_hf(_config("llama3_tied"))
  with pytest.raises(hf.UnsupportedConfigError, match="contradicts"):
    hf.config_from_hf(old | {"rope_scaling": params | {"type": "linear"}})
  # An empty rope_scaling beside rope_parameters was read as default RoPE,
  # dropping the llama3 scaling.
  empty = _config("llama3_tied") | {"rope_scaling": {}}
  assert hf.config_from_hf(empty) == hf.config_from_hf(_config("llama3_tied"))


# ------------------------------------------------------------- vocabularies --


def _probs(model, tokens, sampling):
  cache = model.init_cache(1, 8)
  logits, _ = model(jnp.asarray(tokens), cache)
  return np.asarray(sampling_lib.probabilities(logits[0, -1], sampling))


@pytest.mark.full
def test_padded_vocabularies_are_reconciled_with_zero_mass():
  target, target_tok = hf.load(DATA / "qwen2")        # 320-row head
  draft, draft_tok = hf.load(DATA / "qwen2_draft")    # 304-row head
  assert (target.vocab_size, draft.vocab_size, target_tok.vocab_size) == (
      320, 304, 300)
  t, d = vocab.reconcile(target, draft, target_tok, draft_tok)
  assert t.vocab_size == d.vocab_size == 320
  for sampling in (sj.SamplingConfig(temperature=1.0),
                   sj.SamplingConfig(temperature=0.3, top_p=0.9)):
    for m in (t, d):
      p = _probs(m, [[5, 6, 7]], sampling)
      assert p.shape == (320,) and (p[300:] == 0).all() and p[:300].sum() > 0
  ref = np.load(DATA / "qwen2" / "reference.npz")
  prompts, lengths = _prompts(ref)
  # The random target's greedy stream reaches padding ids (transformers emits
  # them), so the reconciled target's own stream is the reference here.
  assert (ref["generated"] >= 300).any()
  kwargs = dict(max_new_tokens=32, sampling=sj.GREEDY,
                eos_id=target_tok.eos_ids)
  want = sj.generate(t, prompts, lengths, jax.random.key(0), **kwargs)
  got = sj.speculative_generate(t, d, prompts, lengths, jax.random.key(0),
                                gamma=4, **kwargs)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert (np.asarray(want.tokens) < 300).all()
  # Ids 300-319 are no token: refused in a prompt (id 310 is past the
  # draft's 304-row embedding: NaN logits) and as EOS (never emitted).
  bad = np.array([[5, 6, 310]], np.int32)
  for args, match in (
      (dict(prompts=bad), r"prompts\[0, 2\] = 310 is outside the tokenizer's "
       r"\(PaddedVocabLM.num_real\) vocabulary \[0, 300\)"),
      (dict(eos_id=302), r"eos_id must be .*299")):
    kwargs = dict(prompts=prompts, max_new_tokens=4, gamma=2) | args
    kwargs.setdefault("prompt_lengths",
                      [3] if "prompts" in args else lengths)
    with pytest.raises(ValueError, match=match):
      sj.speculative_generate(t, d, key=jax.random.key(0), **kwargs)
  with pytest.raises(ValueError, match="num_real must be <= 304"):
    vocab.PaddedVocabLM(draft, 320, 310)
  with pytest.raises(TypeError, match="must be a CausalLM"):
    vocab.PaddedVocabLM(None, 320, 300)


def test_different_tokenizers_are_refused_naming_the_token():
  gpt2_tok = HFTokenizer.from_dir(DATA / "gpt2")
  llama_tok = HFTokenizer.from_dir(DATA / "llama_gqa")
  model, _ = hf.load(DATA / "llama_gqa")
  with pytest.raises(ValueError, match="at id 0: target '<|endoftext|>', "
                     "draft '<|begin_of_text|>'"):
    vocab.reconcile(model, model, gpt2_tok, llama_tok)


@pytest.mark.full
def test_reduced_vocabulary_draft_is_exact_with_zero_q_elsewhere():
  target, tok = hf.load(DATA / "gpt2")
  ref = np.load(DATA / "gpt2" / "reference.npz")
  keep = vocab.frequent_tokens(ref["generated"], target.vocab_size, 64,
                               include=tok.eos_ids)
  assert keep.size == 64 and set(tok.eos_ids) <= set(keep.tolist())
  draft = vocab.ReducedVocabLM.create(derived.truncate(target, 1), keep)
  q = _probs(draft, [[5, 6, 7]], sj.SamplingConfig(temperature=1.0))
  outside = np.setdiff1d(np.arange(target.vocab_size), keep)
  assert (q[outside] == 0).all() and q[keep].sum() == pytest.approx(1, 1e-5)
  prompts, lengths = _prompts(ref)
  out = sj.speculative_generate(target, draft, prompts, lengths,
                                jax.random.key(0), gamma=4, max_new_tokens=32,
                                sampling=sj.GREEDY, eos_id=tok.eos_ids)
  _check_stream(out, ref)


def test_vocabulary_helpers_keep_their_promises():
  ids = np.array([1, 1, 1, 5, 5, 2, 3, 9])
  np.testing.assert_array_equal(vocab.frequent_tokens(ids, 30, 2), [1, 5])
  np.testing.assert_array_equal(
      vocab.frequent_tokens(ids, 30, 3, include=[9]), [1, 5, 9])
  # More ids to include than k, or ids off the vocabulary: never dropped
  # or wrapped around silently.
  for include, match in (([1, 5, 9], "raise k"), ([-1], r"\[0, 30\)"),
                         ([30], r"\[0, 30\)")):
    with pytest.raises(ValueError, match=match):
      vocab.frequent_tokens(ids, 30, 2, include=include)
  with pytest.raises(TypeError, match="include must be an integer"):
    vocab.frequent_tokens(ids, 30, 2, include=[1.5])
  # Padding (-1) is skipped; an id of another vocabulary is refused, not
  # dropped (the most frequent id would vanish), and so is nothing to count.
  np.testing.assert_array_equal(
      vocab.frequent_tokens(np.append(ids, [-1] * 9), 30, 2), [1, 5])
  for token_ids, match in (([20, 20, 20, 5], "holds id 20, outside"),
                           ([], "no id >= 0"), ([-1, -1], "no id >= 0")):
    with pytest.raises(ValueError, match=match):
      vocab.frequent_tokens(np.array(token_ids, np.int32), 16, 1)
  model, _ = hf.load(DATA / "gpt2")
  with pytest.raises(TypeError, match="token_ids_K must be an integer"):
    vocab.ReducedVocabLM.create(model, np.array([True, False]))
  with pytest.raises(ValueError, match="num_real must be <= 20"):
    vocab.PaddedVocabLM(model, 20, 25)


def test_truncate_shares_weights_and_checks_layers():
  model, _ = hf.load(DATA / "llama_gqa")
  draft = derived.truncate(model, 1)
  assert draft.config == dataclasses.replace(model.config, num_layers=1)
  assert draft.state["embed"]["embedding"][...] is \
      model.state["embed"]["embedding"][...]
  with pytest.raises(ValueError, match="num_layers"):
    derived.truncate(model, 3)


# --------------------------------------------------------------------- live --


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None
    or importlib.util.find_spec("transformers") is None,
    reason="live parity needs torch and transformers (pip install .[reference])")
def test_live_parity_with_transformers(tmp_path):
  """Rebuilds two references with the installed transformers and compares."""
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(DATA))
  import make_reference  # pylint: disable=g-import-not-at-top
  for name in ("llama3_tied",):
    make_reference.build_one(name, tmp_path / name)
    model, tok = hf.load(tmp_path / name)
    ref = dict(np.load(tmp_path / name / "reference.npz"))
    np.testing.assert_allclose(model.logits(jnp.asarray(ref["tokens"])),
                               ref["logits"], atol=ATOL, rtol=0)
    prompts, lengths = _prompts(ref)
    out = sj.generate(model, prompts, lengths, jax.random.key(0),
                      max_new_tokens=32, sampling=sj.GREEDY,
                      eos_id=tok.eos_ids)
    _check_stream(out, ref)
    for case in json.loads((tmp_path / name / "reference.json").read_text()
                           )["tokenizer"]:
      assert tok.encode(case["text"], add_special_tokens=True).tolist() == \
          case["ids"]


def test_encode_names_what_the_tokenizer_cannot_encode(tmp_path):
  """The tokenizers library raised a bare Exception."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1}))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(tmp_path / "tokenizer.json"))
  hf_tok = HFTokenizer.from_dir(tmp_path)
  np.testing.assert_array_equal(hf_tok.encode("a b"), [0, 1])
  with pytest.raises(ValueError, match="cannot encode 'a zzz'.*unknown token"):
    hf_tok.encode("a zzz")
  with pytest.raises(TypeError, match="add_special_tokens must be a bool"):
    hf_tok.encode("a", add_special_tokens="yes")
