"""`benchmark=custom`: a user's own problems from a file, read by the fields they name and graded
by math-verify, with training problems left out of the held-out split by their question."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli.benchmarks import build_reward, build_task, check_benchmark
from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import DataError


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def custom(path: Path, **knobs: object) -> BenchmarkConfig:
    return BenchmarkConfig(name="custom", path=str(path), **knobs)


def test_problems_are_read_by_the_named_fields_and_overlap_is_left_out(tmp_path):
    write_jsonl(
        tmp_path / "data" / "train.jsonl",
        [{"q": "What is 2 + 3?", "a": 5}, {"q": "What is 4 * 3?", "a": 12.0}],
    )
    write_jsonl(
        tmp_path / "data" / "test.jsonl",
        [{"q": "What is 7 + 1?", "a": 8}, {"q": "What is 2 + 3?", "a": 5}, {"q": "What is 7 + 1?", "a": 8}],
    )  # fmt: skip
    task = build_task(custom(tmp_path / "data", question_key="q", answer_key="a"))
    every = task.eval_problems()
    assert [(p.question, p.answer) for p in every] == [
        ("What is 7 + 1?", "8"), ("What is 2 + 3?", "5"), ("What is 7 + 1?", "8"),
    ]  # fmt: skip
    first, overlap, repeat = (p.id for p in every)
    assert first.startswith("custom/") and repeat == f"{first}#2" and len({first, overlap}) == 2
    train = list(task._train_problems())
    assert [p.answer for p in train] == ["5", "12"]  # 12.0 -> "12"
    assert train[0].id == overlap  # the same question, the same id in either file
    task.check_training()
    assert [p.id for p in task.eval_problems()] == [first, repeat]


def test_nested_fields_and_chat_messages_as_verl_writes_them(tmp_path):
    record = {
        "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
        "reward_model": {"ground_truth": "42", "style": "rule"},
        "extra_info": {"index": 17},
    }
    write_jsonl(tmp_path / "test.jsonl", [record])
    knobs = dict(question_key="prompt", answer_key="reward_model.ground_truth")
    (problem,) = build_task(
        custom(tmp_path / "test.jsonl", **knobs, id_key="extra_info.index")
    ).eval_problems()
    assert (problem.id, problem.question, problem.answer) == ("17", "What is 6 * 7?", "42")

    record["prompt"] = [{"role": "system", "content": "Be brief."}, *record["prompt"]]
    write_jsonl(tmp_path / "test.jsonl", [record])
    with pytest.raises(DataError, match=r"roles \['system', 'user'\].*benchmark.system_prompt"):
        build_task(custom(tmp_path / "test.jsonl", **knobs)).eval_problems()


def test_the_answer_cut_from_a_worked_solution(tmp_path):
    boxed = "Add them: $2+3=\\boxed{5}$."
    hashes = "Natalia sold 48/2 = 24 clips in May.\n#### 1,072"
    write_jsonl(tmp_path / "boxed.jsonl", [{"question": "q1", "answer": boxed}])
    write_jsonl(tmp_path / "hashes.jsonl", [{"question": "q2", "answer": hashes}])
    (p,) = build_task(custom(tmp_path / "boxed.jsonl", answer_in="last_boxed")).eval_problems()
    assert (p.answer, p.extra["solution"]) == ("5", boxed)
    (p,) = build_task(custom(tmp_path / "hashes.jsonl", answer_in="after_hashes")).eval_problems()
    assert (p.answer, p.extra["solution"]) == ("1072", hashes)
    with pytest.raises(DataError, match=r"answer_in=last_boxed: record 0's .*no \\boxed"):
        build_task(custom(tmp_path / "hashes.jsonl", answer_in="last_boxed")).eval_problems()
    with pytest.raises(DataError, match=r"answer_in=after_hashes: record 0's .*'#### <answer>'"):
        build_task(custom(tmp_path / "boxed.jsonl", answer_in="after_hashes")).eval_problems()


def test_a_missing_field_a_repeated_id_and_a_wrong_knob_are_refused(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", [{"problem": "x", "answer": 1, "id": "a"}] * 2)
    with pytest.raises(
        DataError,
        match=r"record 0 has no 'question' value.*fields of the record are answer, id, problem",
    ):
        build_task(custom(tmp_path / "test.jsonl")).eval_problems()
    nested = custom(tmp_path / "test.jsonl", question_key="problem", answer_key="answer.value")
    with pytest.raises(DataError, match=r"no 'answer.value' value.*fields of answer are none"):
        build_task(nested).eval_problems()
    repeated = custom(tmp_path / "test.jsonl", question_key="problem", id_key="id")
    with pytest.raises(DataError, match=r"id_key=id: the test split repeats the id\(s\) a;"):
        build_task(repeated).eval_problems()
    wrong = custom(tmp_path / "test.jsonl", question_field="problem")
    with pytest.raises(
        ConfigError, match=r"benchmark.question_field: benchmark=custom has no such knob"
    ):
        check_benchmark(wrong, RewardConfig(name="auto"))
    with pytest.raises(ConfigError, match=r"benchmark.answer_in: input should be 'value'"):
        build_task(custom(tmp_path / "test.jsonl", answer_in="boxed"))


def test_math_verify_grades_the_user_s_answers():
    reward = build_reward(RewardConfig(name="auto"), BenchmarkConfig(name="custom"))
    problem = Problem("custom/x", "What is 1/2 + 1/4?", "3/4")
    right = reward("1/2 + 1/4 = 3/4, so the answer is \\boxed{\\frac{3}{4}}.", problem)
    wrong = reward("The answer is \\boxed{0.7}.", problem)
    assert (right.reward, right.correct, wrong.reward, wrong.correct) == (1.0, True, 0.0, False)


@pytest.mark.slow
def test_eval_and_train_on_a_users_files(tmp_path):
    write_jsonl(
        tmp_path / "data" / "train.jsonl",
        [{"q": f"What is {n} + 1?", "a": n + 1} for n in range(6)],
    )
    write_jsonl(
        tmp_path / "data" / "test.jsonl",
        [{"q": "What is 0 + 1?", "a": 1}, {"q": "What is 9 + 1?", "a": "10"}],
    )
    fields = ["benchmark=custom", "benchmark.question_key=q", "benchmark.answer_key=a"]

    def tepo(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tepo_cli", *args, *fields]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    checked = tepo("eval", "model=reference", "benchmark.path=data")
    assert checked.returncode == 0, checked.stderr[-2000:]
    (summary,) = (tmp_path / "outputs" / "eval").rglob("summary.json")
    assert json.loads(summary.read_text())["accuracy"] == 1.0
    quick = ["model=tiny", "trainer.max_steps=1", "benchmark.max_new_tokens=8"]
    trained = tepo("train", *quick, "benchmark.path=data")
    assert trained.returncode == 0, trained.stderr[-2000:]
    (summary,) = (tmp_path / "outputs" / "train").rglob("summary.json")
    data = json.loads(summary.read_text())["data"]
    assert (data["train_problems"], data["eval_problems"], data["eval_trained_on_left_out"]) == (
        6,
        1,
        1,
    )
    one_file = tepo("train", *quick, "benchmark.path=data/train.jsonl")
    assert one_file.returncode == 2
    assert "every problem of the held-out split 'test'" in one_file.stderr
    assert "trainer.eval_every=0. Nothing was run." in one_file.stderr


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    right = solution_str.strip().endswith(ground_truth)
    return {"score": 2.0 if right else -1.0, "acc": right, "source": data_source, "i": extra_info["index"]}


def bare(solution_str, ground_truth):
    return float(solution_str.strip() == ground_truth)
"""


