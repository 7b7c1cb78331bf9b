"""GSM8K (Cobbe et al., 2021): grade-school word problems; the answer is the solution's text after
its ``#### `` as lm-eval compares it (commas, ``$`` and a trailing period removed), the full
solution is kept for `model=reference`."""

from __future__ import annotations

from tepo_cli.benchmarks import Benchmark
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import DataError, Record, required_field
from tepo_cli.rewards.gsm8k_grader import reference_answer


def to_problem(record: Record, index: int, default_id: str) -> Problem:
    solution = str(required_field("gsm8k", record, index, "answer"))
    try:
        answer = reference_answer(solution)
    except ValueError:
        raise DataError(f"gsm8k record {index}: its answer has no '#### <number>' line.") from None
    question = str(required_field("gsm8k", record, index, "question"))
    return Problem(str(record.get("id", default_id)), question, answer, {"solution": solution})


def worked_solution(problem: Problem) -> str:
    """The worked solution, ending in its answer."""
    return str(problem.extra["solution"])


BENCHMARK = Benchmark(
    "gsm8k",
    grader="gsm8k",
    to_problem=to_problem,
    reference=worked_solution,
    hub_id="openai/gsm8k:main",
)
