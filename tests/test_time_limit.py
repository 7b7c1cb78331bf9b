"""trainer.time_limit_minutes's decision (tepo_cli/runtime/time_limit.py): stop after a step when
the next one — its longest so far times 1.25, and the evaluation due after it (the last one's
seconds, or before any has run an estimate from the steps' generation) — could end past the
limit. The run that stops and resumes is in tests/test_resume_faults.py."""

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


def test_an_evaluation_not_yet_timed_is_estimated_from_the_slowest_rollout_per_answer():
    # 200 held-out answers on this rank; a step's rollout generates 16
    clock = TimeLimit(1.0, time.time() - 10.0, evaluation_answers=lambda: 200, step_answers=16)
    clock.step_took(4.0, rollout_seconds=1.6)  # 0.1 s an answer: 200 x 0.1 x 1.25 = 25 s
    assert clock.evaluation() == pytest.approx(25.0)
    clock.step_took(3.0, rollout_seconds=0.8)  # a faster rollout does not lower it
    assert clock.evaluation() == pytest.approx(25.0)
    # 50 s left: the next step (5 s) alone fits, with the estimated evaluation (30 s) too ...
    assert not clock.next_would_pass(True)
    clock.step_took(4.0, rollout_seconds=3.2)  # ... until a slower rollout: 0.2 s -> 50 s
    assert clock.next_would_pass(True) and not clock.next_would_pass(False)
    assert "after it, 50 s (estimated: none has run yet)" in clock.said(3, True)
    clock.evaluation_took(20.0)  # a timed one replaces the estimate
    assert clock.evaluation() == 20.0 and not clock.next_would_pass(True)
    assert "after it, 20 s) could" in clock.said(3, True)


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
