"""The records every stage passes on: a `Problem` (what a task hands the trainer and the
evaluator) and a `RewardResult` (what a grader says about one completion)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One task instance: `question` fills the prompt template; `answer` is the reference.

    `extra` holds what a benchmark's grader needs beyond the answer (e.g. a code problem's tests
    and entry point, a maths problem's full solution).
    """

    id: str
    question: str
    answer: str
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RewardResult:
    """One completion graded: the reward it earns, whether it is right, and the answer the
    grader read from it (None when it found none)."""

    reward: float
    correct: bool
    extracted: str | None
