"""Run outputs: metrics.jsonl (one JSON object per step), samples.jsonl, and the console display."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tepo_cli.core.run_dir import LOG_FILES

# The run's append-only logs, in the order RunLog opens them (resume cuts them back together).

# What the live display shows per step, in order: (metrics key, label, format).
_SHOWN = (
    ("reward_mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.2f}"),
    ("response_length", "len", "{:.1f}"),
    ("kl", "kl", "{:.4f}"),
    ("grad_norm", "|g|", "{:.3f}"),
    ("step_seconds", "s/step", "{:.1f}"),
    ("update_mfu", "MFU", "{:.2f}"),
)


class JsonlWriter:
    """One JSON object per line, flushed: a killed run keeps every finished line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(_finite(record), ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


class RunLog:
    """Rank 0's view of a run directory: metric and sample files plus a rich progress display."""

    def __init__(self, run_dir: Path, total_steps: int, show_progress: bool) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.console = Console(stderr=True)
        self._writers = tuple(JsonlWriter(run_dir / name) for name in LOG_FILES)
        self.metrics, self.samples, self.evals, self.eval_samples = self._writers
        self._progress = Progress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[summary]}"),
            console=self.console,
            disable=not (show_progress and self.console.is_terminal),
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total_steps, summary="")

    def __enter__(self) -> RunLog:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()
        for writer in self._writers:
            writer.close()

    def step(self, metrics: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        self.metrics.write(metrics)
        for sample in samples:
            self.samples.write(sample)
        summary = "  ".join(
            f"{label} {fmt.format(metrics[key])}" for key, label, fmt in _SHOWN if key in metrics
        )
        self._progress.update(self._task, completed=metrics["step"], summary=summary)
        # Each step's line stays above the live bar, so the reward curve is readable afterwards.
        # soft_wrap: a line longer than the console (80 columns when it is a file) stays one line.
        self.console.print(f"step {metrics['step']}: {summary}", highlight=False, soft_wrap=True)

    def evaluation(self, record: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """A held-out evaluation: its record into eval.jsonl, its graded answers (each tagged with
        the record's step and when) into eval_samples.jsonl, and a console line."""
        self.evals.write(record)
        for sample in samples:
            self.eval_samples.write({"step": record["step"], "when": record["when"], **sample})
        self.console.print(
            f"[bold]eval[/] ({record['when']}, step {record['step']}): accuracy "
            f"{record['accuracy']:.3f} on {record['problems']} held-out problems "
            f"({record['seconds']:.1f} s)",
            soft_wrap=True,
        )

    def before_training(self, record: dict[str, Any], line: str) -> None:
        """One record of work before step 1 (MPO's warm-up): metrics.jsonl, and its console
        line."""
        self.metrics.write(record)
        self.console.print(line, highlight=False, soft_wrap=True)

    def info(self, message: str) -> None:
        """A line as it is, never folded (soft_wrap): it may hold a path or a command to copy, and
        a console that is a file is 80 columns wide."""
        self.console.print(message, highlight=False, markup=False, soft_wrap=True)


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf: write them as null (the value is still visible as missing)."""
    return {
        key: (None if isinstance(value, float) and not math.isfinite(value) else value)
        for key, value in record.items()
    }
