"""End to end through the real CLI, Hydra, DeepSpeed and the tiny model (slow: subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

METRIC_KEYS = {
    "step",
    "reward_mean",
    "reward_std",
    "accuracy",
    "response_length",
    "entropy",
    "clip_frac",
    "kl",
    "grad_norm",
    "step_seconds",
    "tokens_per_second",
    "rollout_seconds",
    "update_seconds",
}


def tepo(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def parity_reward(directory: Path) -> list[str]:
    """A verifiable reward a random tiny model scores unevenly, so advantages are non-zero."""
    (directory / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2 == 0\n"
    )
    return ["reward=custom", f"reward.path={directory / 'parity.py'}"]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("metrics.jsonl"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_tiny_then_eval_the_saved_model(tmp_path):
    # A grader that depends on the problem and the completion, so accuracy is neither 0 nor 1
    (tmp_path / "mod3.py").write_text(
        "def score(completion, problem):\n"
        "    return len(completion) % 3 == int(problem.answer) % 3\n"
    )
    reward = ["reward=custom", f"reward.path={tmp_path / 'mod3.py'}"]
    held_out = "benchmark.eval_size=30"
    tepo("train", "model=tiny", "trainer.max_steps=2", held_out, *reward, cwd=tmp_path)
    (run,) = run_dirs(tmp_path / "outputs")
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert set(metrics[0]) >= METRIC_KEYS
    assert metrics[0]["grad_norm"] > 0
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "config.yaml").is_file()
    assert len(read_jsonl(run / "samples.jsonl")) == 8  # samples_per_step=4 x 2 steps
    evals = read_jsonl(run / "eval.jsonl")
    assert [(e["when"], e["problems"]) for e in evals] == [("before", 30), ("after", 30)]
    # Each evaluation's 30 graded answers, tagged with it; its record sums them up.
    answers = read_jsonl(run / "eval_samples.jsonl")
    assert [(a["step"], a["when"]) for a in answers] == [(0, "before")] * 30 + [(2, "after")] * 30
    for evaluation, graded in zip(evals, (answers[:30], answers[30:]), strict=True):
        assert evaluation["accuracy"] == sum(a["passed"] for a in graded) / 30
        assert evaluation["length_mean"] == pytest.approx(sum(a["length"] for a in graded) / 30)
        assert evaluation["truncated_frac"] == sum(a["truncated"] for a in graded) / 30
    assert [a["id"] for a in answers[:30]] == [a["id"] for a in answers[30:]]
    assert len({a["id"] for a in answers[:30]}) == 30 and "prompt" not in answers[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    assert (summary["eval_before"], summary["eval_after"]) == (
        evals[0]["accuracy"],
        evals[1]["accuracy"],
    )
    assert summary["final_reward_mean"] == metrics[-1]["reward_mean"]
    assert (run / "final" / "model.safetensors").is_file()
    assert not (run / "final.tmp").exists()

    # tepo eval of the saved model, greedy on the same 30 held-out problems with the same answer
    # length (benchmark.max_new_tokens) and grader, scores exactly what the trainer's last
    # evaluation did.
    final = f"model.path={run / 'final'}"
    tepo("eval", "model=tiny", final, held_out, *reward, cwd=tmp_path)
    (evaluation,) = (tmp_path / "outputs" / "eval").rglob("summary.json")
    result = json.loads(evaluation.read_text())
    assert result["problems"] == 30 and result["samples"] == 30
    assert result["accuracy"] == summary["eval_after"]
    assert 0.0 < result["accuracy"] < 1.0  # a grader that tells the completions apart
    assert len(read_jsonl(evaluation.parent / "samples.jsonl")) == 30


def test_multirun_sweep_writes_one_run_dir_per_job(tmp_path):
    tepo(
        "train",
        "-m",
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.save_final=false",
        "algo.eps_high=0.2,0.28",
        cwd=tmp_path,
    )
    runs = run_dirs(tmp_path / "multirun")
    assert [r.name.split(",")[0] for r in runs] == ["0_algo.eps_high=0.2", "1_algo.eps_high=0.28"]
    assert [yaml.safe_load((r / "config.yaml").read_text())["algo"]["eps_high"] for r in runs] == [
        0.2,
        0.28,
    ]
