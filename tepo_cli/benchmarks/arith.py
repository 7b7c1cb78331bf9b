"""The embedded task: generated arithmetic problems (tepo_cli/data/arith_problems.py), no download needed;
graded by the last number of the completion."""

from __future__ import annotations

from tepo_cli.benchmarks import Benchmark
from tepo_cli.data.arith_problems import ArithOptions, ArithTask

BENCHMARK = Benchmark("arith", grader="arith", task=ArithTask, options=ArithOptions)
