"""Multi-turn training end to end on the tiny model: every objective finishes a step of
env=python_tool episodes on rollout=hf (one Hydra multirun, one process), and on rollout=vllm the
engine's log-probs of the trained tokens are the trainer's (the tokens trained are the tokens the
engine sampled, turn after turn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

QUICK = [
    "model=tiny",
    "env=python_tool",
    "env.max_turns=2",
    "trainer.max_steps=1",
    "trainer.eval_before=false",
    "trainer.eval_after=false",
    "trainer.save_final=false",
    "trainer.progress=false",
]


def train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def last_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def test_every_objective_trains_on_episodes(tmp_path):
    train(
        tmp_path,
        "-m",
        *QUICK,
        "algo=grpo,dapo,gspo,tepo,mpo",
        "k=3",
        "algo.dynamic_sampling=false",  # one step, whatever the tiny model's rewards
        "hydra.sweep.dir=sweep",
    )
    jobs = sorted((tmp_path / "sweep").glob("*/metrics.jsonl"))
    assert len(jobs) == 5
    for metrics in jobs:
        record = last_record(metrics.parent)
        assert record["env_turns_mean"] >= 1.0 and record["step"] == 1, metrics


def test_vllm_episodes_train_on_the_tokens_the_engine_sampled(tmp_path):
    if os.environ.get("TEPO_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="rollout=vllm needs `make install-vllm`")
    train(
        tmp_path,
        *QUICK,
        "rollout=vllm",
        "rollout.engine.kv_cache_gib=1",
        "hydra.run.dir=run",
    )
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["mismatch_abs_max"] < 1e-3, record
        assert "env_turns_mean" in record
