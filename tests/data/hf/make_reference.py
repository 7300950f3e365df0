"""Writes the tiny Hugging Face checkpoints and transformers' reference outputs.

  pip install -e '.[reference]'    # torch (CPU) + transformers
  python tests/data/hf/make_reference.py            # rewrites tests/data/hf/*

Each checkpoint directory holds what `save_pretrained` writes (config.json,
model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json) plus `reference.npz` and `reference.json` with
transformers' outputs (float32, CPU, eager attention):

* `tokens`, `logits`: a `[2, 12]` batch of ids and its full-sequence logits
  `[2, 12, V]` (each row run alone, no padding).
* `prompts`, `prompt_lengths`, `generated`, `generated_lengths`: ragged
  prompts and `generate(do_sample=False, max_new_tokens=32)` run per row
  (stops at any of the generation config's EOS ids; -1 past the length).
* reference.json `tokenizer`: for each test string, transformers' ids with and
  without special tokens.

The weights are random with a wide init (std 0.15), so greedy choices are
separated by clear logit margins (printed) and fp32 rounding cannot flip them.
`tests/test_hf.py` checks specjax against these files without torch; when
torch and transformers are importable it also rebuilds them into a temporary
directory (`build`) and compares live.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent

# Strings for the tokenizer parity: Unicode, whitespace runs, specials.
TEXTS = (
    "Hello world",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\tmixed   runs",
    "naïve café — déjà vu, Ωmega ≠ omega",
    "emoji 🙂🚀 and 汉字 and עברית",
    "numbers 1234567 3.14159 and CamelCaseWords",
    "",
)

# Training text of the tiny byte-level BPE (a fixed string, so the tokenizer
# is reproducible; every byte is in the base alphabet anyway).
_CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 3,
    "speculative decoding drafts tokens and the target verifies them. " * 3,
    "def main():\n    return 0\n\n" * 3,
    "naïve café déjà vu Ωmega 🙂 汉字 " * 2,
]

# name -> (architecture, config kwargs, options)
CHECKPOINTS = {
    "gpt2": ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=96),
             dict(vocab=300)),
    "llama_gqa": ("llama", dict(hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2,
                                max_position_embeddings=96,
                                tie_word_embeddings=False),
                  dict(vocab=304, bos=True)),
    "llama3_tied": ("llama", dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1,
        max_position_embeddings=96, tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0,
                          original_max_position_embeddings=16)),
                    dict(vocab=304, bos=True, extra_eos=True)),
    "qwen2": ("qwen2", dict(hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=96,
                            tie_word_embeddings=False),
              dict(vocab=320)),
    # The draft of the padded-vocabulary pair: same tokenizer, 304-row head.
    "qwen2_draft": ("qwen2", dict(hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2,
                                  max_position_embeddings=96,
                                  tie_word_embeddings=True),
                    dict(vocab=304, no_reference=True)),
    "mistral": ("mistral", dict(hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2,
                                max_position_embeddings=96, sliding_window=96,
                                tie_word_embeddings=False),
                dict(vocab=304, bos=True)),
}


def make_tokenizer(bos: bool):
  """A byte-level BPE of 300 ids (specials included) and its HF wrapper."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import processors, trainers  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  if bos:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                "<|pad|>"]
  else:
    specials = ["<|endoftext|>"]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                               use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=300, special_tokens=specials, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_CORPUS, trainer)
  if bos:
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", 0)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok,
                                 bos_token="<|begin_of_text|>",
                                 eos_token="<|end_of_text|>",
                                 pad_token="<|pad|>")
  else:
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok,
                                 bos_token="<|endoftext|>",
                                 eos_token="<|endoftext|>")
  return hf


def _model(arch: str, kwargs: dict, vocab: int, tokenizer, seed: int):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cls = {"gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
         "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
         "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
         "mistral": (transformers.MistralConfig,
                     transformers.MistralForCausalLM)}[arch]
  specials = dict(bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
  config = cls[0](vocab_size=vocab, initializer_range=0.15, **specials,
                  **kwargs)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(seed)
  model = cls[1](config).eval()
  with torch.no_grad():  # norms start at 1; random gains make them matter
    for name, p in model.named_parameters():
      if p.ndim == 1:
        gain = name.endswith("weight")  # 1-D weights are norm gains
        p.copy_(float(gain) + 0.3 * torch.randn_like(p))
  return model


def _greedy(model, prompt, eos_ids, pad_id):
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), do_sample=False,
                         max_new_tokens=32, eos_token_id=list(eos_ids),
                         pad_token_id=pad_id,
                         attention_mask=torch.ones(1, len(prompt), dtype=int))
  new = out[0, len(prompt):].tolist()
  for i, t in enumerate(new):  # cut after the first EOS (then padding)
    if t in eos_ids:
      return new[:i + 1]
  return new


