"""Benchmarks by name: the one place that says what a benchmark is.

A benchmark is one module in this package (or in a plugin file, `plugins=[...]`) that defines
`BENCHMARK` (or a list, `BENCHMARKS`) of `Benchmark`: its name, how one of its records becomes a
`Problem`, its grader (`reward=auto`), its reference completion (`model=reference`) and its hub
dataset; plus one YAML in conf/benchmark/ with its prompt template and answer length. A plugin
file registers its own with `register_benchmark`. Nothing else lists the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType

from pydantic import BaseModel

from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.core.discovery import Registry
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import Record, load_records
from tepo_cli.data.prepare import prepared_splits
from tepo_cli.data.tasks import DatasetTask, Task
from tepo_cli.rewards import Reward, get_grader, make_reward

__all__ = ["Benchmark", "benchmarks", "build_reward", "build_task", "get_benchmark"]

# (record, index, default id) -> Problem
ToProblem = Callable[[Record, int, str], Problem]


def _answer(problem: Problem) -> str:
    return problem.answer


@dataclass(frozen=True)
class Benchmark:
    """What tepo needs to know about a benchmark (its prompt template is conf/benchmark/'s)."""

    name: str
    grader: str  # the grader `reward=auto` scores it with (a GRADER of tepo_cli/rewards/)
    to_problem: ToProblem | None = None  # a dataset record -> Problem; None: generated (arith)
    reference: Callable[[Problem], str] = _answer  # the completion `model=reference` answers with
    hub_id: str | None = None  # the hub dataset of its splits (`owner/name[:config,...]`)
    task: Callable[[BenchmarkConfig], Task] | None = None  # a generated benchmark's own task
    # its own knobs (benchmark.<key> beyond BenchmarkConfig's shared ones): the model that
    # validates them (BenchmarkConfig.own); None: it has none
    options: type[BaseModel] | None = None


def _defined(module: ModuleType) -> list[Benchmark]:
    own = getattr(module, "BENCHMARKS", [getattr(module, "BENCHMARK", None)])
    return [b for b in own if isinstance(b, Benchmark)]


_BENCHMARKS = Registry(
    __name__,
    _defined,
    lambda benchmark: benchmark.name,
    "benchmark={name} is not a benchmark; the benchmarks are: {known}. A benchmark is a module of "
    "tepo_cli/benchmarks/ defining BENCHMARK (or register_benchmark(...) in a file listed in "
    "plugins=[...]) plus conf/benchmark/{name}.yaml.",
)
register_benchmark = _BENCHMARKS.register  # add one from a plugin file
benchmarks = _BENCHMARKS.all  # every benchmark by name: this package's, then the registered
get_benchmark = _BENCHMARKS.get


def check_benchmark(benchmark: BenchmarkConfig, reward: RewardConfig) -> None:
    """Before any model loads: the benchmark and the grader exist (after the plugins' import),
    and the benchmark's own knobs validate."""
    benchmark.check_own(get_benchmark(benchmark.name).options)
    if reward.name != "auto":
        get_grader(reward.name)


def load_problems(
    name: str,
    split: str = "test",
    path: str | None = None,
    hub_id: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """The problems of a dataset benchmark's `split` (data/benchmark_records.py says where from)."""
    benchmark = get_benchmark(name)
    if benchmark.to_problem is None:
        raise ConfigError(f"benchmark={name} is generated, not read from records")
    prepared = prepared_splits(name)
    records = load_records(name, split, path, hub_id, benchmark.hub_id, prepared, limit)
    to_problem = benchmark.to_problem
    return [to_problem(r, i, f"{name}/{split}/{i}") for i, r in enumerate(records)]


def build_task(cfg: BenchmarkConfig) -> Task:
    """The benchmark's held-out problems and training stream."""
    benchmark = get_benchmark(cfg.name)
    if benchmark.task is not None:
        return benchmark.task(cfg)
    load = partial(_load_split, cfg)
    return DatasetTask(cfg, load, cfg.hub_id or benchmark.hub_id)


def _load_split(cfg: BenchmarkConfig, split: str, limit: int | None) -> list[Problem]:
    return load_problems(cfg.name, split, cfg.path, cfg.hub_id, limit)


def build_reward(cfg: RewardConfig, benchmark: BenchmarkConfig) -> Reward:
    """The reward group's grader; `reward=auto`: the benchmark's own."""
    name = get_benchmark(benchmark.name).grader if cfg.name == "auto" else cfg.name
    return make_reward(cfg, name)
