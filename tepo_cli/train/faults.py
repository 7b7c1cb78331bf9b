"""Fault injection at named points of the loop, for the tests that prove nothing is lost.

`TEPO_FAULT` holds comma-separated `point:step` entries; a step may be a range `a-b`.
  kill points (the process SIGKILLs itself there, as `kill -9` would):
    rollout     after the step's completions are generated, before they are scored
    update      after the first backward of the step, before the optimizer steps
    checkpoint  after the engine state is written to the staging directory, before it is sealed
    warmup      after an optimizer step of the MTP warm-up (its step numbers count from 1)
  nan_loss      the step's loss is multiplied by NaN (a numeric blow-up, skipped by the guard)
Unset in normal use; reading it costs one dictionary lookup per point.
"""

from __future__ import annotations

import os
import signal

KILL_POINTS = ("rollout", "update", "checkpoint", "warmup")
_current_step = 0


def enter_step(step: int) -> None:
    """The loop says which step runs, so points deep inside it need no step argument."""
    global _current_step
    _current_step = step


def _entries() -> list[tuple[str, int, int]]:
    entries = []
    for item in filter(None, os.environ.get("TEPO_FAULT", "").split(",")):
        point, _, steps = item.partition(":")
        first, _, last = steps.partition("-")
        entries.append((point.strip(), int(first), int(last or first)))
    return entries


def armed(point: str) -> bool:
    step = _current_step
    return any(name == point and first <= step <= last for name, first, last in _entries())


def maybe_kill(point: str) -> None:
    if armed(point):
        os.kill(os.getpid(), signal.SIGKILL)