def _margins(model, sequence, start):
  """Smallest top-1 minus top-2 logit over the greedy steps."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    logits = model(torch.tensor([sequence])).logits[0, start - 1:-1]
  top2 = torch.topk(logits, 2, dim=-1).values
  return float((top2[:, 0] - top2[:, 1]).min())


def build_one(name: str, out_dir: pathlib.Path) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  arch, kwargs, opts = CHECKPOINTS[name]
  tokenizer = make_tokenizer(opts.get("bos", False))
  seed = sorted(CHECKPOINTS).index(name)
  model = _model(arch, kwargs, opts["vocab"], tokenizer, seed)
  eos_ids = [tokenizer.eos_token_id]
  if opts.get("bos"):
    eos_ids.append(tokenizer.convert_tokens_to_ids("<|eot_id|>"))
  rng = np.random.default_rng(seed)
  v_real = len(tokenizer)
  prompts = [tokenizer("the quick brown fox")["input_ids"],
             tokenizer("def main():\n    return")["input_ids"]]
  if opts.get("extra_eos"):
    # A third EOS id that greedy decoding of a prompt emits after a few
    # tokens, so the references show a row stopped by a non-first EOS id.
    frees = [_greedy(model, p, eos_ids, tokenizer.pad_token_id)
             for p in prompts]
    # The latest token not seen before in its row.
    i, free = max((i, free) for free in frees for i, t in enumerate(free)
                  if t not in free[:i])
    stop = free[i]
    eos_ids.insert(1, int(stop))
  model.generation_config.eos_token_id = eos_ids
  model.generation_config.pad_token_id = tokenizer.pad_token_id
  model.generation_config.bos_token_id = tokenizer.bos_token_id
  out_dir.mkdir(parents=True, exist_ok=True)
  model.save_pretrained(out_dir, safe_serialization=True)
  tokenizer.save_pretrained(out_dir)
  if opts.get("no_reference"):
    return

  tokens = rng.integers(0, v_real, size=(2, 12))
  with torch.no_grad():
    logits = np.stack([model(torch.tensor(t[None])).logits[0].numpy()
                       for t in tokens])
  generated, margins = [], []
  for p in prompts:
    new = _greedy(model, p, eos_ids, tokenizer.pad_token_id)
    generated.append(new)
    margins.append(_margins(model, p + new, len(p)))
  width = max(map(len, prompts))
  np.savez_compressed(
      out_dir / "reference.npz", tokens=tokens.astype(np.int32),
      logits=logits.astype(np.float32),
      prompts=np.array([p + [-1] * (width - len(p)) for p in prompts],
                       np.int32),
      prompt_lengths=np.array([len(p) for p in prompts], np.int32),
      generated=np.array([g + [-1] * (32 - len(g)) for g in generated],
                         np.int32),
      generated_lengths=np.array([len(g) for g in generated], np.int32))
  reference = {
      "eos_ids": eos_ids,
      "tokenizer": [{"text": t,
                     "ids": tokenizer(t)["input_ids"],
                     "ids_no_special": tokenizer(
                         t, add_special_tokens=False)["input_ids"]}
                    for t in TEXTS],
      "decoded": [tokenizer.decode(g, skip_special_tokens=True)
                  for g in generated],
  }
  (out_dir / "reference.json").write_text(
      json.dumps(reference, ensure_ascii=False) + "\n")
  print(f"{name}: greedy lengths {[len(g) for g in generated]}, smallest "
        f"greedy logit margin {min(margins):.4f}, eos {eos_ids}")


def build(root: pathlib.Path = HERE) -> None:
  """Writes every checkpoint of `CHECKPOINTS` under `root`."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  for name in CHECKPOINTS:
    build_one(name, root / name)


if __name__ == "__main__":
  build(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
