"""scripts/gpu_check.sh, the first command on a GPU node: its plan of checks, its verdicts, and a
real run of two checks on CPU ranks (the same `tepo` commands it gives a GPU node)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gpu_check = load_script()


def test_every_path_runs_on_one_rank_and_on_all_gpus():
    checks = gpu_check.plan(8, "cuda", ["model=smollm2_135m"], 3, vllm=True, tiny=False)
    labels = {c.label for c in checks}
    names = ("zero2", "zero3", "offload", "lora", "mpo-mtp", "gae", "dapo", "vllm", "resume")
    for name in (*names, "prompt-pass"):
        assert {f"{name}@1", f"{name}@8"} <= labels
    assert "eval@1" in labels and not any(c.skip for c in checks)
    for check in checks:
        if check.command != "train":
            continue
        values = dict(o.split("=", 1) for o in check.overrides)
        assert values["trainer.nproc"] == str(check.ranks)
        assert values["trainer.device"] == "cuda"
        assert int(values["trainer.prompts_per_step"]) % check.ranks == 0
    zero3 = next(c for c in checks if c.label == "zero3@8")
    values = dict(o.split("=", 1) for o in zero3.overrides)
    # Held-out shards of unequal size and one sequence per generate call: ranks finish apart.
    assert int(values["benchmark.eval_size"]) % 8 and values["rollout.batch_size"] == "1"
    assert values["trainer.eval_after"] == "true"


def test_one_gpu_plans_each_path_once_and_a_tiny_model_skips_dapo():
    checks = gpu_check.plan(1, "cpu", ["model=tiny"], 1, vllm=False, tiny=True)
    assert len({c.label for c in checks}) == len(checks)
    assert all(c.ranks == 1 for c in checks)
    skipped = {c.name for c in checks if c.skip}
    assert skipped == {"dapo", "vllm"}


def test_only_adds_the_runs_a_check_reads():
    checks = gpu_check.plan(2, "cuda", ["model=tiny"], 1, vllm=True, tiny=True)
    chosen = [c.label for c in gpu_check.selected(checks, ["resume@2", "eval"])]
    assert chosen == ["zero2@1", "save@2", "resume@2", "eval@1"]  # in the plan's order
    with pytest.raises(ValueError, match="unknown check"):
        gpu_check.selected(checks, ["zero9"])


def test_a_run_passes_only_with_every_step_finite_and_no_skipped_step():
    check = gpu_check.Check("zero2", 1, ())
    good = [{"step": s, "loss": 0.5, "skipped_optimizer_steps": 0} for s in (1, 2)]
    assert gpu_check.judge(check, 0, good, 2) == ""
    assert gpu_check.judge(check, 3, good, 2) == "exit code 3"
    assert "1 of 2" in gpu_check.judge(check, 0, good[:1], 2)
    nan = [*good[:1], {"step": 2, "loss": math.nan, "skipped_optimizer_steps": 0}]
    assert "non-finite loss at step(s) [2]" in gpu_check.judge(check, 0, nan, 2)
    skipped = [*good[:1], {"step": 2, "loss": 0.5, "skipped_optimizer_steps": 1}]
    assert "1 optimizer step(s) skipped" in gpu_check.judge(check, 0, skipped, 2)
    # A check that must have run a path: its metric above 0 at every step.
    needs = gpu_check.Check("prompt-pass", 1, (), positive=("prompt_pass_tokens",))
    ran = [{**r, "prompt_pass_tokens": 90} for r in good]
    assert gpu_check.judge(needs, 0, ran, 2) == ""
    absent = [ran[0], {**ran[1], "prompt_pass_tokens": 0}]
    assert "prompt_pass_tokens not above 0 at step(s) [2]" in gpu_check.judge(needs, 0, absent, 2)


def test_cuda_requested_without_cuda_is_refused_in_one_paragraph():
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True
    )
    if "CUDA" not in result.stderr:  # a machine with a GPU runs the checks instead
        pytest.skip("CUDA is usable here")
    assert result.returncode == 2
    assert "torch cannot use CUDA here" in result.stderr and "--device cpu" in result.stderr


@pytest.mark.slow
def test_the_script_runs_checks_on_cpu_ranks_and_writes_its_table(tmp_path):
    out = tmp_path / "check"
    result = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--steps",
            "1",
            "--only",
            "zero2,eval",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row["label"]: row for row in json.loads((out / "gpu_check.json").read_text())["checks"]}
    assert rows["zero2@1"]["verdict"] == "pass" and rows["eval@1"]["verdict"] == "pass"
    assert rows["zero2@1"]["steps"] == 1 and rows["zero2@1"]["step_s"] > 0
    assert rows["zero2@1"]["extra"] == {"tf32": False}  # CPU ranks; rollout=hf: no engine modes
    assert "zero2@1" in result.stdout and "2 of 2 checks did not fail" in result.stdout


def test_a_spent_budget_leaves_checks_not_run_and_still_writes_the_table(tmp_path):
    """On a lent node the time is fixed: checks that would start after --budget are shown as not
    run, and the table (Markdown and JSON) is written all the same."""
    out = tmp_path / "check"
    table = tmp_path / "table.md"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--only",
            "zero2,eval",
            "--budget",
            "5",
            "--out",
            str(out),
            "--markdown",
            str(table),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((out / "gpu_check.json").read_text())["checks"]
    assert [(r["label"], r["verdict"], r["why"]) for r in rows] == [
        ("zero2@1", "skip", "not run: --budget 5 s spent"),
        ("eval@1", "skip", "not run: --budget 5 s spent"),
    ]
    assert "| zero2@1 | skip |" in table.read_text()
