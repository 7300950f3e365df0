"""Experiment commands refuse bad flags before loading or training a model."""

import fnmatch
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib

import jax
import pytest

from conftest import REPO
from specjax import distributed
from specjax.lab import audit
from specjax.models import hf

DATA = REPO / "tests" / "data" / "hf"

# (command, what stderr must say). Each runs against an empty zoo cache:
# a check that came after loading the target would start training it.
# "{file}" is an existing file; "{out}" a results_dir under tmp_path, so that
# a command whose check is missing never writes into the checkout; "{hf}" a
# checkpoint directory without tokenizer.json; "{data}" tests/data/hf.
BAD = [
    (["experiments.adaptive_gamma", "--config.target=quick",
      "--config.drafts=nosuchdraft", "--config.batches=1",
      "--config.gammas=1"], "unknown draft 'nosuchdraft'"),
    (["experiments.adaptive_gamma", "--config.target=quick",
      "--config.drafts=self:9", "--config.batches=1", "--config.gammas=1"],
     r"N must be in [0, 4]"),
    # A verifier's own arguments take commas, so the list is ';'-separated.
    (["experiments.verifiers", "--config.models=lab",
      "--config.verifiers=token;typical:0.09", "--config.gammas=1",
      "--config.rows=4"], "needs 2 comma-separated number"),
    # An empty list passed all() and trained every model (adaptive_gamma's
    # gammas are refused by the same check as its batches).
    (["experiments.eagle", "--config.gammas=", "--results_dir={out}"],
     "config.gammas must be one or more ints >= 1"),
    (["experiments.eagle", "--results_dir={file}"],
     "--results_dir must be a directory"),
    # These four started training the quick target first (audit).
    (["experiments.eagle", "--config.prompt_len=1000", "--results_dir={out}"],
     "must be <= 1024, the quick models' max_positions"),
    (["experiments.eagle", "--config.temperatures=inf",
      "--results_dir={out}"],
     "config.temperatures must be one or more numbers >= 0"),
    (["experiments.eagle", "--config.head_workdir={out}/none",
      "--results_dir={out}"], "config.head_workdir must be an existing"),
    (["experiments.eagle", "--config.head_step=3", "--results_dir={out}"],
     "config.head_step picks a checkpoint of config.head_workdir"),
    (["experiments.eagle", "--config.num_prompts=0", "--results_dir={out}"],
     "config.num_prompts must be >= 1"),
    # A study's results_dir comes from its config unless --results_dir.
    (["experiments.eagle", "--config.results_dir={file}"],
     "config.results_dir='{file}' must be a directory"),
    # A config of another entry point, or a preset that does not exist.
    (["experiments.eagle", "--config=configs/eagle.py:nosuch"],
     "configs/eagle.py argument 'nosuch': expected one of quick"),
    (["experiments.adaptive_gamma", "--results_dir={file}"],
     "--results_dir must be a directory"),
    (["experiments.adaptive_gamma", "--config.threshold=-1",
      "--results_dir={out}"], "config.threshold must be in [0, 1]"),
    (["experiments.adaptive_gamma", "--config.drafts=",
      "--results_dir={out}"], "config.drafts must name at least one"),
    (["experiments.adaptive_gamma", "--config.batches=",
      "--results_dir={out}"], "config.batches must be one or more ints"),
    (["experiments.adaptive_gamma", "--config.widths=0",
      "--results_dir={out}"], "config.widths must be ints >= 1"),
    (["experiments.adaptive_gamma", "--config.prior=3",
      "--results_dir={out}"], "config.prior must be 'a:b'"),
    (["experiments.adaptive_gamma", "--config=configs/adaptive_gamma.py:sweep",
      "--results_dir={out}"], "not a config of this experiment"),
    # Empty lists wrote an empty verifiers_lab.csv over the last results.
    (["experiments.verifiers", "--config.gammas=", "--results_dir={out}"],
     "config.gammas must be one or more ints >= 1"),
    (["experiments.verifiers", "--config.verifiers=", "--results_dir={out}"],
     "config.verifiers must name at least one"),
    (["experiments.verifiers", "--config.gammas=a", "--results_dir={out}"],
     "config.gammas must be one or more ints >= 1"),
    (["experiments.verifiers", "--config.rows=0", "--results_dir={out}"],
     "config.rows must be >= 1"),
    (["experiments.verifiers", "--results_dir={file}"],
     "--results_dir must be a directory"),
    # Checked only after the quick models loaded; an empty one when plotting.
    (["experiments.verifiers", "--config.models=quick",
      "--config.trees=block@x", "--results_dir={out}"],
     "config.trees entry 'block@x'"),
    (["experiments.verifiers", "--config=configs/verifiers.py:trees",
      "--config.trees=", "--results_dir={out}"],
     "config.trees must name at least one"),
    (["experiments.verifiers", "--config=configs/verifiers.py:sweep",
      "--results_dir={out}"], "not a config of this experiment"),
    # The lab's own checks named num_tokens and target_trans_VxV; 1e9
    # trace_tokens ran the trace inside the check.
    (["experiments.lab_audit", "--trace_tokens=0"], "--trace_tokens must be"),
    (["experiments.lab_audit", "--trace_tokens=1000000000"],
     "--trace_tokens must be <="),
    (["experiments.lab_audit", "--certainty=1e308"],
     "--certainty must be in [0, 1e+06]"),
    (["experiments.generate", "--target=nosuchdir", "--prompt=hi"],
     "--target takes a checkpoint directory"),
    # A bad --draft was found only after the target loaded, named as a path.
    (["experiments.generate", "--target={data}/qwen2", "--prompt=hi",
      "--draft=foo"], "--draft: unknown draft 'foo'"),
    (["experiments.generate", "--target={data}/qwen2", "--prompt=hi",
      "--max_new_tokens=0"], "flag --max_new_tokens=0"),
    # These came as tracebacks (audit); --seed only after loading.
    (["experiments.generate", "--target={data}/qwen2", "--prompt=hi",
      "--seed=-1"], "flag --seed=-1"),
    (["experiments.generate", "--target={data}/qwen2", "--prompt=hi",
      "--dtype=nosuch"], "--dtype 'nosuch' is not a dtype"),
    # These came as tracebacks from loading or decoding (a newcomer's
    # first runs): each is now one line naming the flag.
    (["experiments.generate", "--target={data}/qwen2", "--prompt=hi",
      "--max_new_tokens=1000"],
     "--max_new_tokens: max_new_tokens=1000 does not fit the target's "
     "context of 96 positions"),
    (["experiments.generate", "--target={data}/qwen2", "--prompt=hi",
      "--draft=self:9"], "--draft: draft 'self:9': N must be in [0, 2]"),
    (["experiments.generate", "--target={hf}", "--prompt=hi"],
     "has no tokenizer.json"),
    # Offline (HF_HUB_OFFLINE=1, an empty hub cache): how to get it anyway.
    (["experiments.generate", "--target=hf:specjax-tests/none",
      "--prompt=hi"],
     "--target: Could not fetch 'specjax-tests/none'"
     if importlib.util.find_spec("huggingface_hub") else
     "--target: hf:specjax-tests/none needs huggingface_hub (pip install"),
    (["experiments.adaptive_gamma", "--config.target=nosuch"],
     "config.target must be 'quick'"),
    (["experiments.reproduce", "--config=configs/nosuch.py:tiny",
      "--results_dir={out}"], "No such file 'configs/nosuch.py'"),
    (["experiments.reproduce", "--config=configs/reproduce.py:tiny",
      "--results_dir={file}"], "--results_dir must be a directory"),
    # An unknown preset came as a traceback (config_flags prints the
    # get_config call's).
    (["experiments.reproduce", "--config=configs/reproduce.py:verifiers",
      "--results_dir={out}"],
     "configs/reproduce.py argument 'verifiers': expected one of quick"),
    (["experiments.sweep", "--config=configs/verifiers.py:lab",
      "--results_dir={out}"], "config lacks the field(s)"),
    # A bad --config.<field> came as a traceback (its message was clear).
    (["experiments.sweep", "--config=configs/reproduce.py:tiny",
      "--config.num_prompts=-1", "--results_dir={out}"],
     "config.num_prompts must be >= 1"),
    (["experiments.train", "--config=configs/train.py:tiny",
      "--workdir={out}/w", "--config.seq_len=1000"],
     "longer than the model's max_positions"),
    (["experiments.train", "--config=configs/train.py:tiny",
      "--workdir={out}/w", "--mesh=data:3"], "--mesh=data:3: mesh spec"),
    (["experiments.train", "--config=configs/train.py:nosuch",
      "--workdir={out}/w"], "Unknown model size 'nosuch'"),
    (["experiments.figures", "--results_dir={out}/none"],
     "there is no directory"),
    # Ignored, or (a bad draft) a KeyError after the quick target loaded.
    (["experiments.verifiers", "--config.models=lab",
      "--config.paired_gammas=2", "--results_dir={out}"],
     "does not read --config.paired_gammas"),
    (["experiments.verifiers", "--config.models=quick",
      "--config.quick_drafts=nosuch", "--results_dir={out}"],
     "config.quick_drafts 'nosuch': unknown draft"),
    (["experiments.verifiers", "extra", "--results_dir={out}"],
     "Unexpected arguments"),
]


