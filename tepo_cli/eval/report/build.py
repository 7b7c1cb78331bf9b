"""`tepo report`: read every run under a directory, write the tables and plots, print the tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report import render, render_compare
from tepo_cli.eval.report.compare import Difference, compare_groups
from tepo_cli.eval.report.dynamics import DynamicsRow, Reference, build_dynamics, matching_groups
from tepo_cli.eval.report.grouping import Group, group_runs
from tepo_cli.eval.report.machines import moved_note, setup_note
from tepo_cli.eval.report.plots import write_plots
from tepo_cli.eval.report.resumes import resumed_note, resumes_note
from tepo_cli.eval.report.rows import GroupRow, Options, RunRow, build_rows
from tepo_cli.eval.report.runs import Run, find_runs, load_run
from tepo_cli.eval.report.selection import select_groups
from tepo_cli.eval.report.terminal import Spec, print_fitted

MARKDOWN = "report.md"
GROUPS_CSV = "report.csv"
RUNS_CSV = "report_runs.csv"
CURVE_CSV = "report_eval_curve.csv"
COMPARE_CSV = "report_compare.csv"


@dataclass
class Report:
    swept: list[str]
    groups: list[GroupRow]
    runs: list[RunRow]
    reference: Reference | None = None
    dynamics: list[DynamicsRow] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    no_reference: str | None = None  # why there is no "Against the reference" (reference_note)
    machines: str | None = None  # several machines, or a group in two precisions (machines.py)
    resumes: str | None = None  # the runs that resumed from a checkpoint (resumes.py)


def build_report(
    root: Path,
    out: Path | None = None,
    options: Options | None = None,
    plots: bool = True,
    console: Console | None = None,
) -> Report:
    """Read the runs at or under `root`; write report.md, report.csv, report_runs.csv and the
    PNG plots into `out` (default: `root`); print the tables to `console` when given.

    Raises ConfigError (one paragraph) when `root` is not a directory or holds no run.
    """
    options = options or Options(reference_given=False)  # as `tepo report DIR` alone
    if not root.is_dir():
        raise ConfigError(
            f"{root} is not a directory. Give a run directory (outputs/train/<date>/<time>) or a "
            "multirun directory (multirun/train/<date>/<time>) written by `tepo train`. "
            "Nothing was written."
        )
    paths = find_runs(root)
    if not paths:
        raise ConfigError(
            f"no runs found under {root}: a run directory holds what `tepo train` writes "
            "(.hydra/, config.yaml, metrics.jsonl, status.json), and a multirun directory one such "
            "directory per job. Nothing was written."
        )
    runs = [load_run(path, root) for path in paths]
    _check_threshold_key(runs, options.threshold_key)
    for run in runs:
        run.notes += [note for note in (moved_note(run), resumed_note(run)) if note]
    swept, groups = _chosen(*group_runs(runs), options)
    group_rows, run_rows = build_rows(groups, options)
    reference, dynamics = build_dynamics(groups, options)
    differences = compare_groups(groups, reference, options.last, options.fractions)
    report = Report(swept, group_rows, run_rows, reference, dynamics, differences)
    report.no_reference = reference_note(groups, options) if reference is None else None
    report.machines = setup_note(runs, {group.label: group.runs for group in groups})
    report.resumes = resumes_note(runs)
    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    label = reference.label if reference is not None else None
    images = write_plots(groups, out, label) if plots else []
    (out / MARKDOWN).write_text(_markdown(root, report, options, images), encoding="utf-8")
    render.write_csv_groups(out / GROUPS_CSV, group_rows, swept, options)
    render.write_csv_runs(out / RUNS_CSV, run_rows)
    render.write_csv_curve(out / CURVE_CSV, dynamics)
    render_compare.write_csv_compare(out / COMPARE_CSV, differences)
    tables = [out / MARKDOWN, out / GROUPS_CSV, out / RUNS_CSV, out / CURVE_CSV, out / COMPARE_CSV]
    report.files = [*tables, *images]
    if console is not None:
        _print(console, report, options)
    return report


def _print(console: Console, report: Report, options: Options) -> None:
    """The tables on the terminal, fitted to its width (terminal.py)."""
    reference, dynamics = report.reference, report.dynamics
    specs = [
        Spec("Groups", render.group_columns(options), report.groups, render.legend(options)),
        Spec("Runs", render.run_columns(options), report.runs),
        Spec(
            "Learning dynamics",
            render.dynamics_columns(reference, options),
            dynamics,
            render.dynamics_legend(reference, options),
        ),
        Spec(
            "Held-out accuracy by step",
            render.curve_columns(dynamics),
            list(dynamics) if any(row.curve for row in dynamics) else [],
        ),
        Spec(
            "Against the reference",
            render_compare.compare_columns(),
            report.differences,
            render_compare.compare_legend(reference),
        ),
    ]
    print_fitted(console, specs, [row.group.label for row in report.groups])
    if report.no_reference:
        console.print(f"[bold]Against the reference[/bold]: {report.no_reference}", highlight=False)
    if report.machines:
        console.print(f"[bold]Machines[/bold]: {report.machines}", highlight=False)
    if report.resumes:
        console.print(f"[bold]Resumed[/bold]: {report.resumes}", highlight=False)


def reference_note(groups: list[Group], options: Options) -> str | None:
    """Why the comparison tables are missing where the default reference names several groups
    (an explicit --reference doing so is refused: dynamics.find_reference); None otherwise."""
    if not options.reference or options.reference_given:
        return None
    matching = matching_groups(groups, options.reference)
    if len(matching) < 2:
        return None
    labels = ", ".join(repr(group.label) for group in matching)
    return (
        f"none: the default reference {options.reference!r} matches {len(matching)} groups "
        f"({labels}), so there are no steps to a level and no comparison with it. Name one "
        f"with --reference, e.g. --reference {matching[0].label!r}."
    )


def _chosen(
    swept: list[str], groups: list[Group], options: Options
) -> tuple[list[str], list[Group]]:
    """The groups `--groups` chooses, plus the one a `--reference` named (selection.py)."""
    chosen = select_groups(groups, options.groups)
    if options.reference and options.reference_given:
        kept = matching_groups(groups, options.reference)
        chosen = [group for group in groups if group in chosen or group in kept]
    return swept, chosen


def _check_threshold_key(runs: list[Run], key: str) -> None:
    """A mistyped --threshold-key would read as "not reached" everywhere: refuse it instead."""
    logged = {name for run in runs for record in run.metrics for name in record}
    if logged and key not in logged:
        raise ConfigError(
            f"--threshold-key {key!r} is not a key of any run's metrics.jsonl; the keys logged are: "
            f"{', '.join(sorted(logged))}. Nothing was written."
        )


def _markdown(root: Path, report: Report, options: Options, images: list[Path]) -> str:
    swept = ", ".join(f"`{key}`" for key in report.swept) or "nothing (one group)"
    parts = [
        f"# tepo report: {root}",
        "",
        f"{len(report.runs)} runs in {len(report.groups)} groups; swept: {swept}. Values are "
        + render.legend(options),
        "",
        *([report.machines, ""] if report.machines else []),
        *([report.resumes, ""] if report.resumes else []),
        render.markdown_table(render.group_columns(options), report.groups),
        "",
        "## Runs",
        "",
        render.markdown_table(render.run_columns(options), report.runs),
        "",
        "## Learning dynamics",
        "",
        render.dynamics_legend(report.reference, options),
        "",
        render.markdown_table(render.dynamics_columns(report.reference, options), report.dynamics),
        "",
        "## Held-out accuracy by step",
        "",
        "mean ± 95 % CI over the finished runs of a group (step 0: before training).",
        "",
        render.markdown_table(render.curve_columns(report.dynamics), report.dynamics),
    ]
    if report.no_reference:
        parts += ["", "## Against the reference", "", report.no_reference]
    if report.differences:
        parts += [
            "",
            "## Against the reference",
            "",
            render_compare.compare_legend(report.reference),
            "",
            render.markdown_table(render_compare.compare_columns(), report.differences),
        ]
    if images:
        parts += ["", "## Curves", ""]
        parts += [f"![{image.stem}]({image.name})" for image in images]
    return "\n".join(parts) + "\n"
