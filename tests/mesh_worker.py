"""Sharded checks run in fresh subprocesses with 8 (fake CPU) devices.

`tests/test_sharding.py` starts this file with
`XLA_FLAGS=--xla_force_host_platform_device_count=8` (or 4 per process for
the multi-process check), so the rest of the suite keeps one device. A run
prints one JSON line `RESULT {...}` that the test reads; the assertions live
in the test, the computation here. `all` runs the decode and train sections
in one process (one JAX start-up); each records its CPU seconds.

  python tests/mesh_worker.py all WORKDIR
  python tests/mesh_worker.py decode
  python tests/mesh_worker.py train WORKDIR
  python tests/mesh_worker.py kinds        (opt-in: -m slow)
  python tests/mesh_worker.py multiproc PROCESS_ID PORT   (2 processes)
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

# The checks compare programs across meshes; keep XLA from choosing
# different algorithms by load.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

import specjax as sj
from specjax import constraint
from specjax import sharding
from specjax import testing
from specjax.decode import loop
from specjax.decode.verifiers import controls
from specjax.models import StringLevelDraft
from specjax.models import StringRejectionDraft
from specjax.models import TokenIntersectionDraft

# 4x2 is not among them: 2x4 already splits both axes, and the train
# section restores a checkpoint onto 4x2 (colab/sharded_decoding.ipynb
# also decodes there). Each mesh costs about 8 s of compiles.
MESHES = ("data:1,model:1", "data:8,model:1", "data:2,model:4")


def _mesh(spec):
  n = int(np.prod([int(p.split(":")[1]) for p in spec.split(",")]))
  return sharding.make_mesh(spec, devices=jax.devices()[:n])


def gqa_models():
  """A Llama-flavour GQA target (8 query / 2 kv heads) and a GPT-2 draft.

  One layer each: every mesh compiles four programs of each, and the
  sharding of a block does not change with depth."""
  target = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=256, d_model=64, num_layers=1, num_heads=8, num_kv_heads=2,
      flavour="llama", max_positions=64), 0)
  draft = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=256, d_model=32, num_layers=1, num_heads=4,
      max_positions=64), 1)
  return target, draft


def prompts(batch=8):
  rng = np.random.default_rng(0)
  return (rng.integers(0, 256, (batch, 10)).astype(np.int32),
          rng.integers(2, 11, batch).astype(np.int32))


def generations(target, draft, mesh):
  """{name: tokens} for greedy and T=1 generate / speculative_generate."""
  p, lens = prompts()
  out = {}
  for temp in (0.0, 1.0):
    sampling = sj.SamplingConfig(temperature=temp)
    key = jax.random.key(7)
    a = sj.generate(target, p, lens, key, max_new_tokens=8,
                    sampling=sampling, mesh=mesh)
    b = sj.speculative_generate(target, draft, p, lens, key, gamma=2,
                                max_new_tokens=8, sampling=sampling,
                                mesh=mesh)
    out[f"generate_T{temp:g}"] = np.asarray(a.tokens).tolist()
    out[f"speculative_T{temp:g}"] = np.asarray(b.tokens).tolist()
  # A constraint's automaton state rides in the loop's carry, per row.
  c = constraint.regex("[a-f]{2,5}( [0-9]+)?", [bytes([i]) for i in
                                                 range(256)])
  out["constrained_T1"] = np.asarray(sj.speculative_generate(
      target, draft, p, lens, jax.random.key(7), gamma=2, max_new_tokens=8,
      mesh=mesh, constraint=c).tokens).tolist()
  return out


def _placed(target, draft, p, lens, key, mesh, *, gamma, max_new_tokens,
            sampling):
  """The compiled loop's arguments, placed on `mesh` as a `mesh=` call does."""
  padded, lengths, keys, *_ = loop._prepare(  # pylint: disable=protected-access
      target, p, lens, key, max_new_tokens=max_new_tokens, lookahead=gamma,
      sampling=sampling, eos_id=None, pad_id=0, models=())
  (t, d), rest = sharding.place_decode_inputs(mesh, (target, draft),
                                              (padded, lengths, keys))
  return (t, d) + tuple(rest)


