"""PNG curves against the training step: one line per group, the mean over its finished runs,
with its 95 % confidence band (Student t over the seeds logging the step); runs that did not
finish (crashed, running, ...) are drawn one by one, thin with x markers, in their group's colour
and line style, so they are visible but do not move it.

Each group keeps one (colour, line style) in every panel of a figure (plot_styles.py); more than
six groups are drawn as small multiples (plot_panels.py) on a shared y axis; the legend sits
outside the axes, below the panels, so it never hides a curve.

At each step the mean is over the finished runs that logged it. The figures are built with
matplotlib's object API and the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tepo_cli.eval.report.grouping import Group
from tepo_cli.eval.report.plot_panels import panels
from tepo_cli.eval.report.plot_styles import REFERENCE_STYLE, Style, style_of
from tepo_cli.eval.report.runs import Run
from tepo_cli.eval.report.stats import estimate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def write_plots(groups: list[Group], out: Path, reference: str | None = None) -> list[Path]:
    """Write one PNG per curve that some run logged; return their paths. `reference`: the label
    of the reference group, which lays out the small multiples (plot_panels.py)."""
    written: list[Path] = []
    for key, label in CURVES:
        figure = curve_figure(groups, reference, "metrics", key, label)
        if figure is not None:
            figure.savefig(out / f"plot_{key}.png", dpi=110, bbox_inches="tight")
            written.append(out / f"plot_{key}.png")
    # Held-out accuracy against the step: drawn when some run was evaluated at least twice.
    several = any(len(_series(run.evals, "accuracy")) > 1 for group in groups for run in group.runs)
    name, label = EVAL_CURVE
    figure = curve_figure(groups, reference, "evals", "accuracy", label) if several else None
    if figure is not None:
        figure.savefig(out / f"plot_{name}.png", dpi=110, bbox_inches="tight")
        written.append(out / f"plot_{name}.png")
    return written


def _series(records: list[dict[str, Any]], key: str) -> Series:
    return {
        int(r["step"]): float(r[key])
        for r in records
        if r.get(key) is not None and r.get("step") is not None
    }


def curve_figure(
    groups: list[Group], reference: str | None, source: str, key: str, label: str
) -> Figure | None:
    """`key` of each run's `source` records ("metrics" or "evals") for the groups that logged it,
    laid out by plot_panels.py (a group keeps its style of the whole report, so it reads the same
    in every figure); None if no run has it."""
    curves = {
        g.label: [(run, _series(getattr(run, source), key)) for run in g.runs] for g in groups
    }
    drawn = [g for g in groups if any(points for _, points in curves[g.label])]
    if not drawn:
        return None
    layout = panels(drawn, reference)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    styles = figure_styles(groups, reference)
    columns = min(3, len(layout))
    rows = -(-len(layout) // columns)
    legend_columns = 2 if columns == 3 else 1  # long labels: two side by side need the width
    legend_rows = -(-len(drawn) // legend_columns)
    width = 7.0 if len(layout) == 1 else 4.3 * columns
    size = (width, (4.2 if len(layout) == 1 else 2.9 * rows) + 0.22 * legend_rows)
    figure = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    handles: dict[str, Any] = {}
    for axes, panel in zip(grid.flat, layout, strict=False):
        for group in panel.groups:
            _group_lines(axes, group.label, curves[group.label], styles[group.label], handles)
        if panel.title:
            axes.set_title(_wrapped(panel.title), fontsize=8)
        axes.grid(alpha=0.3)
    for number, axes in enumerate(grid.flat):
        if number >= len(layout):
            axes.set_visible(False)
        elif number + columns >= len(layout):  # nothing drawn below it: it carries the step axis
            axes.xaxis.set_tick_params(labelbottom=True)
            axes.set_xlabel("step")
    for axes in grid[:, 0]:
        axes.set_ylabel(label)
    figure.suptitle(f"{label}: mean over finished seeds, band = 95 % CI", fontsize=10)
    figure.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize=8,
                  ncols=legend_columns, frameon=False)  # fmt: skip
    return figure


def figure_styles(groups: list[Group], reference: str | None = None) -> dict[str, Style]:
    """Each group's style in a figure: the reference group black and solid (it is in every panel
    of a comparison layout, so it reads the same everywhere and no other group shares its
    colour), the others the cycle of plot_styles.py in their order."""
    others = [group for group in groups if group.label != reference]
    styles = {group.label: style_of(index) for index, group in enumerate(others)}
    if len(others) < len(groups):
        styles[str(reference)] = REFERENCE_STYLE
    return styles


def _wrapped(title: str, width: int = 55) -> str:
    """A panel title on lines of at most `width` characters, broken between words only."""
    return "\n".join(
        "\n".join(textwrap.wrap(line, width, break_long_words=False)) for line in title.split("\n")
    )


def _group_lines(
    axes: Any, label: str, runs: list[tuple[Run, Series]], style: Style, handles: dict[str, Any]
) -> None:
    """One group's mean and band, and each of its unfinished runs; their legend entries into
    `handles` (one per label, whichever panel drew it first)."""
    finished = [points for run, points in runs if run.finished and points]
    if finished:
        line = _mean_and_band(axes, finished, style)
        handles.setdefault(f"{label}{style.note}", line)
    unfinished = [points for run, points in runs if not run.finished and points]
    for points in unfinished:
        steps = sorted(points)
        line, = axes.plot(steps, [points[s] for s in steps], color=style.colour,
                          linestyle=style.line_style, marker="x", markersize=4, linewidth=0.8,
                          alpha=0.7)  # fmt: skip
        handles.setdefault(f"{label} (not finished)", line)


def _mean_and_band(axes: Any, runs: list[Series], style: Style) -> Any:
    steps = sorted({step for points in runs for step in points})
    points = [estimate(points.get(s) for points in runs) for s in steps]
    means = [p.mean for p in points if p is not None]
    (line,) = axes.plot(
        steps, means, color=style.colour, linestyle=style.line_style, marker=style.marker
    )
    if any(p is not None and p.half_width is not None for p in points):
        half = [p.half_width or 0.0 for p in points if p is not None]
        low = [m - h for m, h in zip(means, half, strict=True)]
        high = [m + h for m, h in zip(means, half, strict=True)]
        axes.fill_between(steps, low, high, color=style.colour, alpha=0.15, linewidth=0)
    return line
