"""trainer.time_limit_minutes's decision (tepo_cli/runtime/time_limit.py): stop after a step when
the next one — its longest so far times 1.25, and the evaluation due after it — could end past
the limit. The run that stops and resumes is in tests/test_resume_faults.py."""

from __future__ import annotations

import time

import pytest

from tepo_cli.runtime.time_limit import TimeLimit


def limit(minutes: float | None, elapsed: float) -> TimeLimit:
    return TimeLimit(minutes, started=time.time() - elapsed)


def test_the_next_step_at_a_quarter_over_the_longest_decides():
    clock = limit(1.0, elapsed=50.0)  # 10 s left
    assert not clock.next_would_pass(False)  # no step's time known yet
    clock.step_took(7.0)  # 8.75 s needed
    assert not clock.next_would_pass(False)
    clock.step_took(5.0)  # the longest still counts
    assert not clock.next_would_pass(False)
    clock.step_took(8.5)  # 10.6 s needed
    assert clock.next_would_pass(False)


def test_an_evaluation_due_after_the_next_step_counts_at_the_last_ones_seconds():
    clock = limit(1.0, elapsed=40.0)  # 20 s left
    clock.step_took(4.0)  # 5 s
    clock.evaluation_took(14.0)
    assert not clock.next_would_pass(False) and not clock.next_would_pass(True)  # 19 s
    clock.evaluation_took(16.0)
    assert clock.next_would_pass(True) and not clock.next_would_pass(False)  # 21 s, 5 s


def test_no_limit_never_stops():
    clock = limit(None, elapsed=1e9)
    clock.step_took(1e6)
    assert not clock.next_would_pass(True)


def test_by_default_the_clock_starts_with_the_process():
    import psutil

    assert TimeLimit(1.0).started == pytest.approx(psutil.Process().create_time())


def test_it_says_what_it_counted():
    clock = limit(0.5, elapsed=27.0)
    clock.step_took(4.0)
    clock.evaluation_took(6.0)
    assert clock.said(3, True) == (
        "trainer.time_limit_minutes=0.5: stopped after step 3, 0.5 min after the process "
        "started, since the next step (up to 5 s and the held-out evaluation after it, 6 s) "
        "could end past the limit"
    )