def vocab_collectives(target, draft):
  """The collectives of the sampled speculative program on 2x4, where the
  vocabulary (256) is sharded on `model`: the program `generations` ran
  (same shapes, so `compile` is served from the in-memory cache)."""
  mesh = _mesh("data:2,model:4")
  p, lens = prompts()
  sampling = sj.SamplingConfig(temperature=1.0)
  args = _placed(target, draft, p, lens, jax.random.key(7), mesh, gamma=2,
                 max_new_tokens=8, sampling=sampling)
  with sharding.using(mesh):
    text = loop._generate.lower(  # pylint: disable=protected-access
        *args, gamma=2, max_new_tokens=8, sampling=sampling, eos_id=None,
        pad_id=0).compile().as_text()
  return {"collectives": sharding.collectives(text),
          "batch_per_device": len(p) // 2, "vocab": target.vocab_size,
          "model": 4}


# -- chi-square on 2x4 ---------------------------------------------------------

# 8000 samples: the wrong-fallback control lands at chi2 ~ 1600 on 63 dof
# (7867 at 40000) and TV 0.18 against a bound of ~0.07, rejected by far.
V, K, N = 8, 2, 8_000
PROMPT = np.array([1, 2, 3], np.int32)


def _peaked(seed, flavour):
  return testing.toy_transformer(V, seed, flavour=flavour, num_heads=4,
                                 num_kv_heads=4, max_positions=16,
                                 embed_scale=6.0)


def chi_square_2x4():
  mesh = _mesh("data:2,model:4")
  target, draft = _peaked(0, "llama"), _peaked(1, "gpt2")
  p = np.tile(PROMPT, (N, 1))
  lens = np.full(N, len(PROMPT), np.int32)
  sampling = sj.SamplingConfig(temperature=1.0)
  check = lambda tokens: testing.check_generation(
      np.asarray(tokens), target, PROMPT, sampling)
  out = sj.speculative_generate(target, draft, p, lens, jax.random.key(3),
                                gamma=3, max_new_tokens=K, sampling=sampling,
                                mesh=mesh)
  exact = check(out.tokens)
  # The same sharded program with the wrong fallback must be rejected.
  args = _placed(target, draft, p, lens, jax.random.key(3), mesh, gamma=3,
                 max_new_tokens=K, sampling=sampling)
  with sharding.using(mesh):
    wrong = loop._generate(  # pylint: disable=protected-access
        *args, gamma=3, max_new_tokens=K, sampling=sampling, eos_id=None,
        pad_id=0, coupling_rule=controls.wrong_fallback_rule)
  control = check(wrong.tokens)
  return {"exact_passed": bool(exact.passed), "exact": str(exact),
          "control_passed": bool(control.passed), "control": str(control),
          "one_minus_tv": out.summary()["one_minus_tv"],
          "tokens_sharding": str(out.tokens.sharding.spec)}


def param_bytes():
  """Per-device parameter bytes of a model whose every size divides 2x4."""
  model = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=256, d_model=64, num_layers=2, num_heads=8, num_kv_heads=4,
      flavour="llama", max_positions=64), 0)
  total = sum(x.nbytes for x in jax.tree.leaves(model.state))
  out = {"total": total}
  for spec in ("data:2,model:4", "data:4,model:2", "data:8,model:1"):
    placed = sharding.shard_model(model, _mesh(spec))
    per_device = sharding.per_device_bytes(placed.state)
    norms = sum(x.nbytes for x in jax.tree.leaves(model.state) if x.ndim == 1)
    out[spec] = {"max": max(per_device.values()),
                 "min": min(per_device.values()), "replicated": norms}
  return out


def decode():
  target, draft = gqa_models()
  results = {spec: generations(target, draft, _mesh(spec)) for spec in MESHES}
  return {"tokens": results, "collectives": vocab_collectives(target, draft),
          "chi_square": chi_square_2x4(), "param_bytes": param_bytes()}


# -- training ------------------------------------------------------------------


def _train_config(mesh_spec, rules="tp", steps=5):
  from specjax.train import recipes  # pylint: disable=g-import-not-at-top
  config = recipes.train_config("tiny")
  config.model.num_layers = 1  # every run compiles its own train step
  config.model.num_heads = 4
  config.model.num_kv_heads = 4
  config.corpus_max_bytes = 50_000
  config.batch_size = 8
  config.seq_len = 32
  config.num_steps = steps
  config.optim.warmup_steps = 1
  config.eval_every = 0
  config.checkpoint_every = 0
  config.log_every = steps
  config.progress = False
  config.mesh = mesh_spec
  config.sharding = rules
  return config


