"""The README's "write your own objective" example runs exactly as written (on the tiny model)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- (file: (?P<file>\S+)|command) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)

pytestmark = pytest.mark.slow


def test_write_your_own_objective_example(tmp_path):
    blocks = list(BLOCK.finditer(README.read_text()))
    files = {m["file"]: m["body"] for m in blocks if m["file"]}
    (command,) = [m["body"].strip() for m in blocks if not m["file"]]
    assert set(files) == {"my_objective.py", "my_conf/algo/reinforce.yaml"}
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    args = shlex.split(command)
    assert args[:2] == ["tepo", "train"]
    quick = [
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args[1:], *quick],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (config,) = tmp_path.glob("outputs/train/*/*/config.yaml")
    assert "name: reinforce" in config.read_text() and "beta: 0.0" in config.read_text()
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    record = json.loads(metrics.read_text().splitlines()[0])
    assert "pg_loss" in record and "clip_frac" not in record  # the plugin's own metrics


def test_unknown_objective_lists_the_registered_ones(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", "model=tiny", "algo.name=reinforc"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "algo.name='reinforc' is not a registered objective" in result.stderr
    assert "dapo, grpo, gspo, mpo, tepo" in result.stderr and "Traceback" not in result.stderr
