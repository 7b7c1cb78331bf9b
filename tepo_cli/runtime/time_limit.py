"""`trainer.time_limit_minutes`: stop at a step boundary, with a checkpoint, before the next step
would run past a wall-time limit.

A scheduler kills a job at its limit (SLURM's `--time`, a lease, a session's end). The steps since
the run's last `trainer.save_every` checkpoint are then trained again, and a kill inside a
checkpoint's write costs that checkpoint. Told its limit, a run stops itself first: after a step,
when the next one would end past the limit — at the longest step this process has taken, a
quarter more for the spread and the checkpoint, plus the held-out evaluation due after it at the
last one's seconds — it writes a checkpoint and exits 143 as for SIGTERM (runtime/stop.py), and
`resume=true` continues exactly. Time counts from the job's start (the `tepo train` process that
launched the ranks), model loading included, as a scheduler counts it. After the last step
nothing stops it: only the final evaluation and save are left, and the step before it already
counted them.
"""

from __future__ import annotations

import os
import time

import psutil

from tepo_cli.runtime.lifetime import PARENT_ENV

MARGIN = (
    1.25  # the next step may take a quarter longer than the longest so far, with its checkpoint
)


def job_start() -> float:
    """When this job started: the `tepo train` process that launched this rank (its PID is in
    runtime/lifetime.py's PARENT_ENV), else this process."""
    parent = os.environ.get(PARENT_ENV)
    try:
        return psutil.Process(int(parent) if parent else None).create_time()
    except (ValueError, psutil.Error):
        return psutil.Process().create_time()


class TimeLimit:
    def __init__(self, minutes: float | None, started: float | None = None) -> None:
        self.seconds = None if minutes is None else minutes * 60.0
        self.started = job_start() if started is None else started
        self.longest_step = 0.0
        self.last_evaluation = 0.0

    def step_took(self, seconds: float) -> None:
        self.longest_step = max(self.longest_step, seconds)

    def evaluation_took(self, seconds: float) -> None:
        self.last_evaluation = seconds

    def next_would_pass(self, evaluation_after_next: bool) -> bool:
        """Whether the next step (and the evaluation after it, if one is due) would end past the
        limit; never before a step's time is known."""
        if self.seconds is None or not self.longest_step:
            return False
        need = self.longest_step * MARGIN + (self.last_evaluation if evaluation_after_next else 0)
        return self.elapsed() + need > self.seconds

    def elapsed(self) -> float:
        return time.time() - self.started

    def said(self, step: int, evaluation_after_next: bool) -> str:
        minutes = (self.seconds or 0.0) / 60.0
        evaluation = f" and the held-out evaluation after it, {self.last_evaluation:.0f} s"
        return (
            f"trainer.time_limit_minutes={minutes:g}: stopped after step {step}, "
            f"{self.elapsed() / 60:.1f} min after the process started, since the next step (up "
            f"to {self.longest_step * MARGIN:.0f} s{evaluation if evaluation_after_next else ''}) "
            "could end past the limit"
        )
