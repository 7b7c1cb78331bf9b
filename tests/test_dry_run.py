"""`--dry-run` validates, applies the shorthands and prints the config the run would use; nothing
is loaded or written (tepo_cli/core/dry_run.py)."""

from __future__ import annotations

import os
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
