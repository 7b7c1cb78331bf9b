"""HumanEval (Chen et al., 2021): complete a Python function from its signature and docstring;
graded by running the problem's tests in the sandbox. The reference is the canonical body."""

from __future__ import annotations

from tepo_cli.benchmarks import Benchmark
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import Record, required_field
from tepo_cli.rewards.code import CodeProblem


def to_problem(record: Record, index: int, default_id: str) -> Problem:
    """prompt -> question; canonical_solution -> answer; extra: prompt, test, entry_point,
    task_id (what the code grader reads)."""
    for key in ("prompt", "test", "entry_point"):
        required_field("humaneval", record, index, key)
    code = CodeProblem.from_record(record)
    extra = {
        "prompt": code.prompt,
        "test": code.test,
        "entry_point": code.entry_point,
        "task_id": code.task_id,
    }
    canonical = str(required_field("humaneval", record, index, "canonical_solution"))
    return Problem(code.task_id or default_id, code.prompt, canonical, extra)


BENCHMARK = Benchmark(
    "humaneval", grader="code", to_problem=to_problem, hub_id="openai/openai_humaneval"
)
