"""A benchmark as the loop sees it: held-out problems to score, and a stream to train on."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import check_split_for_training, records_origin
from tepo_cli.data.derived_splits import DERIVED
from tepo_cli.data.prepare import prepared_file, prepared_splits

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
        # Set by check_training (a training run): the held-out evaluation leaves these out
        self._trained_on: frozenset[str] = frozenset()

    def _train_problems(self) -> list[Problem]:
        if self._train is None:
            self._train = self._load(self.cfg.train_split, None)
        return self._train

    def eval_problems(self, limit: int | None = None) -> list[Problem]:
        """`split`'s problems; in a training run, without those the run trains on."""
        if not self._trained_on:
            return self._load(self.cfg.split, limit)
        kept = [p for p in self._load(self.cfg.split, None) if p.id not in self._trained_on]
        return kept[:limit] if limit is not None else kept

    def check_training(self) -> None:
        """Before any model loads: refuse a test split unless forced, and read the training split
        (a malformed record stops the run here, naming it, rather than after minutes of setup).
        From here on the held-out problems exclude the training problems: a held-out accuracy
        over problems the run trains on would not be held out (MBPP's offline `train` is cut
        from its test split: data/derived_splits.py)."""
        cfg = self.cfg
        check_split_for_training(cfg.name, cfg.train_split, self._hub_id, cfg.allow_test_split)
        self._trained_on = frozenset(p.id for p in self._train_problems())

    def origin(self, split: str) -> str:
        """Where `split`'s records come from, in words (records.load_records decides the same)."""
        cfg = self.cfg
        prepared = prepared_splits(cfg.name)
        origin, where = records_origin(split, cfg.path, cfg.hub_id, self._hub_id, prepared)
        if origin == "prepared" and split in DERIVED.get(cfg.name, {}):
            cut = DERIVED[cfg.name][split]
            where = prepared_file(cfg.name, cut.parent)
            return f"prepared offline: {where}, {cut.key} {cut.first}-{cut.last}"
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
            **self._left_out(),
        }

    def _left_out(self) -> dict[str, int]:
        """How many of `split`'s problems the held-out evaluation leaves out because the run
        trains on them; read only where `split` is on this machine (never the hub's)."""
        prepared = prepared_splits(self.cfg.name)
        origin, _ = records_origin(self.cfg.split, self.cfg.path, self.cfg.hub_id, None, prepared)
        if not self._trained_on or origin == "none" or origin == "hub":
            return {}
        every, kept = len(self._load(self.cfg.split, None)), len(self.eval_problems())
        return (
            {"eval_problems": kept, "eval_trained_on_left_out": every - kept}
            if kept < every
            else {}
        )

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """Epochs over the training split, each in a fresh seeded order."""
        problems = self._train_problems()
        rng = random.Random(f"train:{seed}")
        while True:
            order = list(range(len(problems)))
            rng.shuffle(order)
            for index in order:
                yield problems[index]
