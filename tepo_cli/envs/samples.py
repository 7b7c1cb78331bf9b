"""What a sampler returns: the types every caller reads, so none of them asks which kind of
sampler it holds (envs/sampler.py chooses it once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tepo_cli.core.records import RewardResult
from tepo_cli.core.rollout_record import Rollout


@dataclass
class Samples:
    """A training round's rows, laid out problem by problem, `sampling.n` rows each."""

    rollout: Rollout
    # The environments' grades; None where the reward grades the texts (train/grading.py), so
    # grading stays a stage of its own with its own clock.
    results: list[RewardResult] | None
    records: list[dict[str, Any]]  # per row, what its samples.jsonl row adds ({} for an answer)
    sums: dict[str, float]  # the round's metric sums (none for answers)
    # The environments' errors, one line each; None where there is no environment to fail, so
    # nothing is gathered across ranks.
    errors: list[str] | None


@dataclass
class HeldOut:
    """One rank's held-out evaluation: greedy, one sample per problem."""

    solved: float  # problems graded correct (the padding's not counted)
    problems: int
    answers: list[dict[str, Any]]  # graded answers for eval_samples.jsonl (none from episodes)
    errors: list[str] | None  # as `Samples.errors`
    seconds: float