def train(workdir):
  from specjax import train as train_lib  # pylint: disable=g-import-not-at-top
  from specjax.train import checkpoint, distill, optim, trainer  # pylint: disable=g-import-not-at-top
  one = _mesh("data:1,model:1")
  res = {}
  m1, met1 = train_lib.train(_train_config(None), os.path.join(workdir, "one"),
                             mesh=one)
  m24, met24 = train_lib.train(_train_config("data:2,model:4"),
                               os.path.join(workdir, "tp"))
  _, metf = train_lib.train(_train_config("data:2,model:4", "fsdp"),
                            os.path.join(workdir, "fsdp"))
  res["loss_one"] = met1["train_loss"].tolist()
  res["loss_tp"] = met24["train_loss"].tolist()
  res["loss_fsdp"] = metf["train_loss"].tolist()
  res["tp_param_specs"] = sorted({str(x.sharding.spec)
                                  for x in jax.tree.leaves(m24.state)})

  # Restore the 2x4 checkpoint onto 1x1 and 4x2.
  saved = jax.tree.map(np.asarray, m24.state)
  res["restore"] = {}
  for spec in ("data:1,model:1", "data:4,model:2"):
    mesh = _mesh(spec)
    model, _ = checkpoint.load_model(os.path.join(workdir, "tp"), mesh=mesh)
    same = all(np.array_equal(a, np.asarray(b)) for a, b in zip(
        jax.tree.leaves(saved), jax.tree.leaves(model.state)))
    on_mesh = all(x.sharding.mesh.shape == mesh.shape
                  for x in jax.tree.leaves(model.state))
    # The full state (optimizer moments too), restored onto this mesh.
    config = _train_config(spec)
    optimizer, _ = optim.make_optimizer(config.optim, config.num_steps)
    template = trainer.init_state(model, optimizer, mesh,
                                  rules=sharding.RULES)
    with checkpoint.Checkpointer(os.path.join(workdir, "tp",
                                              "checkpoints")) as ckpt:
      state, _ = ckpt.restore(template)
    opt_on_mesh = all(
        a.sharding.is_equivalent_to(b.sharding, a.ndim)
        for a, b in zip(jax.tree.leaves(state["opt_state"]),
                        jax.tree.leaves(template["opt_state"])))
    res["restore"][spec] = {"params_equal": bool(same),
                            "on_mesh": bool(on_mesh),
                            "opt_state_on_mesh": bool(opt_on_mesh),
                            "step": int(state["step"])}

  # Distillation: teacher forward + student step, sharded vs one device.
  loss_fn = distill.distillation_loss("forward_kl")
  dist = {}
  for name, spec, mesh in (("one", None, one),
                           ("tp", "data:2,model:4", None)):
    config = _train_config(spec, steps=2)
    config.model.d_model = 16
    config.model.num_heads = 2
    config.model.num_kv_heads = 2
    _, met = train_lib.train(config, os.path.join(workdir, "distill-" + name),
                             loss_fn=loss_fn, aux=m1, mesh=mesh)
    dist[name] = met["train_loss"].tolist()
  res["distill"] = dist
  return res


# -- multi-process -------------------------------------------------------------


def multiproc(process_id, port):
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"localhost:{port}",
                             num_processes=2, process_id=process_id)
  assert jax.process_count() == 2 and jax.device_count() == 8, (
      jax.process_count(), jax.device_count())
  target, draft = gqa_models()
  p, lens = prompts()
  res = {}
  for name, mesh in (("global", sharding.make_mesh("data:2,model:4")),
                     ("local", sharding.make_mesh(
                         "data:1,model:1", devices=jax.local_devices()[:1]))):
    greedy = sj.generate(target, p, lens, jax.random.key(7), max_new_tokens=8,
                         sampling=sj.GREEDY, mesh=mesh)
    sampled = sj.speculative_generate(
        target, draft, p, lens, jax.random.key(7), gamma=2, max_new_tokens=8,
        sampling=sj.SamplingConfig(temperature=1.0), mesh=mesh)
    res[name] = {"greedy": np.asarray(greedy.tokens).tolist(),
                 "sampled": np.asarray(sampled.tokens).tolist()}
  res["process_index"] = jax.process_index()
  jax.distributed.shutdown()
  return res


# -- every draft kind, verifier and draft-length rule on 2x4 (opt-in) ---------

