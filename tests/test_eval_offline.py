"""`tepo eval` without a model: reference solutions and replayed completions, graded for real.

Needs the prepared benchmark files (`tepo data prepare`); prepared on first use.
"""

from __future__ import annotations

import json

import pytest

from tepo_cli.benchmarks import load_problems
from tepo_cli.config.validate import load_eval_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.data.prepare import prepare, problem_with
from tepo_cli.eval.eval_job import run_eval

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def prepared() -> None:
    names = ["gsm8k", "humaneval"]
    if any(problem_with(name) for name in names):
        prepare(names)


def evaluate(compose_config, tmp_path, *overrides: str) -> dict:
    config = load_eval_config(compose_config("eval", list(overrides)))
    return run_eval(config, tmp_path)


@pytest.mark.parametrize(("benchmark", "limit"), [("gsm8k", 200), ("humaneval", 20)])
def test_reference_solutions_pass(compose_config, tmp_path, benchmark, limit):
    summary = evaluate(
        compose_config, tmp_path, "model=reference", f"benchmark={benchmark}", f"eval.limit={limit}"
    )
    assert summary["problems"] == limit and summary["accuracy"] == 1.0
    assert summary["grader"] in {"gsm8k-strict", "code"}


def test_replayed_completions_are_graded_per_sample(compose_config, tmp_path):
    problems = load_problems("humaneval", limit=4)
    lines = []
    for problem in problems:  # sample 0: the canonical body; sample 1: nothing
        lines.append({"id": problem.id, "sample": 1, "completion": ""})
        lines.append({"id": problem.id, "sample": 0, "completion": problem.answer})
    replay = tmp_path / "completions.jsonl"
    replay.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    summary = evaluate(
        compose_config,
        tmp_path / "run",
        "model=replay",
        f"model.path={replay}",
        "benchmark=humaneval",
        "eval.limit=4",
        "eval.greedy=false",
        "eval.n=2",
    )
    assert summary["samples"] == 8 and summary["accuracy"] == 0.5
    assert summary["pass@1"] == 0.5 and "pass@5" not in summary
    records = [json.loads(r) for r in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [r["passed"] for r in records[:2]] == [True, False]


def test_replay_file_missing_problems_is_a_clear_error(compose_config, tmp_path):
    replay = tmp_path / "completions.jsonl"
    replay.write_text(json.dumps({"id": "HumanEval/0", "completion": "    return True\n"}) + "\n")
    with pytest.raises(ConfigError, match=r"fewer than eval\.n=1 completions for 2 of the 3"):
        evaluate(
            compose_config,
            tmp_path / "run",
            "model=replay",
            f"model.path={replay}",
            "benchmark=humaneval",
            "eval.limit=3",
        )
