"""A benchmark owns its knobs: `Benchmark.options` is the model that validates the `benchmark`
group's keys beyond the shared ones, so a plugin benchmark can have knobs of its own, checked at
start like the built-ins' (arith's `digits`, word_math's `steps`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from pydantic import Field

from tepo_cli import benchmarks
from tepo_cli.benchmarks import Benchmark, build_task, check_benchmark, register_benchmark
from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.config.strict import Strict
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem

AUTO = RewardConfig(name="auto")


class CountingOptions(Strict):
    start: int = Field(default=1, ge=0)
    held_out: int = Field(default=3, ge=1)


class CountingTask:
    """'What comes after N?' for N from `start`: the first `held_out` held out."""

    def __init__(self, benchmark: BenchmarkConfig) -> None:
        self.options = benchmark.own(CountingOptions)

    def _problem(self, n: int) -> Problem:
        return Problem(str(n), f"{n}+1", str(n + 1))

    def eval_problems(self, limit: int | None = None) -> list[Problem]:
        first = self.options.start
        return [self._problem(n) for n in range(first, first + self.options.held_out)][:limit]

    def train_stream(self, seed: int) -> Iterator[Problem]:
        return map(self._problem, itertools.count(self.options.start + self.options.held_out))


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmarks._BENCHMARKS, "_registered", {})  # this test's plugin only
    register_benchmark(
        Benchmark("counting", grader="arith", task=CountingTask, options=CountingOptions)
    )


def test_a_plugin_benchmark_reads_its_own_knobs(counting: None) -> None:
    chosen = BenchmarkConfig(name="counting", start=10, held_out=2)
    check_benchmark(chosen, AUTO)
    task = build_task(chosen)
    assert [p.answer for p in task.eval_problems()] == ["11", "12"]
    assert next(iter(task.train_stream(0))).question == "12+1"
    defaults = build_task(BenchmarkConfig(name="counting"))  # the model's defaults
    assert [p.question for p in defaults.eval_problems()] == ["1+1", "2+1", "3+1"]


def test_its_knobs_are_checked_at_start_naming_the_key(counting: None) -> None:
    with pytest.raises(ConfigError) as caught:
        check_benchmark(BenchmarkConfig(name="counting", held_out=0), AUTO)
    assert str(caught.value) == "benchmark.held_out: input should be greater than or equal to 1."
    with pytest.raises(ConfigError) as caught:
        check_benchmark(BenchmarkConfig(name="counting", digits=2), AUTO)
    assert str(caught.value).startswith(
        "benchmark.digits: benchmark=counting has no such knob (its own: start, held_out; "
        "shared: name, split,"
    )


def test_a_benchmark_without_knobs_refuses_any(counting: None) -> None:
    check_benchmark(BenchmarkConfig(name="gsm8k"), AUTO)
    with pytest.raises(
        ConfigError, match=r"^benchmark\.start: benchmark=gsm8k has no knobs of its"
    ):
        check_benchmark(BenchmarkConfig(name="gsm8k", start=1), AUTO)
