"""Meshes and sharding rules; sharded decoding, training and checkpoints.

Rule logic is tested in-process on an `AbstractMesh` (no devices needed).
Everything that needs several devices runs in a fresh subprocess
(`tests/mesh_worker.py`) with `--xla_force_host_platform_device_count=8`,
so the rest of the suite keeps one device; the multi-process test starts two
processes of 4 CPU devices each that meet through `jax.distributed`.
"""

import json
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import specjax as sj
from specjax import sharding
from conftest import REPO
from conftest import host_devices_env

WORKER = REPO / "tests" / "mesh_worker.py"


def _run_worker(*args, devices=8, timeout=1800):
  proc = subprocess.run([sys.executable, str(WORKER), *map(str, args)],
                        env=host_devices_env(devices), capture_output=True,
                        text=True, timeout=timeout, cwd=REPO)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-4000:]
  return json.loads(lines[-1][len("RESULT "):])


# -- rules (in-process) --------------------------------------------------------

MESH_2X4 = AbstractMesh((2, 4), ("data", "model"))



def test_shard_model_names_what_is_not_a_model():
  with pytest.raises(TypeError, match="holding str"):
    sharding.shard_model("x", "data:1")


def test_collectives_price_every_element_type():
  """fp8 and complex shapes went unparsed (0 bytes), and s4 was priced at
  4 bytes an element."""
  hlo = ("%a = (f8e4m3fn[4096], c64[10]) all-gather-start(%x)\n"
         "%b = s4[4096]{0} all-reduce(%y)\n"
         "%c = (bf16[2,2], pred[3]) all-to-all(%z)\n")
  got = [(x["op"], x["bytes"]) for x in sharding.collectives(hlo)]
  assert got == [("all-gather", 4096), ("all-reduce", 2048),
                 ("all-to-all", 11)]

def test_parse_mesh_spec_and_errors():
  assert sharding.parse_mesh_spec("data:2,model:4") == (("data", "model"),
                                                        (2, 4))
  assert sharding.parse_mesh_spec(" data : -1 ") == (("data",), (-1,))
  for bad in ("", "data", "data:0", "data:2,data:2", "data:-1,model:-1",
              "data=2", 3):
    with pytest.raises(ValueError, match="mesh spec"):
      sharding.parse_mesh_spec(bad)


def test_make_mesh_on_one_device_and_size_errors():
  mesh = sharding.make_mesh("data:1,model:1")
  assert dict(mesh.shape) == {"data": 1, "model": 1}
  mesh = sharding.make_mesh()  # every device on data, model of size 1
  assert mesh.shape["model"] == 1
  with pytest.raises(ValueError, match="needs 8 devices"):
    sharding.make_mesh("data:2,model:4")
  with pytest.raises(TypeError, match="mesh must be"):
    sharding.as_mesh(42)
  # int(2.7) made a data:2 mesh, int(True) data:1.
  for size in (2.7, True, "x"):
    with pytest.raises(TypeError, match="mesh spec axis 'data'"):
      sharding.make_mesh({"data": size})


def test_make_mesh_refuses_devices_that_are_not_distinct_jax_devices():
  # 'cpu' made a mesh of 'c', 'p', 'u'; a repeated device failed later with a
  # bare AssertionError inside jax.device_put.
  cases = (("cpu", TypeError, "devices must be a list of jax.Device.*"
            r"jax.devices\('cpu'\)"),
           (jax.devices() * 2, ValueError, r"devices\[1\] is .* already "
            r"devices\[0\]"),
           ([None], TypeError, r"devices\[0\] must be a jax.Device"),
           ([], ValueError, "devices is empty"),
           (set(jax.devices()), TypeError, "devices must be a list"))
  for devices, error, match in cases:
    with pytest.raises(error, match=match):
      sharding.make_mesh("data:-1", devices=devices)
  # A tuple, or a mesh's device array (row-major), is a list of devices.
  for devices in (tuple(jax.devices()), np.array(jax.devices())):
    mesh = sharding.make_mesh("data:-1", devices=devices)
    assert list(mesh.devices.flat) == jax.devices()


