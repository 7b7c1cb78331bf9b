"""The embedded task: generated arithmetic problems ("What is 7*8?"), no download needed.

The held-out split is a fixed, seeded sample of distinct problems; the training stream draws
only problems outside it, so evaluation never sees a training problem whatever the run's seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.config.strict import Strict
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithOptions(Strict):
    """arith's own knobs (benchmark.<key>, conf/benchmark/arith.yaml says what each does)."""

    operations: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+"], min_length=1)
    digits: int = Field(default=1, ge=1, le=6)
    eval_size: int = Field(default=100, ge=1)
    eval_seed: int = 1234


class ArithTask:
    def __init__(self, benchmark: BenchmarkConfig) -> None:
        self.name = benchmark.name
        self.cfg = cfg = benchmark.own(ArithOptions)
        self.operand_count = 10**cfg.digits
        self.space = len(cfg.operations) * self.operand_count**2
        if cfg.eval_size * 2 > self.space:
            raise ConfigError(
                f"benchmark.eval_size={cfg.eval_size} leaves too few training problems: "
                f"{cfg.digits}-digit operands with operations {cfg.operations} give only "
                f"{self.space} distinct problems and at most half may be held out. Lower "
                f"benchmark.eval_size or raise benchmark.digits / add operations."
            )
        self._eval = self._sample_eval()
        self._eval_keys = {p.question for p in self._eval}

    def eval_problems(self, limit: int | None = None) -> list[Problem]:
        return self._eval[:limit] if limit else list(self._eval)

    def describe_data(self) -> dict[str, Any]:
        """What `tepo train` trains and evaluates on (summary.json's `data`)."""
        return {
            "benchmark": self.name,
            "train_split": "generated",
            "train_from": "generated, never a held-out problem",
            "train_problems": self.space - len(self._eval),
            "eval_split": "held-out",
            "eval_from": f"{len(self._eval)} generated problems, seed {self.cfg.eval_seed}",
        }

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """An endless stream of training problems, never one of the held-out ones."""
        rng = random.Random(f"train:{seed}")
        while True:
            problem = self._draw(rng)
            if problem.question not in self._eval_keys:
                yield problem

    def _sample_eval(self) -> list[Problem]:
        rng = random.Random(f"eval:{self.cfg.eval_seed}")
        if self.space <= 100_000:
            codes = rng.sample(range(self.space), self.cfg.eval_size)
            return [self._decode(code) for code in codes]
        seen: dict[str, Problem] = {}
        while len(seen) < self.cfg.eval_size:
            problem = self._draw(rng)
            seen.setdefault(problem.question, problem)
        return list(seen.values())

    def _draw(self, rng: random.Random) -> Problem:
        return self._decode(rng.randrange(self.space))

    def _decode(self, code: int) -> Problem:
        code, b = divmod(code, self.operand_count)
        op_index, a = divmod(code, self.operand_count)
        op = self.cfg.operations[op_index]
        question = f"{a}{op}{b}"
        return Problem(id=question, question=question, answer=str(_APPLY[op](a, b)))
