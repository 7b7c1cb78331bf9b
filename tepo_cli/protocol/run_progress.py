"""Where a protocol's runs stand, read from their directories alone: published or not, the
newest checkpoint, the steps logged and the time their steps and held-out evaluations have left —
for `tepo protocol run` (which run to skip, resume or start) and its `--status` (which never reads
an outcome: of eval.jsonl it reads each evaluation's step and seconds, nothing else)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import yaml

from tepo_cli.core.run_dir import CHECKPOINTS, CONFIG, EVALS, METRICS
from tepo_cli.core.run_status import effective_state
from tepo_cli.protocol.journal import JOURNAL, read_entries, tries_by_run
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


def evaluation_seconds(run_dir: Path) -> dict[int, float]:
    """Each held-out evaluation's seconds by its step, from eval.jsonl: its timing only."""
    path = run_dir / EVALS
    lines = path.read_text().splitlines() if path.is_file() else []
    records = [json.loads(line) for line in lines if line.strip()]
    return {r["step"]: r["seconds"] for r in records if isinstance(r.get("seconds"), int | float)}


def evaluations_left(run_dir: Path, step: int) -> list[int]:
    """The steps after which the run's config.yaml has it evaluate (`trainer.eval_before`,
    `eval_every`, `eval_after`: train/run.py), from the last step logged on, less those done."""
    path = run_dir / CONFIG
    trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer", {}) if path.is_file() else {}
    last, every = trainer.get("max_steps") or 0, trainer.get("eval_every") or 0
    planned = [0] if trainer.get("eval_before") else []
    if every:
        planned += range(every, last, every)
    if trainer.get("eval_after"):
        planned.append(last)
    done = evaluation_seconds(run_dir)
    return [s for s in planned if s >= step and s not in done]


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
    return f", {duration(seconds)} of steps left at the median pace of its last {paced}"


def total_left(
    published: list[float], running: float, waiting: int, runs: int, evaluations: bool = False
) -> str:
    """The closing line: the runs published and the time left in all, the run in progress at its
    recent pace and each run not started at the median of the published runs' summed seconds —
    of their steps and, where `evaluations` (every evaluation's seconds were known), of their
    held-out evaluations too."""
    done = f"{len(published)} of {runs} runs published"
    if waiting and not published:
        return f"{done}; the {waiting} not started are estimated once a run is published"
    parts = ["the run in progress at its recent pace"] if running else []
    if waiting:
        parts.append(f"{waiting} not started at the median of the {len(published)} published")
    if not parts:
        return done
    left = running + (statistics.median(published) * waiting if waiting else 0.0)
    what, aside = ("steps and evaluations", "") if evaluations else ("steps", ", evaluations aside")
    return f"{done}; {duration(left)} of training {what} left ({', '.join(parts)}){aside}"


def _recent_seconds(steps: list[dict]) -> list[float]:
    recent = [r.get("step_seconds") for r in steps[-RECENT:]]
    return [value for value in recent if isinstance(value, int | float)]


def duration(seconds: float) -> str:
    """'about 1 h 5 min', 'about 7 min', 'under a minute'."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute"
    return (
        f"about {minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"about {minutes} min"
    )


def earlier_tries(count: int) -> str:
    return f"{count} earlier {'try' if count == 1 else 'tries'}"


def print_status(
    runs: list[Run], runs_dir: Path, results_dir: Path, reused: dict[str, Path] | None = None
) -> int:
    """One line a run: published (its steps), in progress (its state, last step of the planned
    ones, newest checkpoint, that step's seconds, the steps and evaluations it has left, which try
    the journal counts it at) or not started (with the journal's earlier tries, where its
    directory is gone); a reused run (`reused`: name -> where another protocol publishes it) is
    published there or awaited from there. Nothing about rewards or held-out results, so a
    pre-registered experiment can be watched without its outcomes."""
    reused = reused or {}
    where = {name: reused.get(name, results_dir / name) for name, _ in runs}
    finished = [name for name, _ in runs if published(where[name])]
    tries = tries_by_run(read_entries(results_dir / JOURNAL))
    timed = {name: evaluation_seconds(where[name]) for name in finished}
    evaluations = all(timed.values())  # every published run's evaluations were timed
    typical = [s for seconds in timed.values() for s in seconds.values()]
    done: list[float] = []  # each published run's summed seconds
    running, waiting = 0.0, 0
    for name, overrides in runs:
        planned = [o.split("=", 1)[1] for o in overrides if o.startswith("trainer.max_steps=")]
        of = f" of {planned[-1]}" if planned else ""
        if name in finished:
            done.append(_seconds_spent(where[name], timed[name]))
            said = "reused, published" if name in reused else "published"
            print(f"{name}: {said} in {where[name]} ({last_step(where[name])} steps)")
            continue
        if name in reused:
            print(f"{name}: reused from {where[name].parent}, not published there yet (it trains "
                  "under its own protocol)")  # fmt: skip
            continue
        run_dir = runs_dir / name
        if not run_dir.is_dir():
            waiting += 1
            lost = tries[name]
            print(
                f"{name}: not started"
                if not lost
                else f"{name}: not started here; the journal has {earlier_tries(lost)} of it, "
                "whose directory is gone, so it trains again from step 0"
            )
            continue
        steps = step_records(run_dir)
        last = steps[-1] if steps else {}
        step, seconds = last.get("step", 0), last.get("step_seconds")
        left = evaluations_left(run_dir, step)
        own = list(evaluation_seconds(run_dir).values())
        pace = statistics.median(own or typical) if own or typical else None
        evaluations = evaluations and (pace is not None or not left)
        running += (seconds_left(steps, planned) or 0.0) + (pace or 0.0) * len(left)
        took = f", that step took {seconds:.0f} s" if isinstance(seconds, int | float) else ""
        checkpoint = newest_checkpoint(run_dir)
        print(
            f"{name}: {effective_state(run_dir)} in {run_dir}, step {step}{of} logged, newest "
            f"checkpoint {'none' if checkpoint is None else f'step {checkpoint}'}{took}"
            f"{time_left(steps, planned)}{_evaluations_said(left, pace)}"
            + (f"; its try {tries[name]} (journal)" if tries[name] > 1 else "")
        )
    print(total_left(done, running, waiting, len(runs), evaluations))
    return 0


def _seconds_spent(run_dir: Path, evaluations: dict[int, float]) -> float:
    """A published run's summed seconds of steps and (timed) held-out evaluations."""
    steps = step_records(run_dir)
    return sum(r.get("step_seconds") or 0.0 for r in steps) + sum(evaluations.values())


def _evaluations_said(left: list[int], pace: float | None) -> str:
    if not left:
        return ""
    each = f" of about {pace:.0f} s" if pace is not None else ""
    return f", and {len(left)} evaluation{'s' * (len(left) > 1)}{each}"
