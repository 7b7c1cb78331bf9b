"""A benchmark as the loop sees it: held-out problems to score, and a stream to train on."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Protocol

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.records import check_split_for_training

# (split, limit) -> the split's first `limit` problems (all of them with None)
Loader = Callable[[str, int | None], list[Problem]]


class Task(Protocol):
    def eval_problems(self, limit: int | None = None) -> list[Problem]: ...

    def train_stream(self, seed: int) -> Iterator[Problem]: ...


class DatasetTask:
    """A dataset benchmark: `split` is scored, `train_split` is trained on (loaded on first use)."""

    def __init__(self, cfg: BenchmarkConfig, load: Loader, hub_id: str | None = None) -> None:
        self.cfg = cfg
        self._load = load
        self._hub_id = hub_id
        self._train: list[Problem] | None = None

    def _train_problems(self) -> list[Problem]:
        if self._train is None:
            self._train = self._load(self.cfg.train_split, None)
        return self._train

    def eval_problems(self, limit: int | None = None) -> list[Problem]:
        return self._load(self.cfg.split, limit)

    def check_training(self) -> None:
        """Before any model loads: refuse a test split unless forced, and read the training split
        (a malformed record stops the run here, naming it, rather than after minutes of setup)."""
        cfg = self.cfg
        check_split_for_training(cfg.name, cfg.train_split, self._hub_id, cfg.allow_test_split)
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
