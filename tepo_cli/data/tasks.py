"""A benchmark as the loop sees it: held-out problems to score, and a stream to train on."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Protocol

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.arith import ArithTask


class Task(Protocol):
    def eval_problems(self, limit: int | None = None) -> list[Problem]: ...

    def train_stream(self, seed: int) -> Iterator[Problem]: ...


class DatasetTask:
    """A dataset benchmark: `split` is scored, `train_split` is trained on (loaded on first use)."""

    def __init__(self, cfg: BenchmarkConfig) -> None:
        self.cfg = cfg
        self._train: list[Problem] | None = None

    def _train_problems(self) -> list[Problem]:
        if self._train is None:
            from tepo_cli.data.benchmarks import load_problems

            cfg = self.cfg
            self._train = load_problems(cfg.name, cfg.train_split, cfg.path, cfg.hub_id)
        return self._train

    def eval_problems(self, limit: int | None = None) -> list[Problem]:
        from tepo_cli.data.benchmarks import load_problems

        cfg = self.cfg
        return load_problems(cfg.name, cfg.split, cfg.path, cfg.hub_id, limit)

    def check_training(self) -> None:
        """Before any model loads: refuse a test split unless forced, and read the training split
        (a malformed record stops the run here, naming it, rather than after minutes of setup)."""
        from tepo_cli.data.benchmarks import check_split_for_training

        check_split_for_training(self.cfg.name, self.cfg.train_split, self.cfg.allow_test_split)
        self._train_problems()

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """Epochs over the training split, each in a fresh seeded order."""
        problems = self._train_problems()
        rng = random.Random(f"train:{seed}")
        while True:
            order = list(range(len(problems)))
            rng.shuffle(order)
            for index in order:
                yield problems[index]


def build_task(cfg: BenchmarkConfig) -> ArithTask | DatasetTask:
    return ArithTask(cfg) if cfg.name == "arith" else DatasetTask(cfg)
