"""The run's started trackers as one: what `Run` calls (rank 0 holds them, other ranks an empty
group). A tracker that fails while logging is switched off with one warning, and the run and the
other trackers go on: metrics.jsonl, written first, has every step."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tepo_cli.core.errors import StopRequested
from tepo_cli.trackers.tracker import HELD_OUT_ACCURACY, Outcome, Tracker, numeric


class Trackers:
    def __init__(self, started: dict[str, Tracker] | None = None) -> None:
        self._started = dict(started or {})

    @property
    def names(self) -> list[str]:
        return list(self._started)

    def add(self, name: str, tracker: Tracker) -> None:
        self._started[name] = tracker

    def log_step(self, record: dict[str, Any]) -> None:
        """Every number of a step's metrics record, at its step (nothing to do without trackers)."""
        if self._started:
            self._log(int(record["step"]), numeric(record))

    def log_held_out(self, step: int, accuracy: float) -> None:
        """A held-out evaluation's accuracy, at the step it was measured after (0: before)."""
        self._log(step, {HELD_OUT_ACCURACY: accuracy})

    def close(self, outcome: Outcome) -> None:
        for name, tracker in list(self._started.items()):
            self._guarded(name, "closing", lambda t=tracker: t.close(outcome))
        self._started.clear()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close(_outcome(error))

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        for name, tracker in list(self._started.items()):
            if not self._guarded(name, f"at step {step}", lambda t=tracker: t.log(step, scalars)):
                del self._started[name]

    @staticmethod
    def _guarded(name: str, when: str, call: Callable[[], None]) -> bool:
        try:
            call()
        except Exception as error:
            print(
                f"tepo train: warning: logger {name} failed {when} ({type(error).__name__}: "
                f"{error}); it is switched off for the rest of this run, metrics.jsonl has "
                f"every step.",
                file=sys.stderr,
            )
            return False
        return True


def _outcome(error: BaseException | None) -> Outcome:
    if error is None:
        return "finished"
    if isinstance(error, (StopRequested, KeyboardInterrupt)):
        return "interrupted"
    return "failed"