def test_make_mesh_refuses_axis_names_no_rule_uses():
  # With 4 devices "foo:2" made foo:2,data:1,model:1: 2 devices, nothing
  # sharded. The name is checked before the device count.
  for spec, name in (("foo:2", "foo"), ("data:1,modle:1", "modle"),
                     ({"dta": 1}, "dta")):
    with pytest.raises(ValueError, match=f"mesh spec .* unknown mesh axis "
                       f"'{name}'; use 'data' and/or 'model'"):
      sharding.make_mesh(spec)
  with pytest.raises(ValueError, match="unknown mesh axis 'foo'"):
    sharding.as_mesh("foo:1")
  # Every spec form the repository uses still builds.
  for spec in ("data:-1,model:1", "model:1", {"data": 1, "model": 1}, None):
    assert dict(sharding.make_mesh(spec).shape) == {"data": 1, "model": 1}


def test_a_mesh_built_by_hand_is_checked_like_a_spec(monkeypatch):
  """A Mesh object skipped make_mesh's checks: a repeated device failed in
  jax.device_put ("safe_zip() argument 1 has length 8 but argument 0 has
  length 7"), and axes no rule maps to ("x", "y") silently sharded
  nothing."""
  device = jax.devices()[0]
  twice = jax.sharding.Mesh(np.array([device, device]), ("data",))
  with pytest.raises(ValueError, match=r"mesh \(\('data', 2\),\): "
                     r"devices\[1\] is .* already devices\[0\]"):
    sharding.as_mesh(twice)
  with pytest.raises(ValueError, match="no sharding rule maps to axis"
                     r"\(es\) 'x' \(size 2\), 'y' \(size 4\)"):
    sharding.check_mesh_axes(AbstractMesh((2, 4), ("x", "y")))
  for fine in (MESH_2X4, AbstractMesh((1, 8), ("x", "model")), None):
    sharding.check_mesh_axes(fine)  # an unused axis of size 1 is harmless
  # The decode entry points check a given mesh's axes (the repeated device
  # let through, to build a 2-device mesh here).
  monkeypatch.setattr(sharding, "check_devices", lambda devices: devices)
  model = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=16, d_model=16, num_layers=1, num_heads=2,
      max_positions=32), 0)
  prompts, lengths = np.ones((1, 4), np.int32), np.array([4])
  foreign = jax.sharding.Mesh(np.array([device, device]), ("x",))
  for call in (lambda: sj.generate(model, prompts, lengths, jax.random.key(0),
                                   max_new_tokens=2, mesh=foreign),
               lambda: sj.speculative_generate(
                   model, model, prompts, lengths, jax.random.key(0),
                   gamma=2, max_new_tokens=2, mesh=foreign)):
    with pytest.raises(ValueError, match="'x' \\(size 2\\).*Name the axes"):
      call()


def test_rules_shard_heads_mlp_vocab_and_replicate_what_does_not_divide():
  spec = lambda shape, names, **kw: sharding.spec_for(shape, names, MESH_2X4,
                                                      **kw)
  assert spec((64, 256), ("embed", "vocab")) == P(None, "model")
  assert spec((8, 2, 32, 16), ("batch", "kv_heads", "length",
                               "head_dim")) == P("data")  # 2 kv heads < 4
  assert spec((8, 8, 32, 16), ("batch", "kv_heads", "length",
                               "head_dim")) == P("data", "model")
  assert spec((64, 259), ("embed", "vocab")) == P()  # 259 % 4
  assert spec((3, 10), ("batch", "length")) == P()   # batch 3 over data:2
  # Fused heads * head_dim: split only at head boundaries.
  assert spec((64, 48), ("embed", "heads"), units={"heads": 6}) == P()
  assert spec((64, 64), ("embed", "heads"), units={"heads": 8}) == P(
      None, "model")
  # FSDP also splits the embedding width over data.
  assert spec((64, 256), ("embed", "vocab"),
              rules=sharding.FSDP_RULES) == P("data", "model")
  # A mesh axis is used once per array.
  assert spec((8, 8), ("heads", "mlp")) == P("model")
  with pytest.raises(ValueError, match="logical names"):
    spec((2, 2), ("batch",))


