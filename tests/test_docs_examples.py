"""The documentation's "extending tepo" examples (docs/guides/extending.md) run exactly as written
(on the tiny model): each section's `<!-- file: ... -->` blocks are written out and its
`<!-- command -->` lines run."""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "extending.md"
BLOCK = re.compile(r"<!-- (file: (?P<file>\S+)|command) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)
QUICK = [
    "model=tiny",
    "trainer.max_steps=1",
    "trainer.eval_before=false",
    "trainer.eval_after=false",
]

pytestmark = pytest.mark.slow


def example(heading: str) -> tuple[dict[str, str], list[list[str]]]:
    """The files and command lines of the page's section under `heading`."""
    text = PAGE.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.compile(r"^## ", re.M).search(text, start)
    section = text[start : following.start() if following else None]
    blocks = list(BLOCK.finditer(section))
    files = {m["file"]: m["body"] for m in blocks if m["file"]}
    commands = [
        shlex.split(line) for m in blocks if not m["file"] for line in m["body"].splitlines()
    ]
    return files, commands


def run_example(tmp_path: Path, heading: str, *extra: str) -> list[subprocess.CompletedProcess]:
    files, commands = example(heading)
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    results = []
    for args in commands:
        assert args[0] == "tepo" and args[1] in ("train", "eval")
        quick = [*QUICK, *extra] if args[1] == "train" else []
        result = subprocess.run(
            [sys.executable, "-m", "tepo_cli", *args[1:], *quick],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results.append(result)
    return results


def test_write_your_own_objective_example(tmp_path):
    files, commands = example("## Write your own objective")
    assert set(files) == {"my_objective.py", "my_conf/algo/reinforce.yaml"}
    assert [args[:2] for args in commands] == [["tepo", "train"]]
    run_example(tmp_path, "## Write your own objective")
    (config,) = tmp_path.glob("outputs/train/*/*/config.yaml")
    assert "name: reinforce" in config.read_text() and "beta: 0.0" in config.read_text()
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    record = json.loads(metrics.read_text().splitlines()[0])
    assert "pg_loss" in record and "clip_frac" not in record  # the plugin's own metrics


def test_a_benchmark_of_your_own_example(tmp_path):
    """One module + one YAML (+ its data): the reference answers grade 2/2, and a training run
    draws from train.jsonl and evaluates on test.jsonl."""
    files, commands = example("## A benchmark of your own")
    assert {"my_benchmark.py", "my_conf/benchmark/svamp.yaml"} <= set(files)
    assert [args[:2] for args in commands] == [["tepo", "eval"], ["tepo", "train"]]
    run_example(tmp_path, "## A benchmark of your own", "trainer.eval_after=true")
    (evaluation,) = tmp_path.glob("outputs/eval/*/*/summary.json")
    summary = json.loads(evaluation.read_text())
    assert (summary["benchmark"], summary["grader"], summary["accuracy"]) == ("svamp", "arith", 1.0)
    assert summary["problems"] == 2
    (samples,) = tmp_path.glob("outputs/train/*/*/samples.jsonl")
    questions = {json.loads(line)["question"] for line in samples.read_text().splitlines()}
    assert questions <= {
        "Tom has 3 boxes of 4 apples. How many apples does he have?",
        "Ann read 9 pages and then 6 more. How many pages did she read?",
    }
    (evals,) = tmp_path.glob("outputs/train/*/*/eval.jsonl")
    assert [json.loads(line)["problems"] for line in evals.read_text().splitlines()] == [2]


def test_a_rollout_back_end_of_your_own_example(tmp_path):
    """One module + one YAML: the trainer generates through the plugin's engine and corrects for
    its bfloat16 log-probs, which differ from its own float32 ones by float rounding, not more."""
    files, commands = example("## A rollout back-end of your own")
    assert set(files) == {"bf16_engine.py", "my_conf/rollout/hf_bf16_logprobs.yaml"}
    assert [args[:2] for args in commands] == [["tepo", "train"]]
    run_example(tmp_path, "## A rollout back-end of your own")
    (config,) = tmp_path.glob("outputs/train/*/*/config.yaml")
    assert "backend: hf_bf16_logprobs" in config.read_text()
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    record = json.loads(metrics.read_text().splitlines()[0])
    assert 1e-5 < record["mismatch_abs_mean"] < 1e-2  # bfloat16 rounding of the same tokens
    assert record["mismatch_abs_max"] >= record["mismatch_abs_mean"]
    assert record["mismatch_truncated_frac"] == 0.0  # weights within [1/3, 3]


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
    assert (
        "cispo, clip_cov, dapo, gmpo, grpo, gspo, kl_cov, mpo, sapo, tepo" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_unknown_benchmark_and_grader_list_the_known_ones():
    from tepo_cli.benchmarks import check_benchmark
    from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
    from tepo_cli.core.errors import ConfigError

    auto = RewardConfig(name="auto")
    with pytest.raises(
        ConfigError,
        match=r"benchmark=svamp is not a benchmark; the benchmarks are: arith, custom, gsm8k, humaneval, math, math500, mbpp, word_math\.",
    ):
        check_benchmark(BenchmarkConfig(name="svamp"), auto)
    with pytest.raises(
        ConfigError,
        match=r"reward=gsm9k is not a grader; the graders are: auto \(the benchmark's own\), arith, code, custom, gsm8k, math, word_math\.",
    ):
        check_benchmark(BenchmarkConfig(name="gsm8k"), RewardConfig(name="gsm9k"))


def test_a_tracker_of_your_own_example(tmp_path):
    """One plugin module: the tracker receives every number of each step, as metrics.jsonl holds
    it, and the run's outcome."""
    files, commands = example("## A tracker of your own")
    assert set(files) == {"csv_tracker.py"}
    assert [args[:2] for args in commands] == [["tepo", "train"]]
    run_example(tmp_path, "## A tracker of your own")
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    record = json.loads(metrics.read_text().splitlines()[0])
    (table,) = tmp_path.rglob("csv/metrics.csv")
    rows = {(int(step), key): float(value) for step, key, value in csv.reader(table.open())}
    assert rows[(1, "reward_mean")] == record["reward_mean"]
    assert rows[(1, "loss")] == record["loss"] and len(rows) > 20
    (outcome,) = tmp_path.rglob("csv/outcome.txt")
    assert outcome.read_text() == "finished"


def test_your_own_reward_example(tmp_path):
    """A function in a file is the grader: the run's rewards are its verdicts (0 or 1 here)."""
    files, commands = example("## Your own reward")
    assert set(files) == {"my_reward.py"}
    assert [args[:2] for args in commands] == [["tepo", "train"]]
    run_example(tmp_path, "## Your own reward")
    (config,) = tmp_path.glob("outputs/train/*/*/config.yaml")
    assert "name: custom" in config.read_text() and "function: score" in config.read_text()
    (samples,) = tmp_path.rglob("samples.jsonl")
    rewards = [json.loads(line)["reward"] for line in samples.read_text().splitlines()]
    assert rewards and set(rewards) <= {0.0, 1.0}


def test_reward_terms_example(tmp_path):
    """Two terms beside the grader: each logged per step and per sample, the reward their sum."""
    files, commands = example("## Reward terms")
    assert set(files) == {"shaping.py"} and [args[:2] for args in commands] == [["tepo", "train"]]
    run_example(tmp_path, "## Reward terms")
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    (record,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert {"reward_term_work_mean", "reward_term_cost_mean"} <= set(record)
    (samples,) = tmp_path.rglob("samples.jsonl")
    for sample in map(json.loads, samples.read_text().splitlines()):
        terms, graded = sample["reward_terms"], float(sample["reward"] > 0.5)  # arith: 1 or 0
        shaped = graded + 0.1 * terms["work"] - 0.05 * terms["cost"]
        assert sample["reward"] == pytest.approx(shaped, abs=1e-6)
        assert terms["cost"] == pytest.approx(len(sample["completion"]) / 1000)
