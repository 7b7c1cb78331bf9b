"""The run's hooks: what a training run tells the outside at its named points.

Built once per run (`train/train_job.py`) and passed down the recipe, so a point deep in the step
needs neither a global nor a step argument: the loop says which step runs (`enter_step`), the
points ask the object. This base does nothing, a normal run; `runtime/faults.py`'s
`FaultInjection` (TEPO_FAULT) is the one other implementation, for the tests that prove nothing
is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class RunHooks:
    """Every point passes; `step` is the step the loop is in (0 before the first)."""

    def __init__(self) -> None:
        self.step = 0

    def enter_step(self, step: int) -> None:
        """The loop (or MPO's warm-up, counting its own steps from 1) says which step runs."""
        self.step = step

    def reached(self, point: str) -> None:
        """The step reached a named point (`faults.KILL_POINTS`)."""

    def hold(self, stop_signal: Callable[[], int]) -> None:
        """At the start of a step, before any collective; `stop_signal()` is non-zero once a stop
        signal arrived."""

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss just before its backward."""
        return loss


NO_HOOKS = RunHooks()  # the default where a function only passes points (it never enters a step)
