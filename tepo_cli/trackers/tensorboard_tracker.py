"""TensorBoard: event files in `<run dir>/tensorboard/`, written by torch's SummaryWriter; view
with `tensorboard --logdir <run dir>` (or a sweep's directory, every job a run).

A resumed run writes to the same directory with `purge_step`: TensorBoard then hides what the
interrupted process logged at that step or later (the steps after its last checkpoint, which the
resumed run takes again), so each step shows once. The config is recorded once, for the HParams
dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tepo_cli.trackers.tracker import HELD_OUT_ACCURACY, Outcome

NAME = "tensorboard"
REQUIRES = "tensorboard"


class TensorBoardTracker:
    def __init__(self) -> None:
        self._writer: Any = None

    def start(self, run_dir: Path, config: dict[str, Any], resume: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        logdir = run_dir / NAME
        fresh = not any(logdir.glob("events.out.tfevents.*"))
        # A run resumed without a checkpoint (resume=0) starts over, held-out step 0 included.
        purge = None if fresh or resume is None else (resume + 1 if resume else 0)
        self._writer = SummaryWriter(str(logdir), purge_step=purge)
        if fresh:
            shown = {key: _hparam(value) for key, value in config.items()}
            for summary in hparams(shown, {HELD_OUT_ACCURACY: 0.0, "reward_mean": 0.0}):
                self._writer.file_writer.add_summary(summary)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # a killed run keeps every logged step, as metrics.jsonl does

    def close(self, outcome: Outcome) -> None:
        self._writer.close()


def _hparam(value: Any) -> int | float | str | bool:
    """HParams take numbers, strings and booleans; anything else (lists, None) as its text."""
    return value if isinstance(value, (int, float, str, bool)) else str(value)


def build() -> TensorBoardTracker:
    return TensorBoardTracker()
