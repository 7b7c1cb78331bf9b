"""What every experiment tracker implements, and what they share: the numbers of a record, the
held-out key, and an identifier kept in the run directory so a resumed run continues the same
tracked run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from tepo_cli.core.atomic_write import write_text

# How a run ended, as status.json says it (core/run_status.py); a tracker marks its run so.
Outcome = Literal["finished", "failed", "interrupted"]

# Held-out greedy accuracy (eval.jsonl) is logged under this key, at the step it was measured.
HELD_OUT_ACCURACY = "held_out/accuracy"


class Tracker(Protocol):
    """One experiment tracker, fed on rank 0 only.

    `start` opens (or, when `resume` is a step, re-opens) the run's tracked run; `config` is the
    resolved config as one level of dotted keys plus `git_commit`. `log` records numbers at a
    training step; `close` ends the tracked run with the run's outcome."""

    def start(self, run_dir: Path, config: dict[str, Any], resume: int | None) -> None: ...

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self, outcome: Outcome) -> None: ...


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers (rewards, accuracy, losses, KL, seconds, ...), without the step
    itself; flags and text are left out."""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def read_id(path: Path) -> str | None:
    """The tracked run's identifier saved in the run directory by an earlier start, if any."""
    saved = path.read_text().strip() if path.is_file() else ""
    return saved or None


def save_id(path: Path, value: str) -> None:
    """Written whole or not at all (a rename), before the first step is logged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, value + "\n")


def run_name(run_dir: Path) -> str:
    """The run's name in a tracker's list of runs: the last two parts of its directory
    (`2026-01-31/12-00-00`, or `<sweep time>/<job>` in a sweep)."""
    return "/".join(run_dir.resolve().parts[-2:])
