"""Experiment commands refuse bad flags before loading or training a model."""

import os
import subprocess
import sys

from conftest import REPO

# (command, what stderr must say). Each runs against an empty zoo cache:
# a check that came after loading the target would start training it.
BAD = [
    (["experiments.adaptive_gamma", "--target=quick", "--drafts=nosuchdraft",
      "--batches=1", "--gammas=1"], "neither self:K nor a zoo name"),
    (["experiments.adaptive_gamma", "--target=quick", "--drafts=self:9",
      "--batches=1", "--gammas=1"], "1 <= K <= 4"),
    # A verifier's own arguments take commas, so the list is ';'-separated.
    (["experiments.verifiers", "--models=lab", "--verifiers=token;typical:0.09",
      "--gammas=1", "--rows=4"], "needs 2 comma-separated number"),
]


def test_bad_flags_fail_before_any_model_is_loaded(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
             SPECJAX_CACHE=str(tmp_path / "empty-zoo"))
  procs = [subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for args, _ in BAD]
  for proc, (args, message) in zip(procs, BAD):
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and message in err, (args, err[-2000:])
  assert not (tmp_path / "empty-zoo").exists()  # nothing was trained
