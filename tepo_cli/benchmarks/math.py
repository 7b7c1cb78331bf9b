"""MATH (Hendrycks et al., 2021) and MATH-500 (its 500-problem test subset from PRM800K):
competition problems; the answer is the content of the solution's last ``\\boxed{}`` (the
dataset's `answer` field only when the solution has none), graded by math-verify."""

from __future__ import annotations

from functools import partial

from tepo_cli.benchmarks import Benchmark
from tepo_cli.benchmarks.gsm8k import worked_solution
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import DataError, Record, required_field
from tepo_cli.rewards.math_grader import last_boxed


def to_problem(name: str, record: Record, index: int, default_id: str) -> Problem:
    """extra: solution, level, subject (`type` [`subject`]), and math_id where the record has one."""
    solution = str(required_field(name, record, index, "solution"))
    answer = last_boxed(solution) or record.get("answer")
    if not answer:
        raise DataError(f"{name} record {index}: no \\boxed{{}} answer in its solution.")
    level = record.get("level")
    extra = {
        "solution": solution,
        "level": f"Level {level}" if isinstance(level, int) else level,
        "subject": record.get("type") or record.get("subject"),
    }
    if record.get("math_id"):
        extra["math_id"] = record["math_id"]
    problem_id = record.get("id") or record.get("unique_id") or default_id
    question = str(required_field(name, record, index, "problem"))
    return Problem(str(problem_id), question, str(answer), extra)


_SUBJECTS = "algebra,counting_and_probability,geometry,intermediate_algebra,number_theory"
BENCHMARKS = [
    Benchmark(
        "math",
        grader="math",
        to_problem=partial(to_problem, "math"),
        reference=worked_solution,
        hub_id=f"EleutherAI/hendrycks_math:{_SUBJECTS},prealgebra,precalculus",
    ),
    Benchmark(
        "math500",
        grader="math",
        to_problem=partial(to_problem, "math500"),
        reference=worked_solution,
        hub_id="HuggingFaceH4/MATH-500",
    ),
]
