"""The protocol's verdict table and its exploratory results: terminal, Markdown and CSV."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from tepo_cli.eval.report.censored import Time
from tepo_cli.eval.report.dynamics import group_curve
from tepo_cli.eval.report.protocol_metrics import STEPS_TO_LEVEL
from tepo_cli.eval.report.protocol_report import (
    ClaimResult,
    ProtocolReport,
    RunValues,
    power_family,
)
from tepo_cli.eval.report.render import markdown_table, step_columns
from tepo_cli.eval.report.run_history import HISTORY_LEGEND, history_columns
from tepo_cli.eval.report.terminal import Spec, print_fitted

NONE = "—"


def _digits(row: ClaimResult) -> int:
    return 1 if row.metric == STEPS_TO_LEVEL else 3


def _estimate(row: ClaimResult) -> str:
    value = row.result.estimate
    return NONE if value is None else f"{value:+.{_digits(row)}f}"


def _interval(row: ClaimResult) -> str:
    result = row.result
    if result.low is None or result.high is None:
        return f"none ({result.note})" if result.note else "none"
    digits = _digits(row)
    return f"[{result.low:+.{digits}f}, {result.high:+.{digits}f}] ({result.level:.0%})"


def _p(value: float | None) -> str:
    if value is None:
        return NONE
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def _test(row: ClaimResult) -> str:
    """The test, with what it ran over where that is not runs (problems for per_problem)."""
    result = row.result
    shown = result.note and result.low is not None
    return f"{result.test} ({result.note})" if shown else result.test


def _n(row: ClaimResult) -> str:
    return f"{row.result.n_treatment} / {row.result.n_control}"


def _what(row: ClaimResult) -> str:
    return f"{row.metric}: {row.treatment} − {row.control} ({row.direction})"


def _detectable(row: ClaimResult) -> str:
    value = row.detectable
    return NONE if value is None else f"{value:.{_digits(row)}f}"


def verdict_columns(correction: str) -> list[tuple[str, Callable[[ClaimResult], str]]]:
    return [
        ("claim", lambda r: r.name),
        ("metric", _what),
        ("test", _test),
        ("difference", _estimate),
        ("interval", _interval),
        ("n per arm", _n),
        ("detectable", _detectable),
        ("p", lambda r: _p(r.result.p)),
        (f"{correction} p", lambda r: _p(r.adjusted_p)),
        ("verdict", lambda r: r.verdict),
    ]


def exploratory_columns() -> list[tuple[str, Callable[[ClaimResult], str]]]:
    return [
        ("exploratory", lambda r: r.name),
        ("metric", _what),
        ("test", _test),
        ("difference", _estimate),
        ("interval", _interval),
        ("n per arm", _n),
        ("p (unadjusted)", lambda r: _p(r.result.p)),
    ]


def _run_value(value: float | Time | None) -> str:
    if value is None:
        return NONE
    if isinstance(value, Time):
        return f"{value.step:g}" if value.event else f"not by {value.step:g}"
    return f"{value:.3f}"


def per_run_columns(report: ProtocolReport) -> list[tuple[str, Callable[[RunValues], str]]]:
    """The run, its machine where the runs did not all record one and the same, its values."""
    columns: list[tuple[str, Callable[[RunValues], str]]] = [("run", lambda r: r.run)]
    if len({row.machine for row in report.per_run}) > 1:
        columns.append(("machine", lambda r: r.machine or "not recorded"))
    for index, header in enumerate(report.columns):
        columns.append((header, lambda r, i=index: _run_value(r.values[i])))
    return columns


PER_RUN_LEGEND = (
    "Each finished run's value of the registered metrics that are one number per run: the "
    "numbers the tests above compare (steps_to_level: the step a run reached the level, "
    '"not by N" when it was censored at N; per-problem outcomes have no one number per run).'
)


def legend(report: ProtocolReport) -> str:
    divisor = power_family(report.correction, len(report.primaries))
    return (
        f"difference: treatment − control of each run's metric (steps_to_level: restricted mean "
        f"steps, unreached runs counted at their censoring step). interval: two-sided, "
        f"1 − 2α for a one-sided claim (so it lies beyond 0 exactly when p < α = {report.alpha:g} "
        f"before correction), 1 − α for a two-sided one. n per arm: treatment / control (runs; "
        f"seed pairs for a paired test). detectable: the smallest true difference this design "
        f"finds with 80 % power at the runs' spread, at α / {divisor} (the "
        f"strictest step of the correction), so a smaller true effect could well have been missed. "
        f"p: for the declared direction. {report.correction} p: "
        f"adjusted over the {len(report.primaries)} primaries (an untestable one counts as p = 1). "
        "supported: adjusted p < α."
    )


def notes(report: ProtocolReport) -> list[str]:
    lines = [f"{row.name}: {row.gate}" for row in report.primaries if row.gate]
    counts = ", ".join(f"{arm} {len(runs)}" for arm, runs in report.arms.items())
    lines.append(f"finished runs per arm: {counts}")
    if report.missing:
        lines.append(f"missing (not found): {', '.join(report.missing)}")
    if report.unfinished:
        lines.append(f"not finished (left out): {', '.join(report.unfinished)}")
    if report.excluded:
        lines.append(f"excluded: {', '.join(report.excluded)}")
    return lines + ([report.machines] if report.machines else [])


def print_protocol(console: Console, report: ProtocolReport) -> None:
    """The verdict table, its legend and notes, the exploratory table, each run's values, then
    how each run went (the journal), each fitted to the terminal as the sweep report's tables are
    (terminal.py): no word folded, a column the same in every row said once under its table, a
    table too wide split into parts."""
    label = _label(report)
    columns = verdict_columns(report.correction)
    title = f"Protocol {report.name}: primary claims{label}"
    if report.registration:
        console.print(report.registration, highlight=False, markup=False)
    print_fitted(console, [Spec(title, columns, report.primaries, legend(report))], [])
    for line in notes(report):
        console.print(line, highlight=False)
    title = f"Exploratory (secondary, not corrected; no verdicts){label}"
    print_fitted(console, [Spec(title, exploratory_columns(), report.secondaries)], [])
    if report.per_run:
        spec = Spec(f"Per run{label}", per_run_columns(report), report.per_run, PER_RUN_LEGEND)
        print_fitted(console, [spec], [])
    if report.history:
        spec = Spec("How each run went", history_columns(), report.history, HISTORY_LEGEND)
        print_fitted(console, [spec], [])
    for line in report.deviations if report.history or report.deviations else [NO_JOURNAL]:
        console.print(line, highlight=False)


def history_lines(report: ProtocolReport) -> list[str]:
    """The journal's account (run_history.py) in Markdown: a row per run, then the deviations."""
    if not report.history and not report.deviations:
        return [NO_JOURNAL]
    deviations = ["", *(f"- {line}" for line in report.deviations)] if report.deviations else []
    return [HISTORY_LEGEND, "", markdown_table(history_columns(), report.history), *deviations]