def test_a_verl_reward_function_grades_verl_records_as_verl_calls_it(tmp_path):
    records = [
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{n} + 1?"}],
         "reward_model": {"ground_truth": str(n + 1)}, "extra_info": {"index": n}}
        for n in range(2)
    ]  # fmt: skip
    write_jsonl(tmp_path / "test.jsonl", records)
    benchmark = custom(
        tmp_path / "test.jsonl", question_key="prompt", answer_key="reward_model.ground_truth"
    )
    first, second = build_task(benchmark).eval_problems()
    assert first.extra["fields"]["extra_info"] == {"index": 0}  # every column kept
    (tmp_path / "verl_reward.py").write_text(VERL_REWARD)
    path = str(tmp_path / "verl_reward.py")
    reward = build_reward(
        RewardConfig(name="custom", path=path, function="compute_score"), benchmark
    )
    right, wrong = reward("so it is 1", first), reward("so it is 3", second)
    assert (right.reward, right.correct, wrong.reward, wrong.correct) == (2.0, True, -1.0, False)
    bare = build_reward(RewardConfig(name="custom", path=path, function="bare"), benchmark)
    assert [bare("2", second).reward, bare("2 ", first).reward] == [1.0, 0.0]
    # tepo's own signature is called as before: (completion, problem)
    (tmp_path / "own.py").write_text(
        "def score(completion, problem):\n    return problem.answer in completion\n"
    )
    own = build_reward(
        RewardConfig(name="custom", path=str(tmp_path / "own.py"), function="score"), benchmark
    )
    assert own("1", first).correct and not own("1", second).correct
