"""Benchmark loaders: field mapping per benchmark, local files through `datasets`, the errors
for missing data and offline hubs, and the refusal to train on a test split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tepo_cli.benchmarks import benchmarks, get_benchmark, load_problems
from tepo_cli.benchmarks.mbpp import MBPP_TEMPLATE, mbpp_entry_point
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import DataError, check_split_for_training
from tepo_cli.rewards.code import CodeProblem, grade_many


def to_problem(name: str, record: dict, index: int = 0, split: str = "test") -> Problem:
    """One record through the benchmark's own mapping, with the default id load_problems gives."""
    mapping = get_benchmark(name).to_problem
    assert mapping is not None
    return mapping(record, index, f"{name}/{split}/{index}")


GSM8K = {"question": "Tom has 3 apples ...?", "answer": "3 + 1,997 = 2,000\n#### 2,000"}
MATH = {
    "problem": "Compute $\\frac{1}{2} + \\frac{1}{4}$.",
    "solution": "First $\\boxed{x}$ is not it; we get $\\boxed{\\frac{3}{4}}$.",
    "level": "Level 1",
    "type": "Prealgebra",
}
MATH500_HUB = {  # HuggingFaceH4/MATH-500's fields
    "problem": "What is $1+1$?",
    "solution": "$1+1=\\boxed{2}$",
    "answer": "2",
    "subject": "Algebra",
    "level": 1,
    "unique_id": "test/algebra/1.json",
}
HUMANEVAL = {
    "task_id": "HumanEval/7",
    "prompt": "def inc(x: int) -> int:\n    '''x + 1'''\n",
    "canonical_solution": "    return x + 1\n",
    "test": "\ndef check(candidate):\n    assert candidate(1) == 2\n",
    "entry_point": "inc",
}
MBPP = {
    "task_id": 349,
    "text": "Write a python function to check whether the given string is a binary string.",
    "code": "def check(string):\r\n    return 'Yes' if set(string) <= {'0', '1'} else 'No'",
    "test_list": ['assert check("0101") == "Yes"', 'assert check("name0") == "No"'],
    "test_setup_code": "",
    "challenge_test_list": [],
}


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path / "tepo"))


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_gsm8k_mapping() -> None:
    problem = to_problem("gsm8k", GSM8K, 4, "test")
    assert (problem.id, problem.question, problem.answer) == (
        "gsm8k/test/4",
        GSM8K["question"],
        "2000",
    )
    assert problem.extra == {"solution": GSM8K["answer"]}
    with pytest.raises(DataError, match="####"):
        to_problem("gsm8k", {"question": "q", "answer": "42"})


def test_math_mapping_takes_the_last_box() -> None:
    problem = to_problem("math", MATH, 0)
    assert problem.question == MATH["problem"] and problem.answer == "\\frac{3}{4}"
    assert problem.extra == {
        "solution": MATH["solution"],
        "level": "Level 1",
        "subject": "Prealgebra",
    }
    hub = to_problem("math500", MATH500_HUB, 0)
    assert (hub.id, hub.answer) == ("test/algebra/1.json", "2")
    assert hub.extra["subject"] == "Algebra" and hub.extra["level"] == "Level 1"
    with pytest.raises(DataError, match="boxed"):
        to_problem("math", dict(MATH, solution="no box"))
    with pytest.raises(DataError, match="'problem' value"):
        to_problem("math", {"solution": "\\boxed{1}"})


def test_humaneval_mapping() -> None:
    problem = to_problem("humaneval", HUMANEVAL)
    assert (problem.id, problem.question, problem.answer) == (
        "HumanEval/7",
        HUMANEVAL["prompt"],
        HUMANEVAL["canonical_solution"],
    )
    assert problem.extra == {k: HUMANEVAL[k] for k in ("prompt", "test", "entry_point", "task_id")}


def test_mbpp_mapping() -> None:
    problem = to_problem("mbpp", MBPP)
    assert problem.id == "mbpp/349" and problem.answer == MBPP["code"]
    assert problem.question == MBPP_TEMPLATE.format(text=MBPP["text"], test=MBPP["test_list"][0])
    assert problem.extra["entry_point"] == "check"
    assert problem.extra["test_list"] == MBPP["test_list"]
    sanitized = {  # google-research-datasets/mbpp "sanitized" spells two fields differently
        "task_id": 2,
        "prompt": "Write a function to add.",
        "code": "import math\ndef helper(a):\n    return a\ndef add(a, b):\n    return helper(a) + b",
        "test_list": ["assert add(1, 2) == 3"],
        "test_imports": ["import math"],
    }
    problem = to_problem("mbpp", sanitized)
    assert (
        problem.extra["entry_point"] == "add" and problem.extra["test_setup_code"] == "import math"
    )
    assert problem.question.startswith("Write a function to add.\n")


def test_mbpp_entry_point() -> None:
    code = "def helper(x):\n    return x\n\ndef solve(x):\n    return helper(x)\n"
    assert mbpp_entry_point(code, ["assert solve(1) == 1"]) == "solve"
    assert mbpp_entry_point(code, ["assert True"]) == "solve"  # nothing called: the last def
    assert mbpp_entry_point("x = 1", ["assert x == 1"]) is None