def _env(tmp_path):
  """The commands' environment: the checkout importable, an empty zoo
  cache (a check that came after loading a model would start training),
  and the Hugging Face Hub offline with an empty cache."""
  return dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
              SPECJAX_CACHE=str(tmp_path / "empty-zoo"), HF_HUB_OFFLINE="1",
              HF_HUB_CACHE=str(tmp_path / "empty-hub"))


def _no_tokenizer(tmp_path):
  """A checkpoint directory without tokenizer.json."""
  path = tmp_path / "no-tokenizer"
  shutil.copytree(DATA / "qwen2", path)
  (path / "tokenizer.json").unlink()
  return path


def _one_line(err: str, message: str) -> bool:
  """`message` is on one line of `err`, after which come at most absl's
  hint: no traceback or second message follows it, and no usage text (the
  module docstring and every flag) comes before it."""
  lines = err.strip().splitlines()
  at = [i for i, line in enumerate(lines) if message in line]
  return (bool(at) and all(line.startswith("Pass --helpshort")
                           for line in lines[at[-1] + 1:])
          and not any(line.startswith("  --") for line in lines))


@pytest.mark.full
def test_bad_flags_fail_before_any_model_is_loaded(tmp_path):
  env = _env(tmp_path)
  afile = tmp_path / "afile"
  afile.write_text("not a directory")
  out = tmp_path / "out"
  names = dict(file=afile, out=out, hf=_no_tokenizer(tmp_path), data=DATA)
  # One process per module, all at once (tests/flag_worker.py).
  by_module = {}
  for module, *args in (args for args, _ in BAD):
    by_module.setdefault(module, []).append(
        [a.format(**names) for a in args])
  procs = {module: subprocess.Popen(
      [sys.executable, str(REPO / "tests" / "flag_worker.py"), module],
      cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for module in by_module}
  results = {}
  try:
    for module, proc in procs.items():
      stdout, err = proc.communicate(json.dumps(by_module[module]),
                                     timeout=300)
      lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
      assert proc.returncode == 0 and lines, (module, err[-2000:])
      results[module] = iter(json.loads(lines[-1][len("RESULT "):]))
  finally:
    for proc in procs.values():  # a check that did not fire leaves a run going
      proc.kill()
      proc.wait()
  for args, message in BAD:
    code, err = next(results[args[0]])
    message = message.format(**names)
    assert code != 0 and message in err, (args, err[-2000:])
    # A usage message on one line, not a traceback.
    assert "Traceback" not in err and _one_line(err, message), (
        args, err[-2000:])
  assert not (tmp_path / "empty-zoo").exists()  # nothing was trained
  assert not out.exists() and afile.read_text() == "not a directory"


@pytest.mark.full
def test_entry_points_run_from_any_directory(tmp_path):
  """`python -m experiments.<name>` from another working directory: its
  default config is the package's (a bad override of one of its fields is
  refused by that field's check, not 'No such file'), a relative --config
  says where the configs are, and JAX's probe of absent backends ("Unable
  to initialize backend 'tpu'") no longer prints."""
  env = _env(tmp_path)
  del env["JAX_PLATFORMS"]  # JAX probes every backend: the INFO line
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  out = tmp_path / "out"
  commands = [
      (["experiments.sweep", "--config.num_prompts=0",
        f"--results_dir={out}"], "config.num_prompts must be >= 1"),
      (["experiments.eagle", "--config=configs/eagle.py:smoke"],
       f"the configs are {REPO / 'configs'}"),
      # Loads the target (JAX starts its backends), then refuses the draft.
      (["experiments.generate", f"--target={DATA / 'qwen2'}", "--prompt=hi",
        "--draft=self:9"], "--draft: draft 'self:9'"),
  ]
  procs = [subprocess.Popen([sys.executable, "-m", *args], cwd=elsewhere,
                            env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for args, _ in commands]
  for proc, (args, message) in zip(procs, commands):
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and message in err, (args, err[-2000:])
    assert "Traceback" not in err and _one_line(err, message), (
        args, err[-2000:])
    assert "Unable to initialize backend" not in err, (args, err[-2000:])
  help_ = subprocess.run(
      [sys.executable, "-m", "experiments.verifiers", "--help"],
      cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
  # (absl's --help exits 1.)
  assert ("--config" in help_.stdout
          and "configs/verifiers.py" in help_.stdout), (
              help_.stdout[-2000:], help_.stderr[-2000:])
  assert not out.exists() and not (tmp_path / "empty-zoo").exists()


@pytest.mark.full
def test_every_study_preset_passes_its_experiments_checks(tmp_path):
  """Each preset of a study's config is one its experiment runs: its
  check_config (every field, each draft and verifier spec) passes. One
  process per experiment: each defines its flags at import."""
  code = ("import importlib, sys\n"
          "name = sys.argv[1]\n"
          "experiment = importlib.import_module('experiments.' + name)\n"
          "config = importlib.import_module('configs.' + name)\n"
          "presets = getattr(config, 'STUDY_PRESETS', None) or config.PRESETS\n"
          "for preset in presets:\n"
          "  experiment.check_config(config.get_config(preset))\n"
          "print('checked', *presets)\n")
  procs = {name: subprocess.Popen(
      [sys.executable, "-c", code, name], cwd=REPO, env=_env(tmp_path),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name in ("verifiers", "adaptive_gamma", "eagle")}
  for name, proc in procs.items():
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "checked" in stdout, (name, err[-2000:])


def test_the_entry_points_and_their_configs_are_packaged():
  """`pip install .` installs experiments/ and configs/ beside specjax, so
  `python -m experiments.<name>` runs outside the checkout."""
  with open(REPO / "pyproject.toml", "rb") as fh:
    include = tomllib.load(fh)["tool"]["setuptools"]["packages"]["find"][
        "include"]
  for package in ("specjax", "experiments", "configs"):
    assert (REPO / package / "__init__.py").is_file(), package
    assert any(fnmatch.fnmatch(package, p) for p in include), (package,
                                                               include)


def test_the_offline_message_names_an_installed_command():
  """hf:<id> offline says how to download it elsewhere: with a command the
  installed huggingface_hub has (`hf`; not `huggingface-cli`, gone from
  1.0)."""
  pytest.importorskip("huggingface_hub")
  command = hf._download_command("o/r")  # pylint: disable=protected-access
  assert command.endswith("download o/r --local-dir DIR"), command
  scripts = {ep.name for ep in importlib.metadata.distribution(
      "huggingface_hub").entry_points if ep.group == "console_scripts"}
  assert command.split()[0] in scripts, (command, scripts)


@pytest.mark.parametrize("kwargs,match", [
    (dict(grid_seeds=0), "grid_seeds must be >= 1"),
    (dict(min_grid_settings="x"), "min_grid_settings must be a Python int"),
    (dict(certainty=1e308), r"certainty must be in \[0, 1e\+06\]"),
    (dict(trace_tokens=0), "trace_tokens must be >= 1"),
])
def test_run_audit_names_a_bad_argument(kwargs, match):
  # grid_seeds=0 gave a failing audit and "x" a TypeError on >=.
  with pytest.raises((TypeError, ValueError), match=match):
    audit.run_audit(**kwargs)


def test_check_arguments_bounds_the_audit_it_guards():
  # Any grid_seeds >= 1 passed, then ran 648 settings per seed.
  with pytest.raises(ValueError, match="grid_seeds must be <="):
    audit.check_arguments(grid_seeds=audit.MAX_GRID_SEEDS + 1)
  audit.check_arguments(grid_seeds=audit.MAX_GRID_SEEDS)


def test_compilation_cache_flag_picks_a_directory(tmp_path, monkeypatch):
  settings = {}
  # Recorded, not applied: this process keeps the suite's shared cache.
  monkeypatch.setattr(jax.config, "update",
                      lambda name, value: settings.__setitem__(name, value))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "zoo"))
  assert distributed.use_compilation_cache() == str(tmp_path / "zoo" / "xla")
  assert settings == {"jax_compilation_cache_dir": str(tmp_path / "zoo" / "xla"),
                      "jax_persistent_cache_min_compile_time_secs": 0}
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
  assert distributed.use_compilation_cache("auto") == str(tmp_path / "jax")
  assert distributed.use_compilation_cache(str(tmp_path / "mine")) == str(
      tmp_path / "mine")
  settings.clear()
  assert distributed.use_compilation_cache("none") is None
  assert distributed.use_compilation_cache(None) is None
  assert not settings  # off: JAX's own setting stands
  # Several CPU devices: off (sharded programs loaded from it deadlocked).
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  assert distributed.several_cpu_devices()
  assert distributed.use_compilation_cache(str(tmp_path / "mine")) is None
  assert not settings
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
  assert not distributed.several_cpu_devices()
  afile = tmp_path / "afile"
  afile.write_text("")
  for bad in (str(afile), "", 3):
    with pytest.raises((TypeError, ValueError), match="--compilation_cache"):
      distributed.use_compilation_cache(bad)


def test_the_suites_compilation_cache_is_pruned_oldest_first(tmp_path):
  import xla_cache  # tests/, beside conftest.py
  assert xla_cache.prune(str(tmp_path / "missing")) == 0
  for i in range(6):
    path = tmp_path / f"entry{i}"
    path.write_bytes(b"x" * 100)
    os.utime(path, (1000 + i, 1000 + i))
  assert xla_cache.prune(str(tmp_path), max_bytes=600) == 0
  # Over 500 bytes: the oldest go until at most 250 are left.
  assert xla_cache.prune(str(tmp_path), max_bytes=500) == 4
  assert sorted(p.name for p in tmp_path.iterdir()) == ["entry4", "entry5"]
