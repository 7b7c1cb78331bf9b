"""Generated multi-step arithmetic word problems (tepo_cli/data/word_math_problems.py), no download needed;
graded by the number after the completion's last "The answer is" (tepo_cli/rewards/word_math_grader.py).

The reference completion is the generated worked solution, so `tepo eval model=reference
benchmark=word_math` checks generator and grader together (every problem must pass).
"""

from __future__ import annotations

from tepo_cli.benchmarks import Benchmark
from tepo_cli.core.records import Problem
from tepo_cli.data.word_math_problems import WordMathOptions, WordMathTask


def worked_solution(problem: Problem) -> str:
    return str(problem.extra["solution"])


BENCHMARK = Benchmark(
    "word_math",
    grader="word_math",
    reference=worked_solution,
    task=WordMathTask,
    options=WordMathOptions,
)
