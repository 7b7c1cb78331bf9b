"""Every `tepo train` command of docs/guides/gpu-quickstart.md validates (`--dry-run`): the page a
GPU user copies from cannot drift from the configuration. The device is left to `auto` here (a
CPU), which changes nothing that validation checks; the commands need vLLM installed (skipped,
saying so, without it). tests/test_docs_commands.py dry-runs every other page's commands too."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from markers import needs_vllm

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guides" / "gpu-quickstart.md"


def train_commands() -> list[list[str]]:
    """The page's `tepo train ...` commands, continuation lines joined, comments dropped."""
    commands, current = [], ""
    for line in PAGE.read_text().splitlines():
        text = line.split("  #", 1)[0].rstrip()
        if current:
            current += " " + text.strip().removesuffix("\\")
        elif text.startswith("tepo train"):
            current = text.removesuffix("\\")
        if current and not text.endswith("\\"):
            commands.append(shlex.split(current)[2:])
            current = ""
    return commands


def test_the_page_has_its_commands():
    commands = train_commands()
    assert len(commands) == 4
    assert all("model.path=Qwen/Qwen2.5-1.5B-Instruct" in command for command in commands)
    assert "trainer.nproc=8" in commands[1] and "-m" in commands[2]
    # the SLURM form of the sweep names what only the user knows (issue #54)
    slurm = commands[3]
    assert "hydra/launcher=slurm" in slurm and "hydra.launcher.gpus_per_node=1" in slurm
    assert "hydra.launcher.partition=gpu" in slurm
    assert any(a.startswith("hydra.launcher.setup=") for a in slurm)


@pytest.mark.slow
@needs_vllm  # the commands generate with rollout=vllm, which validation checks is installed
@pytest.mark.parametrize("index", range(4))
def test_each_command_validates(tmp_path, index):
    arguments = train_commands()[index]
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *arguments, "--dry-run"],
        cwd=tmp_path,
        env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = result.stdout.count("the configuration is valid")
    assert runs == (12 if "-m" in arguments else 1)