def test_spec_for_refuses_bad_shape_names_mesh_and_rules():
  spec = sharding.spec_for
  # "embd" was replicated without a word; (-4, 8) was sharded; "ab" failed
  # with "not all arguments converted"; None meshes and rules with an
  # AttributeError.
  cases = (((64, 8), ("embd", "vocab"), {}, ValueError,
            r"names\[0\] = 'embd' is not a logical axis name"),
           ((64, 8), ("embed", 3), {}, TypeError, r"names\[1\] must be"),
           ((64, 8), "ev", {}, TypeError, "names must be a tuple"),
           ((-4, 8), ("batch", "vocab"), {}, ValueError,
            r"shape\[0\] must be >= 0"),
           ((4.0, 8), ("batch", "vocab"), {}, TypeError,
            r"shape\[0\] must be a Python int"),
           ("ab", ("batch", "vocab"), {}, TypeError, "shape must be a tuple"),
           ((4, 8), ("batch", "vocab"), {"mesh": None}, TypeError,
            "mesh must be a jax.sharding.Mesh or AbstractMesh"),
           ((4, 8), ("batch", "vocab"), {"mesh": "data:1"}, TypeError,
            r"mesh must be .* make_mesh\('data:1'\)"),
           ((4, 8), ("batch", "vocab"), {"rules": None}, TypeError,
            "rules must be a mapping"),
           ((4, 8), ("batch", "vocab"), {"rules": {"batch": 1}}, TypeError,
            r"rules\['batch'\] = 1"),
           # A mesh-axis typo in a rule replicated silently.
           ((4, 8), ("batch", "vocab"), {"rules": {"vocab": "modle"}},
            ValueError, r"rules\['vocab'\] = 'modle' is not a mesh axis"),
           ((4, 8), ("batch", "heads"), {"units": {"heads": 0}}, ValueError,
            r"units\['heads'\] must be >= 1"),
           ((4, 8), ("batch", "vocab"), {"reasons": ()}, TypeError,
            "reasons must be a list"))
  for shape, names, kw, error, match in cases:
    kw = {"mesh": MESH_2X4, **kw}
    with pytest.raises(error, match=match):
      spec(shape, names, kw.pop("mesh"), **kw)
  with pytest.raises(TypeError, match="mesh must be"):
    sharding.tree_specs({}, {}, None)  # checked even for an empty tree
  # None replicates; a name of custom rules, and a logical name the rules
  # leave out (replicated), are accepted; so are numpy ints and real meshes.
  assert spec((4, 8), (None, "vocab"), MESH_2X4) == P(None, "model")
  assert spec((4, 8), ("batch", "expert"), MESH_2X4,
              rules={"batch": "data", "expert": "model"}) == P("data", "model")
  assert spec((4, 8), ("batch", "vocab"), MESH_2X4,
              rules={"batch": "data"}) == P("data")
  assert spec(np.array([4, 8]), ("batch", "vocab"),
              sharding.make_mesh()) == P()
  # A custom mesh's own axes may be named; a spec string enters `using`.
  custom = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  assert spec((4, 8), ("batch", "vocab"), custom, rules={"vocab": "x"}) == P()
  with sharding.using("data:1") as mesh:
    assert mesh.axis_names == ("data", "model")


def test_replication_is_logged_once(caplog):
  sharding._logged.clear()  # pylint: disable=protected-access
  names = {"a": ("embed", "vocab"), "b": ("embed", "vocab")}
  tree = {"a": np.zeros((4, 259)), "b": np.zeros((4, 259))}
  with caplog.at_level("WARNING"):
    sharding.tree_specs(tree, names, MESH_2X4)
    sharding.tree_specs(tree, names, MESH_2X4)
  lines = [r for r in caplog.records if "replicating" in r.getMessage()]
  assert len(lines) == 1 and "vocab=259 over model:4" in lines[0].getMessage()


