"""`tepo eval` pieces: the summary numbers and resuming from a partly written samples file."""

from __future__ import annotations

import json

import pytest

from tepo_cli.benchmarks import build_task, check_benchmark
from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.tasks import DatasetTask
from tepo_cli.eval.eval_job import _completed_records, refuse_training_sampling_keys
from tepo_cli.eval.summary import summarize


def record(problem_id: str, sample: int, passed: bool, extracted: str | None) -> dict:
    return {
        "id": problem_id,
        "sample": sample,
        "passed": passed,
        "extracted": extracted,
        "length": 4,
        "truncated": False,
    }


def test_summary_pass_at_k_and_majority_vote():
    problems = [Problem("a", "1+1", "2"), Problem("b", "2*3", "6")]
    records = [
        record("a", 0, True, "2"),
        record("a", 1, False, "3"),
        record("a", 2, True, "2.0"),
        record("b", 0, False, "5"),
        record("b", 1, False, "5"),
        record("b", 2, True, "6"),
    ]
    summary = summarize(records, problems, n=3, pass_k=[1, 2, 5], grader="arith")
    assert summary["accuracy"] == pytest.approx(3 / 6)
    # pass@1 = mean(c/n) = (2/3 + 1/3) / 2; pass@2 = mean(1 - C(n-c,2)/C(n,2)) = (1 + 2/3) / 2
    assert summary["pass@1"] == pytest.approx(0.5)
    assert summary["pass@2"] == pytest.approx((1 + 2 / 3) / 2)
    assert "pass@5" not in summary  # k > n is not estimable
    assert summary["maj@3"] == pytest.approx(0.5)  # a: "2" and "2.0" agree; b: "5" wins, wrong
    assert summary["problems"] == 2 and summary["samples"] == 6


def test_summary_reports_mean_and_median_answer_length():
    """The median beside the mean: a few answers running to max_new_tokens pull the mean up."""
    problems = [Problem(str(i), "q", "1") for i in range(4)]
    records = [
        dict(record(str(i), 0, True, "1"), length=n) for i, n in enumerate([80, 90, 100, 320])
    ]
    summary = summarize(records, problems, n=1, pass_k=[1], grader="word_math")
    assert (summary["mean_length"], summary["median_length"]) == (147.5, 95.0)
    offline = [dict(r, length=None) for r in records]  # model=reference / replay: no lengths
    summary = summarize(offline, problems, n=1, pass_k=[1], grader="word_math")
    assert summary["mean_length"] is None and summary["median_length"] is None


def test_code_benchmarks_have_no_majority_vote():
    problems = [Problem("h/0", "def f():", "pass")]
    records = [record("h/0", 0, True, "def f(): pass"), record("h/0", 1, False, "x")]
    summary = summarize(records, problems, n=2, pass_k=[1], grader="code")
    assert summary["pass@1"] == pytest.approx(0.5) and not any(
        k.startswith("maj@") for k in summary
    )


def test_resume_keeps_complete_problems_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    lines = [json.dumps(record("a", i, True, "2")) for i in range(2)]
    lines += [json.dumps(record("b", 0, False, "1"))]  # b has 1 of its 2 samples
    path.write_text("\n".join(lines) + "\n" + '{"id": "c", "sam')  # killed mid-write
    done = _completed_records(path, n=2)
    assert list(done) == ["a"] and len(done["a"]) == 2
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "a"]


def test_dataset_benchmarks_refuse_training_on_the_test_split(tmp_path):
    task = build_task(BenchmarkConfig(name="gsm8k", train_split="test"))
    assert isinstance(task, DatasetTask)
    with pytest.raises(ConfigError, match=r"benchmark\.allow_test_split=true"):
        task.check_training()
    local = tmp_path / "test.jsonl"  # forced: the split is then read (a local copy, offline)
    local.write_text('{"question": "What is 1+1?", "answer": "2\\n#### 2"}\n')
    forced = build_task(
        BenchmarkConfig(name="gsm8k", train_split="test", allow_test_split=True, path=str(local))
    )
    forced.check_training()
    assert next(forced.train_stream(0)).answer == "2"


def test_arith_only_keys_are_rejected_for_datasets():
    with pytest.raises(ConfigError, match=r"^benchmark\.digits: benchmark=gsm8k has no knobs"):
        check_benchmark(BenchmarkConfig(name="gsm8k", digits=2), RewardConfig(name="auto"))


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("rollout.n=8", "rollout.n sets the training rollout's sampling; tepo eval samples with"),
        ("+rollout.temperature=1.0", "(here: eval.temperature)"),
        ("rollout.top_k=5", "(tepo eval has no top_k)"),
    ],
)
def test_eval_refuses_the_training_rollouts_sampling_keys(override, fragment):
    with pytest.raises(ConfigError) as caught:
        refuse_training_sampling_keys(["benchmark=gsm8k", override])
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_eval_takes_the_back_end_and_its_engine_from_the_rollout_group():
    refuse_training_sampling_keys(["rollout=vllm", "rollout.engine.max_model_len=512", "eval.n=4"])