def test_code_problems_grade_in_the_sandbox() -> None:
    """HumanEval and MBPP share one grader input; an MBPP solution named `check` (tasks 56,
    349) is not shadowed by the test harness."""
    items = []
    for name, record in (("humaneval", HUMANEVAL), ("mbpp", MBPP)):
        problem = to_problem(name, record)
        items += [
            (problem.answer, CodeProblem.from_record(problem.extra)),
            ("", CodeProblem.from_record(problem.extra)),
        ]
    grades = grade_many(items, extract=False)
    assert [g.correct for g in grades] == [True, False, True, False]


def test_local_jsonl_json_and_parquet(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "gsm.jsonl", [GSM8K, dict(GSM8K, answer="#### 7")])
    assert [p.answer for p in load_problems("gsm8k", path=str(path))] == ["2000", "7"]
    assert len(load_problems("gsm8k", path=str(path), limit=1)) == 1
    array = tmp_path / "math.json"
    array.write_text(json.dumps([MATH, MATH]))
    assert [p.answer for p in load_problems("math", path=str(array))] == ["\\frac{3}{4}"] * 2

    from datasets import Dataset

    folder = tmp_path / "humaneval_repo" / "data"
    folder.mkdir(parents=True)
    Dataset.from_list([HUMANEVAL]).to_parquet(str(folder / "test-00000-of-00001.parquet"))
    Dataset.from_list([dict(HUMANEVAL, task_id="train/0")]).to_parquet(
        str(folder / "train.parquet")
    )
    (test,) = load_problems("humaneval", path=str(tmp_path / "humaneval_repo"))
    assert test.id == "HumanEval/7"
    (train,) = load_problems("humaneval", split="train", path=str(tmp_path / "humaneval_repo"))
    assert train.id == "train/0"
    with pytest.raises(DataError, match="No validation files"):
        load_problems("humaneval", split="validation", path=str(tmp_path / "humaneval_repo"))
    with pytest.raises(DataError, match="does not exist"):
        load_problems("gsm8k", path=str(tmp_path / "nowhere.jsonl"))


def test_missing_prepared_data_says_how_to_prepare() -> None:
    with pytest.raises(DataError, match=r"tepo data prepare benchmark=math500"):
        load_problems("math500")
    with pytest.raises(ConfigError, match="benchmark=gsm9k is not a benchmark; the benchmarks are"):
        load_problems("gsm9k")
    with pytest.raises(DataError, match="positive"):
        load_problems("gsm8k", limit=0)


def test_hub_failure_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def offline(repo: str, config: str | None = None, split: str | None = None):
        calls.append((repo, config, split))
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr("datasets.load_dataset", offline)
    with pytest.raises(DataError) as error:
        load_problems("gsm8k", split="train")  # a train split defaults to the hub
    assert calls == [("openai/gsm8k", "main", "train")]
    message = str(error.value)
    assert "openai/gsm8k:main" in message and "ConnectionError" in message and "path=" in message
    with pytest.raises(DataError, match="my/math"):
        load_problems("math", split="train", hub_id="my/math:algebra,geometry")
    assert calls[-1] == ("my/math", "algebra", "train")


def test_hub_configs_are_concatenated(monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import Dataset

    def fake(repo: str, config: str | None = None, split: str | None = None):
        return Dataset.from_list([dict(MATH, type=config)])

    monkeypatch.setattr("datasets.load_dataset", fake)
    problems = load_problems("math", split="train", hub_id="x/math:algebra,geometry")
    assert [p.extra["subject"] for p in problems] == ["algebra", "geometry"]


def test_training_on_a_test_split_is_refused() -> None:
    gsm8k = get_benchmark("gsm8k").hub_id
    with pytest.raises(DataError, match=r"test split of gsm8k.*the hub \(openai/gsm8k:main\)"):
        check_split_for_training("gsm8k", "test", gsm8k)
    check_split_for_training("gsm8k", "test", gsm8k, force=True)
    check_split_for_training("math", "train", get_benchmark("math").hub_id)
    # every dataset benchmark names the hub dataset its other splits come from
    assert all(b.hub_id for b in benchmarks().values() if b.to_problem is not None)
    assert get_benchmark("arith").to_problem is None  # generated: a held-out split of its own


def test_training_data_origin_per_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tepo_cli.benchmarks import build_task
    from tepo_cli.config.schema import BenchmarkConfig

    def origin(name: str, split: str, **keys: str) -> str:
        return build_task(BenchmarkConfig(name=name, **keys)).origin(split)

    data = tmp_path / "tepo" / "data"
    assert origin("math500", "train") == f"prepared offline: {data / 'math500' / 'train.jsonl'}"
    assert origin("math500", "test") == f"prepared offline: {data / 'math500' / 'test.jsonl'}"
    assert origin("math", "train") == (
        "the hub dataset EleutherAI/hendrycks_math:algebra,counting_and_probability,geometry,"
        "intermediate_algebra,number_theory,prealgebra,precalculus (needs network)"
    )
    assert origin("gsm8k", "train", hub_id="my/gsm") == "the hub dataset my/gsm (needs network)"
    assert origin("mbpp", "train", path="here") == "local files: here"
    monkeypatch.setattr("datasets.load_dataset", lambda *a, **k: pytest.fail("hub used"))
    with pytest.raises(DataError, match=r"math500 train split is not prepared.*benchmark=math500"):
        load_problems("math500", split="train")  # prepared offline, never the hub
