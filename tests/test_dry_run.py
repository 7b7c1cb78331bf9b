"""`--dry-run` validates, applies the shorthands and prints the config the run would use; nothing
is loaded or written (tepo_cli/core/dry_run.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml


def tepo(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args],
        cwd=tmp_path,
        env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_the_shorthand_is_applied_and_nothing_is_written(tmp_path):
    result = tepo(tmp_path, "train", "model=tiny", "algo=mpo", "k=4", "--dry-run")
    assert result.returncode == 0, result.stderr
    header, _, body = result.stdout.partition("\n")
    assert header == "# tepo train --dry-run: the configuration is valid; the run would use:"
    config = yaml.safe_load(body)
    assert (config["algo"]["unit"], config["algo"]["k"]) == ("block", 4)  # --cfg job shows 5
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "eval"])
def test_an_invalid_value_exits_2(tmp_path, command):
    key = "trainer.lr=abc" if command == "train" else "eval.limit=abc"
    result = tepo(tmp_path, command, "model=tiny", key, "--dry-run")
    assert result.returncode == 2
    assert "is not allowed" in result.stderr and result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_eval_prints_its_config(tmp_path):
    result = tepo(tmp_path, "eval", "model=tiny", "eval.limit=3", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout.partition("\n")[2])["eval"]["limit"] == 3
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_default_model_is_not_printed_with_the_tiny_model_s_shape(tmp_path):
    """`model=tiny`'s width and depth are read by nothing else: the default's printout showed
    SmolLM2-135M with `hidden_size: 64` (issue #54)."""
    default = tepo(tmp_path, "train", "--dry-run")
    assert default.returncode == 0, default.stderr
    model = yaml.safe_load(default.stdout.partition("\n")[2])["model"]
    assert model["name"] == "smollm2_135m" and "hidden_size" not in model
    assert "num_hidden_layers" not in model and "init_seed" not in model
    tiny = tepo(tmp_path, "train", "model=tiny", "model.hidden_size=32", "--dry-run")
    assert tiny.returncode == 0, tiny.stderr
    model = yaml.safe_load(tiny.stdout.partition("\n")[2])["model"]
    assert (model["hidden_size"], model["num_hidden_layers"]) == (32, 2)


@pytest.mark.slow
def test_a_dry_run_sweep_writes_nothing_and_submits_nothing(tmp_path):
    """`-m --dry-run` validated each job but left multirun/<date>/<time>/multirun.yaml behind;
    with a SLURM launcher it would have submitted (off a cluster: submitit's traceback)."""
    result = tepo(
        tmp_path,
        "train",
        "-m",
        "model=tiny",
        "hydra/launcher=slurm",
        "hydra.launcher.gpus_per_node=2",
        "trainer.nproc=2",
        "seed=0,1",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("the configuration is valid") == 2
    assert "hydra/launcher=slurm is not used (nothing is submitted or started)" in result.stderr
    assert list(tmp_path.iterdir()) == []
    typo = tepo(
        tmp_path,
        "train",
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.partiton=gpu",
        "seed=0,1",
        "--dry-run",
    )
    assert typo.returncode == 2 and typo.stdout == ""
    assert "Key 'partiton' not in 'SlurmQueueConf'" in typo.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("srun") is not None, reason="SLURM is installed here")
def test_a_slurm_sweep_off_a_cluster_is_one_paragraph(tmp_path):
    result = tepo(tmp_path, "train", "-m", "model=tiny", "hydra/launcher=slurm", "seed=0,1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "SLURM's `srun` is not on this machine's PATH" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