def test_per_device_bytes_refuses_what_it_cannot_measure():
  # Each of these returned {} (numpy leaves were left out of the count).
  for tree, error, match in ((None, ValueError, "tree holds no jax.Array"),
                             ({}, ValueError, "tree holds no jax.Array"),
                             ("abc", TypeError, "tree is a str"),
                             ({"a": np.zeros(3)}, TypeError,
                              r"tree\['a'\] is a ndarray, not a jax.Array")):
    with pytest.raises(error, match=match):
      sharding.per_device_bytes(tree)
  with pytest.raises(TypeError, match="tree is a .*Tracer"):
    jax.jit(sharding.per_device_bytes)(jax.numpy.zeros(3))
  tree = {"a": jax.numpy.zeros(3, np.float32), "b": None}
  assert sharding.per_device_bytes(tree) == {jax.devices()[0]: 12}


def test_every_transformer_parameter_has_logical_names():
  for flavour in ("gpt2", "llama"):
    model = sj.TransformerLM.create(sj.TransformerConfig(
        vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
        max_positions=32, flavour=flavour), 0)
    names = jax.tree.leaves(model.logical_axes().state,
                            is_leaf=lambda x: isinstance(x, tuple))
    shapes = jax.tree.leaves(model.state)
    assert len(names) == len(shapes)
    for n, x in zip(names, shapes):
      assert isinstance(n, tuple) and len(n) == x.ndim, (n, x.shape)
      assert set(n) <= set(sharding.LOGICAL_AXES)
    specs = sharding.tree_specs(model, model.logical_axes(), MESH_2X4,
                                units=sharding.model_units(model))
    flat = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
    assert P(None, "model") in flat  # query / mlp / vocab


def test_one_device_mesh_gives_the_unmeshed_tokens():
  model = sj.TransformerLM.create(sj.TransformerConfig(
      vocab_size=32, d_model=16, num_layers=1, num_heads=2, max_positions=32),
      0)
  prompts, lengths = np.array([[1, 2, 3]], np.int32), np.array([3], np.int32)
  a = sj.generate(model, prompts, lengths, jax.random.key(0),
                  max_new_tokens=5, sampling=sj.SamplingConfig(1.0))
  mesh = sharding.make_mesh("data:1,model:1")
  b = sj.generate(model, prompts, lengths, jax.random.key(0),
                  max_new_tokens=5, sampling=sj.SamplingConfig(1.0), mesh=mesh)
  with jax.set_mesh(mesh):  # the enclosing mesh is used when mesh=None
    c = sj.generate(model, prompts, lengths, jax.random.key(0),
                    max_new_tokens=5, sampling=sj.SamplingConfig(1.0))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.tokens, c.tokens)
  with pytest.raises(ValueError, match="needs 4 devices"):
    sj.generate(model, prompts, lengths, jax.random.key(0), max_new_tokens=5,
                mesh="data:2,model:2")


# -- 8 devices (subprocess) ----------------------------------------------------


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
  """Decode and train sections in one 8-device process (one JAX start-up)."""
  return _run_worker("all", tmp_path_factory.mktemp("mesh-train"))


@pytest.fixture(scope="module")
def decode_results(worker_results):
  return worker_results["decode"]


@pytest.mark.full
def test_outputs_identical_on_every_mesh(decode_results):
  """Greedy and T = 1 tokens are the same on 1x1, 8x1 and 2x4, for
  generate and speculative_generate, with a GQA Llama target (1x1 equals the
  unmeshed run: test_one_device_mesh_gives_the_unmeshed_tokens)."""
  tokens = decode_results["tokens"]
  assert len(tokens) == 3
  reference = tokens["data:1,model:1"]
  assert reference["generate_T0"] == reference["speculative_T0"]
  for spec, got in tokens.items():
    for name, value in got.items():
      assert value == reference[name], (spec, name)
  # The sampled runs are not degenerate (otherwise equality proves little).
  assert reference["generate_T1"] != reference["generate_T0"]


