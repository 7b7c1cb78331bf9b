"""`trainer.time_limit_minutes`: stop at a step boundary, with a checkpoint, before the next step
would run past a wall-time limit.

A scheduler kills a job at its limit (SLURM's `--time`, a lease, a session's end). The steps since
the run's last `trainer.save_every` checkpoint are then trained again, and a kill inside a
checkpoint's write costs that checkpoint. Told its limit, a run stops itself first: after a step,
when the next one would end past the limit — at the longest step this process has taken, a
quarter more for the spread and the checkpoint, plus the held-out evaluation due after it at the
last one's seconds — it writes a checkpoint and exits 143 as for SIGTERM (runtime/stop.py), and
`resume=true` continues exactly. Until this process has run an evaluation
(`trainer.eval_before=false`, or a resumed run), the next one's seconds are estimated from the
steps' generation: the slowest rate per answer of a step's rollout times the held-out answers
this rank generates, a quarter more; the first timed evaluation replaces the estimate. Time
counts from the job's start (the `tepo train` process that launched the ranks), model loading
included, as a scheduler counts it. After the last step
nothing stops it: only the final evaluation and save are left, and the step before it already
counted them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from tepo_cli.runtime.lifetime import PARENT_ENV

# The next step may take a quarter longer than the longest so far, with its checkpoint; an
# evaluation not yet timed, a quarter longer than its estimate.
MARGIN = 1.25


def job_start() -> float:
    """When this job started: the `tepo train` process that launched this rank (its PID is in
    runtime/lifetime.py's PARENT_ENV), else this process."""
    parent = os.environ.get(PARENT_ENV)
    try:
        return psutil.Process(int(parent) if parent else None).create_time()
    except (ValueError, psutil.Error):
        return psutil.Process().create_time()


class TimeLimit:
    """`evaluation_answers`: how many answers (greedy, one a problem) this rank generates in a
    held-out evaluation, asked only for the estimate of one not yet timed (a dataset's held-out
    split loads on first use); `step_answers`: those it generates in a training step's rollout
    (before any refill)."""

    def __init__(
        self,
        minutes: float | None,
        started: float | None = None,
        evaluation_answers: Callable[[], int] = lambda: 0,
        step_answers: float = 1.0,
    ) -> None:
        self.seconds = None if minutes is None else minutes * 60.0
        self.started = job_start() if started is None else started
        self.evaluation_answers, self.step_answers = evaluation_answers, step_answers
        self.longest_step = 0.0
        self.slowest_answer = 0.0  # a step's rollout seconds per answer, the slowest so far
        self.last_evaluation: float | None = None

    def step_took(self, seconds: float, rollout_seconds: float = 0.0) -> None:
        self.longest_step = max(self.longest_step, seconds)
        self.slowest_answer = max(self.slowest_answer, rollout_seconds / self.step_answers)

    def evaluation_took(self, seconds: float) -> None:
        self.last_evaluation = seconds

    def evaluation(self) -> float:
        """The next evaluation's seconds: the last one's, else the estimate."""
        if self.last_evaluation is not None:
            return self.last_evaluation
        return self.slowest_answer * self.evaluation_answers() * MARGIN

    def next_would_pass(self, evaluation_after_next: bool) -> bool:
        """Whether the next step (and the evaluation after it, if one is due) would end past the
        limit; never before a step's time is known."""
        if self.seconds is None or not self.longest_step:
            return False
        need = self.longest_step * MARGIN + (self.evaluation() if evaluation_after_next else 0)
        return self.elapsed() + need > self.seconds

    def elapsed(self) -> float:
        return time.time() - self.started

    def said(self, step: int, evaluation_after_next: bool) -> str:
        minutes = (self.seconds or 0.0) / 60.0
        estimated = " (estimated: none has run yet)" if self.last_evaluation is None else ""
        evaluation = f" and the held-out evaluation after it, {self.evaluation():.0f} s{estimated}"
        return (
            f"trainer.time_limit_minutes={minutes:g}: stopped after step {step}, "
            f"{self.elapsed() / 60:.1f} min after the process started, since the next step (up "
            f"to {self.longest_step * MARGIN:.0f} s{evaluation if evaluation_after_next else ''}) "
            "could end past the limit"
        )
