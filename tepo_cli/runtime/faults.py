"""Fault injection at named points of the loop (the run's hooks), for the tests that prove
nothing is lost.

`TEPO_FAULT` holds comma-separated `point:step` entries; a step may be a range `a-b`.
  kill points (the process SIGKILLs itself there, as `kill -9` would):
    rollout     after the step's completions are generated, before they are scored
    episode     in a multi-turn step, after a turn is sampled, before the environment answers
    update      after the first backward of the step, before the optimizer steps
    checkpoint  after the engine state is written to the staging directory, before it is sealed
    warmup      after an optimizer step of MPO's warm-up (its step numbers count from 1)
  nan_loss      the step's loss is multiplied by NaN (a numeric blow-up, skipped by the guard)
  hang          the rank stops at the start of the step, in no collective, until a stop signal
                ends it (the other ranks' next collective waits: trainer.collective_timeout_s)
An entry may name one rank, `point:step@rank` (e.g. `hang:1@1`); without it, every rank.
Read once per run (`from_env`) into the run's hooks (runtime/hooks.py); unset, a point costs
a method call that does nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tepo_cli.runtime.hooks import RunHooks

if TYPE_CHECKING:
    import torch

KILL_POINTS = ("rollout", "episode", "update", "checkpoint", "warmup")


def from_env() -> RunHooks:
    """This run's hooks: TEPO_FAULT's faults on this rank (RANK), or none."""
    spec = os.environ.get("TEPO_FAULT", "")
    return FaultInjection(spec, int(os.environ.get("RANK", "0"))) if spec else RunHooks()


class FaultInjection(RunHooks):
    """The run's hooks with the faults of a TEPO_FAULT value armed on rank `rank`."""

    def __init__(self, spec: str, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.entries: list[tuple[str, int, int, int | None]] = []
        for item in filter(None, spec.split(",")):
            point, _, where = item.partition(":")
            steps, _, on_rank = where.partition("@")
            first, _, last = steps.partition("-")
            rank_only = int(on_rank) if on_rank else None
            self.entries.append((point.strip(), int(first), int(last or first), rank_only))

    def armed(self, point: str) -> bool:
        return any(
            name == point and first <= self.step <= last and rank in (None, self.rank)
            for name, first, last, rank in self.entries
        )

    def reached(self, point: str) -> None:
        if self.armed(point):
            os.kill(os.getpid(), signal.SIGKILL)

    def hold(self, stop_signal: Callable[[], int]) -> None:
        """The `hang` point: wait forever, in no collective, until a stop signal arrives
        (`stop_signal()` non-zero), which ends the process as a stuck rank's end would."""
        if self.armed("hang"):
            print(
                f"TEPO_FAULT: rank {self.rank} hangs at step {self.step}",
                file=sys.stderr,
                flush=True,
            )
        while self.armed("hang"):
            signum = stop_signal()
            if signum:
                os._exit(128 + signum)
            time.sleep(0.1)

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * float("nan") if self.armed("nan_loss") else loss
