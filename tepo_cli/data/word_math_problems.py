"""The generated chain-of-thought task: multi-step arithmetic word problems
(tepo_cli/data/word_problems.py tells them), no download needed.

Like `arith`, the held-out split is a fixed, seeded list of distinct problems, and the training
stream draws only problems whose question text is not in it, so evaluation never sees a training
problem whatever the run's seed. Unlike `arith` the space is too large to enumerate, so the
check that enough problems exist is made by drawing: at most half of the distinct problems seen
may be held out.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.config.strict import Strict
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.word_problems import Settings, WordProblem, draw_problem

# (key, its least low end, why)
_RANGES = (
    ("start_range", 1, "a story about 0 objects has nothing to count"),
    ("operand_range", 1, "adding or taking away 0 is no step"),
    ("factor_range", 2, "multiplying or dividing by 1 is no step"),
)
_DRAWS_PER_PROBLEM = 20  # draws allowed per distinct problem wanted before the space is "too small"


WordOp = Literal["add", "sub", "mul", "div"]
StepCount = Annotated[int, Field(ge=1, le=6)]
NumberRange = tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]


class WordMathOptions(Strict):
    """word_math's own knobs (benchmark.<key>, conf/benchmark/word_math.yaml says what each does);
    `settings` checks how their values fit together."""

    steps: list[StepCount] = Field(default_factory=lambda: [1, 2, 3, 4], min_length=1)
    step_weights: list[Annotated[float, Field(ge=0.0)]] = Field(
        default_factory=lambda: [0.4, 0.3, 0.2, 0.1], min_length=1
    )
    step_ops: list[WordOp] = Field(
        default_factory=lambda: ["add", "sub", "mul", "div"], min_length=1
    )
    start_range: NumberRange = (2, 12)
    operand_range: NumberRange = (1, 6)
    factor_range: NumberRange = (2, 3)
    max_value: int = Field(default=60, ge=1)
    eval_size: int = Field(default=100, ge=1)
    eval_seed: int = 1234


def settings(cfg: WordMathOptions) -> Settings:
    """The generator's settings, or a ConfigError naming the key whose value does not fit."""
    if len(cfg.step_weights) != len(cfg.steps):
        raise ConfigError(
            f"benchmark.step_weights={cfg.step_weights} must give one weight per entry of "
            f"benchmark.steps={cfg.steps} ({len(cfg.steps)} weights)."
        )
    if not any(cfg.step_weights):
        raise ConfigError(
            f"benchmark.step_weights={cfg.step_weights} are all 0: give at least one step count "
            f"of benchmark.steps a positive weight."
        )
    for key, least, why in _RANGES:
        low, high = getattr(cfg, key)
        if low > high:
            raise ConfigError(
                f"benchmark.{key}=[{low}, {high}] must be [low, high] with low <= high."
            )
        if low < least:
            raise ConfigError(
                f"benchmark.{key}=[{low}, {high}] must start at {least} or more: {why}."
            )
    if cfg.start_range[1] > cfg.max_value:
        raise ConfigError(
            f"benchmark.start_range={list(cfg.start_range)} goes past benchmark.max_value="
            f"{cfg.max_value}, the largest number a problem may hold at any step."
        )
    return Settings(
        steps=tuple(cfg.steps),
        step_weights=tuple(cfg.step_weights),
        step_ops=tuple(dict.fromkeys(cfg.step_ops)),
        start_range=cfg.start_range,
        operand_range=cfg.operand_range,
        factor_range=cfg.factor_range,
        max_value=cfg.max_value,
    )


def to_problem(drawn: WordProblem, problem_id: str) -> Problem:
    """A Problem whose `extra` keeps the structure (tests recompute the answer from it) and the
    worked solution (`model=reference`, MPO's warm-up on `solutions`)."""
    return Problem(
        id=problem_id,
        question=drawn.question,
        answer=str(drawn.answer),
        extra={
            "start": drawn.start,
            "steps": [list(step) for step in drawn.steps],
            "solution": drawn.solution,
        },
    )


class WordMathTask:
    def __init__(self, benchmark: BenchmarkConfig) -> None:
        self.name = benchmark.name
        self.cfg = benchmark.own(WordMathOptions)
        self.settings = settings(self.cfg)
        self._eval = self._sample_eval()
        self._eval_keys = {p.question for p in self._eval}

    def eval_problems(self, limit: int | None = None) -> list[Problem]:
        return self._eval[:limit] if limit else list(self._eval)

    def describe_data(self) -> dict[str, Any]:
        """What `tepo train` trains and evaluates on (summary.json's `data`)."""
        return {
            "benchmark": self.name,
            "train_split": "generated",
            "train_from": "generated word problems, never a held-out question",
            "eval_split": "held-out",
            "eval_from": f"{len(self._eval)} generated problems, seed {self.cfg.eval_seed}",
        }

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """An endless stream of training problems, never one of the held-out questions."""
        rng = random.Random(f"train:{seed}")
        while True:
            drawn = draw_problem(rng, self.settings)
            if drawn.question not in self._eval_keys:
                digest = hashlib.sha1(drawn.question.encode()).hexdigest()[:12]
                yield to_problem(drawn, f"word_math/train/{digest}")

    def _sample_eval(self) -> list[Problem]:
        """The first `eval_size` distinct problems of the eval seed's stream; drawing goes on to
        twice that many, so that at least as many remain to train on."""
        rng = random.Random(f"eval:{self.cfg.eval_seed}")
        wanted = 2 * self.cfg.eval_size
        seen: dict[str, WordProblem] = {}
        draws = 0
        while len(seen) < wanted:
            if draws == _DRAWS_PER_PROBLEM * wanted:
                raise ConfigError(
                    f"benchmark.eval_size={self.cfg.eval_size} leaves too few training problems: "
                    f"{draws} draws gave only {len(seen)} distinct word problems, and at most "
                    f"half may be held out. Widen benchmark.start_range, operand_range or "
                    f"factor_range, raise benchmark.max_value, add benchmark.steps or "
                    f"benchmark.step_ops, or lower benchmark.eval_size."
                )
            drawn = self._draw_or_refuse(rng)
            seen.setdefault(drawn.question, drawn)
            draws += 1
        held_out = list(seen.values())[: self.cfg.eval_size]
        return [to_problem(p, f"word_math/held-out/{i}") for i, p in enumerate(held_out)]

    def _draw_or_refuse(self, rng: random.Random) -> WordProblem:
        try:
            return draw_problem(rng, self.settings)
        except ValueError as error:  # no walk of that many steps fits the ranges
            raise ConfigError(
                f"benchmark.steps={self.cfg.steps} with benchmark.step_ops={self.cfg.step_ops} "
                f"cannot be drawn within benchmark.max_value={self.cfg.max_value} and these "
                f"ranges ({error}). Widen benchmark.operand_range / factor_range, raise "
                f"benchmark.max_value or add operations to benchmark.step_ops."
            ) from None