def _cross_tokenizer_drafts():
  """A byte-level draft (a..z, EOS at 26) for the kinds' 64-id target, read
  as text: ids 0..25 the letters (5 is the EOS), 26..63 letter pairs."""
  letters = [bytes([97 + i]) for i in range(26)]
  target_tok = letters + [bytes([97 + i % 26, 97 + (7 * i) % 26])
                          for i in range(26, 64)]
  target_tok[5] = None
  target_tok = _Tok(target_tok, 5)
  draft_tok = _Tok(letters + [None], 26)
  byte = testing.toy_transformer(27, 2, d_model=16, num_layers=1,
                                 num_heads=2, max_positions=128)
  return {
      "TLI": TokenIntersectionDraft.build(byte, draft_tok, target_tok,
                                             min_shared=8),
      "SLEM": StringLevelDraft.build(byte, draft_tok, target_tok,
                                        draft_temperature=1.0),
      "SLRS": StringRejectionDraft.build(byte, draft_tok, target_tok)}


class _Tok(list):
  """Each id's bytes, with the EOS id the mappings pair."""

  def __init__(self, pieces, eos):
    super().__init__(pieces)
    self.eos_id, self.eos_ids, self.bos_id = eos, (eos,), None


def kinds(spec="data:2,model:4"):
  """{case: True if the mesh `spec` gave the unmeshed tokens (and greedy,
  `generate`'s)} for every draft kind x verifier / draft-length rule, at
  T = 0 and 1."""
  # Peaked laws, so that drafts are rejected and the residual is drawn.
  target = testing.toy_transformer(64, 0, flavour="llama", d_model=32,
                                   num_layers=3, num_heads=4, num_kv_heads=2,
                                   max_positions=48)
  small = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=64, d_model=16, num_layers=1, num_heads=2, max_positions=48),
                                  1)
  corpus = np.random.default_rng(0).integers(0, 64, 800)
  drafts = {
      "self:1 shared": sj.SelfDraft(target, layers=1, share_cache=True),
      "self skip 1": sj.SelfDraft.skipping(target, skip=[1]),
      "self:1 adapter": sj.SelfDraft(
          target, layers=1, share_cache=True,
          adapter=sj.ExitAdapter.create(target, 1)),
      "eagle": sj.EagleDraft.create(target, 3),
      "transformer": small,
      "bigram": sj.NGramLM.fit(corpus, 64, order=2),
      "prompt lookup": sj.PromptLookupDraft(64, max_ngram=2),
      **_cross_tokenizer_drafts(),
  }
  rules = {"token": ("token", 3),
           "confidence": ("token", sj.Confidence(threshold=0.5, gamma_max=4)),
           "goodput": ("token", sj.Goodput(c=0.3, r=(1.1, 1.2, 1.3, 1.4),
                                           gamma_max=4)),
           "block": ("block", 3), "tree:2,1": ("tree:2,1", None),
           "tree-wor:2,2": ("tree-wor:2,2", None)}
  p = np.random.default_rng(1).integers(0, 64, (8, 6)).astype(np.int32)
  lens = np.array([6, 3, 5, 1, 6, 2, 4, 6], np.int32)
  mesh = _mesh(spec)
  res = {}
  for (name, draft), (rule, (verifier, gamma)), t in itertools.product(
      drafts.items(), rules.items(), (0.0, 1.0)):
    if name in ("prompt lookup", "SLEM", "SLRS") and verifier.startswith(
        "tree"):
      continue  # no tree_decode: refused with a clear error
    kw = dict(gamma=gamma, verifier=verifier, max_new_tokens=10, eos_id=5,
              sampling=sj.SamplingConfig(t))
    one = sj.speculative_generate(target, draft, p, lens, jax.random.key(3),
                                  **kw)
    two = sj.speculative_generate(target, draft, p, lens, jax.random.key(3),
                                  mesh=mesh, **kw)
    same = (np.array_equal(one.tokens, two.tokens)
            and np.array_equal(one.lengths, two.lengths))
    if t == 0.0:
      ar = sj.generate(target, p, lens, jax.random.key(0), max_new_tokens=10,
                       eos_id=5, sampling=sj.SamplingConfig(0.0))
      same = same and np.array_equal(one.tokens, ar.tokens)
    res[f"{name} | {rule} | T={t:g}"] = bool(same)
  return res


def _timed(fn, *args):
  start = time.process_time()
  out = fn(*args)
  return {**out, "cpu_s": round(time.process_time() - start, 1)}


def main(argv):
  section = argv[1]
  if section == "all":
    result = {"decode": _timed(decode), "train": _timed(train, argv[2])}
  elif section == "decode":
    result = decode()
  elif section == "train":
    result = train(argv[2])
  elif section == "kinds":
    result = kinds(*argv[2:])
  elif section == "multiproc":
    result = multiproc(int(argv[2]), int(argv[3]))
  else:
    raise SystemExit(f"unknown section {section!r}")
  print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  main(sys.argv)
