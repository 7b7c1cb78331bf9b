"""Fault injection at named points of the loop, for the tests that prove nothing is lost.

`TEPO_FAULT` holds comma-separated `point:step` entries; a step may be a range `a-b`.
  kill points (the process SIGKILLs itself there, as `kill -9` would):
    rollout     after the step's completions are generated, before they are scored
    episode     in a multi-turn step, after a turn is sampled, before the environment answers
    update      after the first backward of the step, before the optimizer steps
    checkpoint  after the engine state is written to the staging directory, before it is sealed
    warmup      after an optimizer step of the MTP warm-up (its step numbers count from 1)
  nan_loss      the step's loss is multiplied by NaN (a numeric blow-up, skipped by the guard)
  hang          the rank stops at the start of the step, in no collective, until a stop signal
                ends it (the other ranks' next collective waits: trainer.collective_timeout_s)
An entry may name one rank, `point:step@rank` (e.g. `hang:1@1`); without it, every rank.
Unset in normal use; reading it costs one dictionary lookup per point.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

KILL_POINTS = ("rollout", "episode", "update", "checkpoint", "warmup")
_current_step = 0


def enter_step(step: int) -> None:
    """The loop says which step runs, so points deep inside it need no step argument."""
    global _current_step
    _current_step = step


def current_step() -> int:
    """The step the loop is in (0 before the first)."""
    return _current_step


def _entries() -> list[tuple[str, int, int, int | None]]:
    entries = []
    for item in filter(None, os.environ.get("TEPO_FAULT", "").split(",")):
        point, _, where = item.partition(":")
        steps, _, rank = where.partition("@")
        first, _, last = steps.partition("-")
        entries.append((point.strip(), int(first), int(last or first), int(rank) if rank else None))
    return entries


def armed(point: str) -> bool:
    step, me = _current_step, int(os.environ.get("RANK", "0"))
    return any(
        name == point and first <= step <= last and rank in (None, me)
        for name, first, last, rank in _entries()
    )


def maybe_kill(point: str) -> None:
    if armed(point):
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_hang(stop_signal: Callable[[], int]) -> None:
    """The `hang` point: wait forever, in no collective, until a stop signal arrives
    (`stop_signal()` non-zero), which ends the process as a stuck rank's end would."""
    if armed("hang"):
        rank = os.environ.get("RANK", "0")
        print(f"TEPO_FAULT: rank {rank} hangs at step {_current_step}", file=sys.stderr, flush=True)
    while armed("hang"):
        signum = stop_signal()
        if signum:
            os._exit(128 + signum)
        time.sleep(0.1)
