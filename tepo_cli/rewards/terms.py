"""Reward terms (`reward.terms`): functions of yours whose weighted values are added to the
grader's reward in training, as TRL adds its several reward functions: a format bonus, a length
cost, a partial credit. The grader alone still says whether an answer is right (the accuracy,
dynamic sampling's filter, every held-out evaluation and `tepo eval`); the terms shape only the
reward the advantages are computed from. User code, trusted, as `reward=custom`'s."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.errors import RunError
from tepo_cli.core.records import Problem
from tepo_cli.rewards.custom import as_scorer, load_user_function


@dataclass(frozen=True)
class RewardTerm:
    name: str
    weight: float
    function: Callable[[str, Problem], Any]
    where: str  # "reward.terms.<name> (<function> of <path>)", for the messages

    def values(self, completions: Sequence[str], problems: Sequence[Problem]) -> list[float]:
        """The unweighted value of each completion: a number, or a bool as 1 or 0."""
        return [self._value(c, p) for c, p in zip(completions, problems, strict=True)]

    def _value(self, completion: str, problem: Problem) -> float:
        value = self.function(completion, problem)
        number = float(value) if isinstance(value, bool | int | float) else math.nan
        if math.isfinite(number):
            return number
        raise RunError(
            f"{self.where} returned {value!r} ({type(value).__name__}) for a completion of "
            f"problem {problem.id}; a reward term returns a finite number or a bool."
        )


def load_terms(cfg: RewardConfig) -> tuple[RewardTerm, ...]:
    """`reward.terms`, each function imported from its file (a missing one is refused by name)."""
    return tuple(
        RewardTerm(
            name,
            term.weight,
            as_scorer(load_user_function(term.path, term.function, f"reward.terms.{name}")),
            f"reward.terms.{name} ({term.function} of {term.path})",
        )
        for name, term in sorted(cfg.terms.items())
    )
