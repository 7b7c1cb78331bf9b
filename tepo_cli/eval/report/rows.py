"""The numbers of the report: one row per run, one row per group (aggregated over its seeds).

Per run:
- final reward: mean of `reward_mean` over the last `last` logged steps (one step is noisy);
- held-out accuracy before / after training: the `eval.jsonl` records (else `summary.json`);
- steps / seconds to threshold: the first step whose trailing mean of `threshold_key` over
  `window` steps is ≥ `threshold`, and the sum of `step_seconds` up to it;
- seconds per step: the median of `step_seconds` (robust to the first step's warm-up);
- peak memory: the largest `peak_rss_mb` logged.
Per group, only finished runs enter the statistics (a crashed or running run's last step is not
its final one): mean ± 95 % CI over seeds, peak memory as the maximum over seeds. Every run,
whatever its state, has its own row.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tepo_cli.eval.report.grouping import Group
from tepo_cli.eval.report.runs import Run
from tepo_cli.eval.report.stats import Crossing, Estimate, estimate, first_crossing


@dataclass(frozen=True)
class Options:
    threshold: float = 0.5
    threshold_key: str = "accuracy"
    window: int = 1
    last: int = 5
    reference: str | None = "algo=grpo"  # the group whose best held-out mean the fractions are of
    fractions: tuple[float, ...] = (0.5, 0.9)
    gain: bool = False  # the fractions are of the reference's gain over its start, not its best
    # named by the user (--reference): one that matches several groups is refused, not skipped
    reference_given: bool = True
    groups: str | None = None  # --groups: labels or a regular expression (selection.py)


@dataclass(frozen=True)
class RunRow:
    run: Run
    group: str
    steps_done: int
    max_steps: int | None
    final_reward: float | None
    accuracy_before: float | None
    accuracy_after: float | None
    crossing: Crossing | None
    seconds_per_step: float | None
    peak_rss_mb: float | None


@dataclass(frozen=True)
class GroupRow:
    group: Group
    states: Counter[str]
    final_reward: Estimate | None
    accuracy_before: Estimate | None
    accuracy_after: Estimate | None
    steps_to: Estimate | None  # over the finished runs that reached the threshold
    seconds_to: Estimate | None
    reached: int
    finished: int
    seconds_per_step: Estimate | None
    peak_rss_mb: float | None  # maximum over the group's finished runs


def run_row(run: Run, group: str, options: Options) -> RunRow:
    metrics = run.metrics
    rewards = [m["reward_mean"] for m in metrics if m.get("reward_mean") is not None]
    step_seconds = [m["step_seconds"] for m in metrics if m.get("step_seconds") is not None]
    peaks = [m["peak_rss_mb"] for m in metrics if m.get("peak_rss_mb") is not None]
    max_steps = run.config.get("trainer.max_steps")
    return RunRow(
        run=run,
        group=group,
        steps_done=max((int(m.get("step", 0)) for m in metrics), default=0),
        max_steps=int(max_steps) if isinstance(max_steps, int) else None,
        final_reward=statistics.fmean(rewards[-options.last :]) if rewards else None,
        accuracy_before=_evaluation(run, "before"),
        accuracy_after=_evaluation(run, "after"),
        crossing=first_crossing(metrics, options.threshold_key, options.threshold, options.window),
        seconds_per_step=statistics.median(step_seconds) if step_seconds else None,
        peak_rss_mb=max(peaks) if peaks else None,
    )


def group_row(group: Group, rows: list[RunRow]) -> GroupRow:
    done = [row for row in rows if row.run.finished]
    crossed = [row.crossing for row in done if row.crossing is not None]
    peaks = [row.peak_rss_mb for row in done if row.peak_rss_mb is not None]
    return GroupRow(
        group=group,
        states=Counter(row.run.state for row in rows),
        final_reward=estimate(row.final_reward for row in done),
        accuracy_before=estimate(row.accuracy_before for row in done),
        accuracy_after=estimate(row.accuracy_after for row in done),
        steps_to=estimate(float(c.step) for c in crossed),
        seconds_to=estimate(c.seconds for c in crossed),
        reached=len(crossed),
        finished=len(done),
        seconds_per_step=estimate(row.seconds_per_step for row in done),
        peak_rss_mb=max(peaks) if peaks else None,
    )


def build_rows(groups: list[Group], options: Options) -> tuple[list[GroupRow], list[RunRow]]:
    group_rows: list[GroupRow] = []
    run_rows: list[RunRow] = []
    for group in groups:
        rows = [run_row(run, group.label, options) for run in group.runs]
        run_rows.extend(rows)
        group_rows.append(group_row(group, rows))
    return group_rows, run_rows


def _evaluation(run: Run, when: str) -> float | None:
    """The held-out accuracy measured `when` ("before" or "after") training, if it was."""
    records = [e for e in run.evals if e.get("when") == when and e.get("accuracy") is not None]
    if records:
        return float(records[-1]["accuracy"])
    value: Any = (run.summary or {}).get(f"eval_{when}")
    return float(value) if isinstance(value, (int, float)) else None
