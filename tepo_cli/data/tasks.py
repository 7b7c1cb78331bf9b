"""A benchmark as the loop sees it: held-out problems to score, and a stream to train on."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.prepare import prepared_file, prepared_splits
from tepo_cli.data.records import check_split_for_training, records_origin

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

    def origin(self, split: str) -> str:
        """Where `split`'s records come from, in words (records.load_records decides the same)."""
        cfg = self.cfg
        prepared = prepared_splits(cfg.name)
        origin, where = records_origin(split, cfg.path, cfg.hub_id, self._hub_id, prepared)
        if origin == "prepared":
            return f"prepared offline: {prepared_file(cfg.name, split)}"
        if origin == "hub":
            return f"the hub dataset {where} (needs network)"
        return f"local files: {where}" if origin == "local" else "nowhere (no data source)"

    def describe_data(self) -> dict[str, Any]:
        """What `tepo train` trains and evaluates on (summary.json's `data`)."""
        cfg = self.cfg
        return {
            "benchmark": cfg.name,
            "train_split": cfg.train_split,
            "train_from": self.origin(cfg.train_split),
            "train_problems": len(self._train_problems()),
            "eval_split": cfg.split,
            "eval_from": self.origin(cfg.split),
        }

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """Epochs over the training split, each in a fresh seeded order."""
        problems = self._train_problems()
        rng = random.Random(f"train:{seed}")
        while True:
            order = list(range(len(problems)))
            rng.shuffle(order)
            for index in order:
                yield problems[index]
