"""PNG curves against the training step: one line per group, the mean over its finished runs,
with its 95 % confidence band (Student t over the seeds logging the step); runs that did not finish (crashed, running, ...)
are drawn one by one, dashed, in their group's colour, so they are visible but do not move it.

At each step the mean is over the finished runs that logged it. The figures are built with
matplotlib's object API and the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tepo_cli.eval.report.grouping import Group
from tepo_cli.eval.report.runs import Run
from tepo_cli.eval.report.stats import estimate

# (metrics.jsonl key, axis label)
CURVES = (
    ("reward_mean", "mean reward"),
    ("accuracy", "training accuracy"),
    ("entropy", "entropy (nats/token)"),
    ("kl", "KL to reference"),
    ("clip_frac", "clip fraction"),
    ("response_length", "response length (tokens)"),
    ("truncated_frac", "truncated share of answers"),
    ("kl_mask_frac", "TEPO KL-mask share"),
)
EVAL_CURVE = ("eval_accuracy", "held-out accuracy")

Series = dict[int, float]


def write_plots(groups: list[Group], out: Path) -> list[Path]:
    """Write one PNG per curve that some run logged; return their paths."""
    written: list[Path] = []
    for key, label in CURVES:
        if _draw(groups, "metrics", key, label, out / f"plot_{key}.png"):
            written.append(out / f"plot_{key}.png")
    # Held-out accuracy against the step: drawn when some run was evaluated at least twice.
    several = any(len(_series(run.evals, "accuracy")) > 1 for group in groups for run in group.runs)
    name, label = EVAL_CURVE
    if several and _draw(groups, "evals", "accuracy", label, out / f"plot_{name}.png"):
        written.append(out / f"plot_{name}.png")
    return written


def _series(records: list[dict[str, Any]], key: str) -> Series:
    return {
        int(r["step"]): float(r[key])
        for r in records
        if r.get(key) is not None and r.get("step") is not None
    }


def _draw(groups: list[Group], source: str, key: str, label: str, path: Path) -> bool:
    """Plot `key` of each run's `source` records ("metrics" or "evals"); False if none has it."""
    curves = [(g, [(run, _series(getattr(run, source), key)) for run in g.runs]) for g in groups]
    if not any(points for _, runs in curves for _, points in runs):
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, (group, runs) in enumerate(curves):
        color = f"C{index % 10}"
        finished = [points for run, points in runs if run.finished and points]
        if finished:
            _mean_and_band(axes, finished, color, group.label)
        unfinished: list[tuple[Run, Series]] = [(r, p) for r, p in runs if not r.finished and p]
        for number, (_, points) in enumerate(unfinished):
            steps = sorted(points)
            name = f"{group.label} (not finished)" if number == 0 else None
            axes.plot(steps, [points[s] for s in steps], color=color, linestyle="--", marker="x",
                      markersize=4, linewidth=0.9, alpha=0.8, label=name)  # fmt: skip
    axes.set_xlabel("step")
    axes.set_ylabel(label)
    axes.set_title(f"{label}: mean over finished seeds, band = 95 % CI", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    return True


def _mean_and_band(axes: Any, runs: list[Series], color: str, label: str) -> None:
    steps = sorted({step for points in runs for step in points})
    points = [estimate(points.get(s) for points in runs) for s in steps]
    means = [p.mean for p in points if p is not None]
    axes.plot(steps, means, color=color, marker=".", label=label)
    if any(p is not None and p.half_width is not None for p in points):
        half = [p.half_width or 0.0 for p in points if p is not None]
        low = [m - h for m, h in zip(means, half, strict=True)]
        high = [m + h for m, h in zip(means, half, strict=True)]
        axes.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
