"""What a run carries from step to step, typed: what a checkpoint saves and a resume restores.

`TrainerState` is the run's own (one copy, written by rank 0 as JSON); `RankState` is each rank's
(random-number states and the refill stream's position, written per rank with torch.save).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainerState:
    """The run's progress: the last finished step and what was built up to it."""

    step: int = 0
    stream_drawn: int = 0  # prompts drawn from the shared training stream
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json so far
    step_seconds: list[float] = field(default_factory=list)
    bad_steps_in_row: int = 0  # optimizer steps skipped in a row for a non-finite loss/gradient
    logs: dict[str, int] = field(default_factory=dict)  # byte length of each log at the step
    # The adaptive KL-in-reward coefficient for the next step (None: algo.kl_reward_coef's)
    kl_reward_coef: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> TrainerState:
        return cls(**saved)


@dataclass
class RankState:
    """One rank's random state and refill-stream position."""

    rng: dict[str, Any] = field(default_factory=dict)  # rng_and_streams.capture_rng
    refill_drawn: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"rng": self.rng, "refill_drawn": self.refill_drawn}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> RankState:
        return cls(saved["rng"], saved.get("refill_drawn", 0))
