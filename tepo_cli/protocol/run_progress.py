"""Where a protocol's runs stand, read from their directories alone: published or not, the
newest checkpoint, the steps logged and the time their steps have left — for `tepo protocol run`
(which run to skip, resume or start) and its `--status` (which never reads an outcome)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from tepo_cli.core.run_dir import CHECKPOINTS, METRICS
from tepo_cli.core.run_status import effective_state
from tepo_cli.protocol.spec import Run

_CHECKPOINT = re.compile(r"^step_(\d{8})$")
RECENT = 10  # steps whose median seconds `--status` reads the time left from


def published(run_dir: Path) -> bool:
    """Whether `run_dir` holds a finished run's records."""
    return effective_state(run_dir) == "finished"


def newest_checkpoint(run_dir: Path) -> int | None:
    root = run_dir / CHECKPOINTS
    steps = [int(m.group(1)) for p in root.glob("step_*") if (m := _CHECKPOINT.match(p.name))]
    return max(steps, default=None)


def last_step(run_dir: Path) -> int | None:
    steps = step_records(run_dir)
    return steps[-1]["step"] if steps else None


def step_records(run_dir: Path) -> list[dict]:
    """The training steps' records of metrics.jsonl, in order (none before the first)."""
    path = run_dir / METRICS
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [record for record in records if "step" in record]


def seconds_left(steps: list[dict], planned: list[str]) -> float | None:
    """The median seconds of the last RECENT steps times the steps still planned (None: no step
    seconds, or none left); a pause inside those steps raises it."""
    seconds = _recent_seconds(steps)
    left = int(planned[-1]) - steps[-1]["step"] if planned and steps else 0
    return statistics.median(seconds) * left if seconds and left > 0 else None


def time_left(steps: list[dict], planned: list[str]) -> str:
    """The status line's time left, the held-out evaluations aside."""
    seconds = seconds_left(steps, planned)
    if seconds is None:
        return ""
    paced = len(_recent_seconds(steps))
    return f", {_said(seconds)} of steps left at the median pace of its last {paced}"


def total_left(published: list[float], running: float, waiting: int, runs: int) -> str:
    """The closing line: the runs published and the training steps' time left in all, the run
    in progress at its recent pace and each run not started at the median of the published
    runs' summed step seconds (evaluations aside)."""
    done = f"{len(published)} of {runs} runs published"
    if waiting and not published:
        return f"{done}; the {waiting} not started are estimated once a run is published"
    parts = ["the run in progress at its recent pace"] if running else []
    if waiting:
        parts.append(f"{waiting} not started at the median of the {len(published)} published")
    if not parts:
        return done
    left = running + (statistics.median(published) * waiting if waiting else 0.0)
    return f"{done}; {_said(left)} of training steps left ({', '.join(parts)}), evaluations aside"


def _recent_seconds(steps: list[dict]) -> list[float]:
    recent = [r.get("step_seconds") for r in steps[-RECENT:]]
    return [value for value in recent if isinstance(value, int | float)]


def _said(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute"
    return (
        f"about {minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"about {minutes} min"
    )


def print_status(runs: list[Run], runs_dir: Path, results_dir: Path) -> int:
    """One line a run: published (its steps), in progress (its state, last step of the planned
    ones, newest checkpoint, that step's seconds) or not started. Nothing about rewards or
    held-out results, so a pre-registered experiment can be watched without its outcomes."""
    done: list[float] = []  # each published run's summed step seconds
    running, waiting = 0.0, 0
    for name, overrides in runs:
        planned = [o.split("=", 1)[1] for o in overrides if o.startswith("trainer.max_steps=")]
        of = f" of {planned[-1]}" if planned else ""
        if published(results_dir / name):
            steps = step_records(results_dir / name)
            done.append(sum(r.get("step_seconds") or 0.0 for r in steps))
            print(
                f"{name}: published in {results_dir / name} ({last_step(results_dir / name)} steps)"
            )
            continue
        run_dir = runs_dir / name
        if not run_dir.is_dir():
            waiting += 1
            print(f"{name}: not started")
            continue
        steps = step_records(run_dir)
        running += seconds_left(steps, planned) or 0.0
        last = steps[-1] if steps else {}
        step, seconds = last.get("step", 0), last.get("step_seconds")
        took = f", that step took {seconds:.0f} s" if isinstance(seconds, int | float) else ""
        checkpoint = newest_checkpoint(run_dir)
        print(
            f"{name}: {effective_state(run_dir)} in {run_dir}, step {step}{of} logged, newest "
            f"checkpoint {'none' if checkpoint is None else f'step {checkpoint}'}{took}"
            f"{time_left(steps, planned)}"
        )
    print(total_left(done, running, waiting, len(runs)))
    return 0