NO_JOURNAL = (
    "No journal.jsonl beside the runs (`tepo protocol run` keeps one): their starts, resumes and "
    "crashes are not known to this report."
)


def curve_columns(report: ProtocolReport) -> list[tuple[str, Callable[[str], str]]]:
    """Held-out accuracy by step, one row per arm: mean ± 95 % CI over its finished runs."""
    curves = {arm: group_curve(list(runs.values())) for arm, runs in report.arms.items()}
    return step_columns(list(curves), "arm", lambda arm: arm, curves.__getitem__)


def _label(report: ProtocolReport) -> str:
    """What every title of a look other than the registered one carries: '' for that one."""
    return f" ({report.label})" if report.label else ""


def markdown(report: ProtocolReport, source: Path, images: list[Path] | None = None) -> str:
    parts = [
        f"# Protocol {report.name}: verdicts",
        "",
        *([f"**{report.label}.**", ""] if report.label else []),
        f"Registered in `{source}`; α = {report.alpha:g}, correction {report.correction}.",
        *(["", report.registration] if report.registration else []),
        "",
        "## Primary claims",
        "",
        markdown_table(verdict_columns(report.correction), report.primaries),
        "",
        legend(report),
        "",
        *(f"- {line}" for line in notes(report)),
    ]
    if report.secondaries:
        parts += [
            "",
            "## Exploratory",
            "",
            "Secondary claims: not part of the corrected family, no verdicts.",
            "",
            markdown_table(exploratory_columns(), report.secondaries),
        ]
    if report.per_run:
        label = _label(report)
        parts += ["", f"## Per run{label}", "", PER_RUN_LEGEND, ""]
        parts += [markdown_table(per_run_columns(report), report.per_run)]
        parts += ["", f"## Held-out accuracy by step{label}", ""]
        parts += ["Mean ± 95 % CI over each arm's finished runs (step 0: before training).", ""]
        parts += [markdown_table(curve_columns(report), [a for a, r in report.arms.items() if r])]
    parts += ["", "## How each run went", "", *history_lines(report)]
    if images:
        parts += ["", "## Curves", "", "Each arm's mean over its finished runs, 95 % band.", ""]
        parts += [f"![{image.stem}]({image.name})" for image in images]
    return "\n".join(parts) + "\n"


def write_runs_csv(path: Path, report: ProtocolReport) -> None:
    """One row per finished run: arm, seed, each per-run column's value (a censored time as its
    step, with a `reached` column beside it)."""
    fields = ["run", "arm", "seed"]
    timed = {i for row in report.per_run for i, v in enumerate(row.values) if isinstance(v, Time)}
    for index, header in enumerate(report.columns):
        fields += [header, f"{header} reached"] if index in timed else [header]
    fields.append("machine")
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for row in report.per_run:
            cells: list[object] = [row.run, row.arm, row.seed]
            for index, value in enumerate(row.values):
                if isinstance(value, Time):
                    cells += [f"{value.step:g}", value.event]
                else:
                    cells += [value, ""] if index in timed else [value]
            writer.writerow(["" if v is None else v for v in [*cells, row.machine]])


def write_csv(path: Path, report: ProtocolReport) -> None:
    fields = ["kind", "claim", "metric", "treatment", "control", "direction", "test"]
    fields += ["difference", "low", "high", "level", "n_treatment", "n_control", "p"]
    fields += ["adjusted_p", "detectable", "verdict", "note", "look"]
    look = report.label or "registered"  # a row read alone still says which analysis it is
    rows = [("primary", r) for r in report.primaries]
    rows += [("exploratory", r) for r in report.secondaries]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for kind, r in rows:
            t = r.result
            values = (
                kind, r.name, r.metric, r.treatment, r.control, r.direction, t.test, t.estimate,
                t.low, t.high, t.level, t.n_treatment, t.n_control, t.p, r.adjusted_p, r.detectable,
                r.verdict,
                "; ".join(x for x in (t.note, r.gate) if x), look,
            )  # fmt: skip
            writer.writerow(["" if v is None else v for v in values])
