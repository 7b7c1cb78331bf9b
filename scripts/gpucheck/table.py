"""A check's outcome and the verdict table: the terminal's (rich) and Markdown, one set of cells."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchlib.report import table


@dataclass
class Outcome:
    label: str
    verdict: str  # pass, FAIL or skip
    why: str = ""
    seconds: float = 0.0
    steps: int = 0
    step_s: float | None = None
    rollout_s: float | None = None
    update_s: float | None = None
    peak_rss_mb: float | None = None
    peak_gpu_mb: float | None = None
    run_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


COLUMNS = (
    "check",
    "result",
    "s/step",
    "rollout s",
    "update s",
    "peak RSS MB",
    "peak GPU MB",
    "wall s",
    "why / modes on",  # a failure's reason; a pass's TF32, CUDA graphs, sleep, seeds
)
_COLOUR = {"pass": "green", "FAIL": "red", "skip": "yellow"}


def _number(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def cells(o: Outcome) -> list[str]:
    """One row of the table, in COLUMNS' order."""
    times = [_number(o.step_s), _number(o.rollout_s), _number(o.update_s)]
    sizes = [_number(o.peak_rss_mb, 0), _number(o.peak_gpu_mb, 0), _number(o.seconds, 0)]
    return [o.label, o.verdict, *times, *sizes, o.why]


def render(outcomes: list[Outcome], header: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=header)
    for column in COLUMNS:
        table.add_column(column)
    for o in outcomes:
        row = cells(o)
        row[1] = f"[{_COLOUR[o.verdict]}]{o.verdict}[/]"
        table.add_row(*row)
    Console(width=200).print(table)


def markdown(outcomes: list[Outcome], header: str) -> str:
    rows = ([c.replace("|", "/") for c in cells(o)] for o in outcomes)
    return f"{header}\n\n{table(COLUMNS, rows)}\n"
