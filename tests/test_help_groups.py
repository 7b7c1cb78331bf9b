"""`tepo eval --help` lists only the groups `tepo eval` accepts (tepo_cli/core/help_groups.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tepo_cli.core.help_groups import group_lines


def test_group_lines_list_each_groups_options():
    lines = group_lines("rollout,algo,model").splitlines()
    assert "_base" not in lines[1]  # conf/algo/_base.yaml is no option
    assert lines[0] == "rollout: hf, vllm"
    assert lines[2] == "model: hf, reference, replay, smollm2_135m, tiny"


@pytest.mark.slow
def test_eval_help_offers_no_group_eval_refuses(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "eval", "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    groups = result.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    listed = [line.split(":")[0] for line in groups.splitlines() if ": " in line]
    assert listed == ["model", "benchmark", "reward", "rollout", "env"]
    for refused in ("algo", "advantage", "deepspeed", "recipe"):
        assert f"\n{refused}: " not in result.stdout