@pytest.mark.full
def test_vocab_sharded_sampling_gathers_no_vocabulary_rows(decode_results):
  """With V = 256 on `model:4`, the sampled speculative loop's inverse-CDF
  draws (draft, residual, bonus) all-gather only the [B, C] chunk masses
  (`sampling.cdf_chunks`) and per-row scalars: no all-gather is as large as
  one device's [B/data, V/model] float32 block, and all of them together
  are smaller than one [B/data, V] block (a single CDF gathered that at each
  of the round's draws)."""
  c = decode_results["collectives"]
  row_block = c["batch_per_device"] * c["vocab"] * 4
  gathers = [x for x in c["collectives"] if x["op"] == "all-gather"]
  assert gathers  # the count is real (the program is sharded)
  assert max(x["bytes"] for x in gathers) < row_block / c["model"], gathers
  assert sum(x["bytes"] for x in gathers) < row_block, gathers
  # Everything V-wide stays local: no collective of a [.., V] array at all.
  for x in c["collectives"]:
    for shape in x["shapes"]:
      assert not shape.rstrip("]").endswith(str(c["vocab"])), x


@pytest.mark.full
def test_chi_square_exact_on_2x4_and_control_rejected(decode_results):
  chi = decode_results["chi_square"]
  assert chi["exact_passed"], chi["exact"]
  assert not chi["control_passed"], chi["control"]
  assert chi["one_minus_tv"] < 0.9


@pytest.mark.full
def test_per_device_param_bytes_shrink_by_model_axis(decode_results):
  b = decode_results["param_bytes"]
  for spec, model_size in (("data:2,model:4", 4), ("data:4,model:2", 2),
                           ("data:8,model:1", 1)):
    sharded_part = b["total"] - b[spec]["replicated"]
    expected = sharded_part / model_size + b[spec]["replicated"]
    assert b[spec]["max"] == b[spec]["min"] == expected, (spec, b)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["data:2,model:4", "data:8,model:1",
                                  "data:1,model:8"])
@pytest.mark.full
def test_every_draft_kind_and_rule_decodes_the_same_on_a_mesh(spec):
  """Self-drafts (shared cache, skipped block, exit adapter), an EAGLE head,
  n-gram, prompt lookup and Transformer drafts, and a byte-level draft of
  another tokenizer through TLI, SLEM and SLRS, under token, block and tree
  verifiers and both draft-length rules: each mesh gives the unmeshed
  tokens, and greedy the autoregressive ones. (The default run's mesh checks
  use a Transformer draft; this is every kind, about 220 compiles a mesh.)"""
  results = _run_worker("kinds", spec)
  assert len(results) == 108
  assert all(results.values()), [k for k, v in results.items() if not v]


@pytest.fixture(scope="module")
def train_results(worker_results):
  return worker_results["train"]


@pytest.mark.full
def test_sharded_training_matches_one_device(train_results):
  one = np.array(train_results["loss_one"])
  for name in ("loss_tp", "loss_fsdp"):
    np.testing.assert_allclose(train_results[name], one, rtol=1e-5,
                               err_msg=name)
  assert str(P(None, "model")) in train_results["tp_param_specs"]
  dist = train_results["distill"]
  np.testing.assert_allclose(dist["tp"], dist["one"], rtol=1e-5)


@pytest.mark.full
def test_checkpoint_from_2x4_restores_on_1x1_and_4x2(train_results):
  for spec, r in train_results["restore"].items():
    assert r == {"params_equal": True, "on_mesh": True,
                 "opt_state_on_mesh": True, "step": 5}, spec


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.full
def test_two_processes_match_one_device():
  """2 processes x 4 CPU devices (gloo), one 2x4 mesh across both: greedy and
  sampled generations equal the single-device run. A hang fails on timeout."""
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, str(WORKER), "multiproc", str(i), str(port)],
      env=host_devices_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, cwd=REPO) for i in range(2)]
  outs = []
  try:
    for proc in procs:
      out, err = proc.communicate(timeout=400)
      assert proc.returncode == 0, err[-4000:]
      outs.append(json.loads([l for l in out.splitlines()
                              if l.startswith("RESULT ")][-1][7:]))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  for res in outs:
    assert res["global"] == res["local"]
  assert outs[0]["global"] == outs[1]["global"]
  assert outs[0]["global"]["sampled"] != outs[0]["global"]["greedy"]
