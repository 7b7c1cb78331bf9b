"""The report's tables as text: rich (terminal), Markdown and CSV, from the same rows."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tepo_cli.eval.report.dynamics import DynamicsRow, Reach, Reference
from tepo_cli.eval.report.rows import GroupRow, Options, RunRow
from tepo_cli.eval.report.stats import Estimate

NONE = "—"
TEXT_COLUMNS = {"group", "runs", "run", "state", "notes", "quantity", "claim", "exploratory"}
TEXT_COLUMNS |= {"metric", "test", "verdict"}  # the protocol's verdict table
TEXT_COLUMNS |= {"ended short", "code"}  # how each run of a protocol went (run_history.py)


def _fmt(value: Estimate | float | None, digits: int) -> str:
    if value is None:
        return NONE
    if isinstance(value, Estimate):
        return value.format(digits)
    return f"{value:.{digits}f}"


def _states(row: GroupRow) -> str:
    order = sorted(row.states, key=lambda s: (s != "finished", s))
    return ", ".join(f"{row.states[s]} {s}" for s in order)


def _to_threshold(row: GroupRow, value: Estimate | None, digits: int, say: bool = True) -> str:
    if row.finished == 0:
        return NONE
    if row.reached == 0:
        return f"not reached (0/{row.finished})" if say else NONE
    text = _fmt(value, digits)
    return text if row.reached == row.finished else f"{text} ({row.reached}/{row.finished})"


def threshold_label(options: Options) -> str:
    smoothing = f", mean of {options.window} steps" if options.window > 1 else ""
    return f"{options.threshold_key} ≥ {options.threshold:g}{smoothing}"


def group_columns(options: Options) -> list[tuple[str, Callable[[GroupRow], str]]]:
    reach = threshold_label(options)
    return [
        ("group", lambda r: r.group.label),
        ("runs", _states),
        ("reward", lambda r: _fmt(r.final_reward, 3)),
        ("acc. before", lambda r: _fmt(r.accuracy_before, 3)),
        ("acc. after", lambda r: _fmt(r.accuracy_after, 3)),
        (f"steps to {reach}", lambda r: _to_threshold(r, r.steps_to, 1)),
        ("seconds to it", lambda r: _to_threshold(r, r.seconds_to, 1, say=False)),
        ("s/step", lambda r: _fmt(r.seconds_per_step, 2)),
        ("peak MB", lambda r: _fmt(r.peak_rss_mb, 0)),
    ]


def run_columns(options: Options) -> list[tuple[str, Callable[[RunRow], str]]]:
    return [
        ("run", lambda r: r.run.name),
        ("group", lambda r: r.group),
        ("seed", lambda r: str(r.run.seed)),
        ("state", lambda r: r.run.state),
        ("steps", lambda r: f"{r.steps_done}/{r.max_steps if r.max_steps is not None else '?'}"),
        ("reward", lambda r: _fmt(r.final_reward, 3)),
        ("acc. after", lambda r: _fmt(r.accuracy_after, 3)),
        ("step at threshold", lambda r: str(r.crossing.step) if r.crossing else NONE),
        ("s/step", lambda r: _fmt(r.seconds_per_step, 2)),
        ("peak MB", lambda r: _fmt(r.peak_rss_mb, 0)),
        ("notes", lambda r: "; ".join(r.run.notes)),
    ]


def _with_n(value: Estimate | None, digits: int) -> str:
    return NONE if value is None else f"{value.format(digits)} ({value.n})"


def _reach(reach: Reach, value: Estimate | None, digits: int) -> str:
    if reach.finished == 0:
        return NONE
    if reach.reached == 0:
        return f"not reached (0/{reach.finished})"
    text = _fmt(value, digits)
    return text if reach.reached == reach.finished else f"{text} ({reach.reached}/{reach.finished})"


def dynamics_columns(
    reference: Reference | None, options: Options
) -> list[tuple[str, Callable[[DynamicsRow], str]]]:
    columns: list[tuple[str, Callable[[DynamicsRow], str]]] = [
        ("group", lambda r: r.group.label),
        ("best held-out", lambda r: _fmt(r.best, 3)),
        ("held-out AUC (n)", lambda r: _with_n(r.auc, 3)),
    ]
    if reference is not None:
        for index, fraction in enumerate(options.fractions):
            level = reference.level(fraction)
            columns.append(
                (
                    f"steps to {fraction:.0%} ({level:.3f})",
                    lambda r, i=index: _reach(r.reaches[i], r.reaches[i].steps, 1),
                )
            )
            columns.append(
                ("seconds to it", lambda r, i=index: _reach(r.reaches[i], r.reaches[i].seconds, 0))
            )
            columns.append(
                (
                    "CPU s to it",
                    lambda r, i=index: _reach(r.reaches[i], r.reaches[i].cpu_seconds, 0),
                )
            )
            columns.append(
                (
                    "steps to it, censored (n)",
                    lambda r, i=index: _with_n(r.reaches[i].censored, 1),
                )
            )
    columns += [
        (f"entropy first {options.last}", lambda r: _fmt(r.entropy_first, 3)),
        (f"entropy last {options.last}", lambda r: _fmt(r.entropy_last, 3)),
        ("KL-mask share", lambda r: _fmt(r.mask_frac, 3)),
        (f"length last {options.last}", lambda r: _fmt(r.length_last, 0)),
        ("truncated", lambda r: _fmt(r.truncated_last, 3)),
    ]
    return columns


def curve_columns(rows: list[DynamicsRow]) -> list[tuple[str, Callable[[DynamicsRow], str]]]:
    return step_columns(rows, "group", lambda r: r.group.label, lambda r: r.curve)


def step_columns(
    rows: list[Any],
    header: str,
    label: Callable[[Any], str],
    curve: Callable[[Any], dict[int, Estimate]],
) -> list[tuple[str, Callable[[Any], str]]]:
    """Held-out accuracy by step: a row's label, then one column a step any row has."""
    steps = sorted({step for row in rows for step in curve(row)})
    columns: list[tuple[str, Callable[[Any], str]]] = [(header, label)]
    for step in steps:
        columns.append((f"step {step}", lambda r, s=step: _fmt(curve(r).get(s), 3)))
    return columns


def _levels_said(reference: Reference) -> str:
    best = f"{reference.best:.3f}, the best mean held-out accuracy of {reference.label} (at step "
    best += f"{reference.step})"
    if not reference.gain:
        return f"a fraction of {best}"
    return f"its start {reference.start:.3f} plus a fraction of the gain from there to {best}"


def dynamics_legend(reference: Reference | None, options: Options) -> str:
    if reference is None:
        reach = (
            f"no steps to a level: --reference {options.reference!r}"
            f"{'' if options.reference_given else ' (the default)'} names no single group with a "
            "held-out evaluation (none, or several: name one with more key=value pairs)"
            if options.reference
            else "no reference group (--reference)"
        )
    else:
        reach = (
            f"steps / seconds: the first evaluated step (training seconds to it; CPU s: the "
            f"process's CPU seconds, which other jobs on the machine inflate less) whose held-out "
            f"accuracy reaches {_levels_said(reference)}; (k/n) when only k of n runs did; censored: "
            "over all n runs, one that never reached it counted at its last evaluation (a lower "
            "bound)"
        )
    return (
        "mean ± 95 % CI over the finished runs of a group, (n) the runs it is over. best "
        "held-out: each run's best held-out accuracy; AUC: each run's mean held-out accuracy "
        f"over its evaluations after step 0; {reach}. entropy: mean token entropy of the sampled answers over the "
        f"first / last {options.last} steps; KL-mask share: TEPO's masked token share, over all "
        f"steps; length, truncated: answer tokens and truncated share, last {options.last} steps."
    )


def write_csv_curve(path: Path, rows: list[DynamicsRow]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["group", "step", "held_out_mean", "held_out_ci95", "n"])
        for row in rows:
            for step, value in sorted(row.curve.items()):
                half = "" if value.half_width is None else value.half_width
                writer.writerow([row.group.label, step, value.mean, half, value.n])


def legend(options: Options) -> str:
    """What the columns mean, under the group table and in report.md."""
    return (
        "mean ± 95 % CI (Student t) over the finished runs of a group. reward: mean reward_mean of "
        f"the last {options.last} steps; acc.: held-out greedy accuracy before / after training; "
        f"steps and seconds (training only) to the first step with {threshold_label(options)}, "
        "(k/n) when only k of n runs reached it; s/step: median step seconds; peak MB: largest "
        "peak_rss_mb of the group's runs."
    )


def markdown_table(columns: list, rows: list) -> str:
    lines = [
        "| " + " | ".join(header for header, _ in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in rows:
        cells = (get(row).replace("|", "\\|") for _, get in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv_groups(path: Path, rows: list[GroupRow], swept: list[str], options: Options) -> None:
    fields = ["group", *swept, "runs", "finished", "states"]
    metrics = ["final_reward", "accuracy_before", "accuracy_after"]
    metrics += ["steps_to_threshold", "seconds_to_threshold", "seconds_per_step"]
    for name in metrics:
        fields += [f"{name}_mean", f"{name}_ci95", f"{name}_n"]
    fields += ["threshold_reached", "peak_rss_mb", "threshold"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            record: dict[str, object] = {"group": row.group.label, **row.group.values}
            record.update(runs=sum(row.states.values()), finished=row.finished, states=_states(row))
            values = (row.final_reward, row.accuracy_before, row.accuracy_after)
            values += (row.steps_to, row.seconds_to, row.seconds_per_step)
            for name, value in zip(metrics, values, strict=True):
                record[f"{name}_mean"] = "" if value is None else value.mean
                record[f"{name}_ci95"] = (
                    "" if value is None or value.half_width is None else value.half_width
                )
                record[f"{name}_n"] = 0 if value is None else value.n
            record.update(
                threshold_reached=row.reached,
                peak_rss_mb="" if row.peak_rss_mb is None else row.peak_rss_mb,
                threshold=threshold_label(options),
            )
            writer.writerow(record)


def write_csv_runs(path: Path, rows: list[RunRow]) -> None:
    fields = ["run", "group", "seed", "state", "steps_done", "max_steps", "final_reward"]
    fields += ["accuracy_before", "accuracy_after", "steps_to_threshold", "seconds_to_threshold"]
    fields += ["seconds_per_step", "peak_rss_mb", "notes", "path"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            values = (
                row.run.name, row.group, row.run.seed, row.run.state, row.steps_done,
                row.max_steps, row.final_reward, row.accuracy_before, row.accuracy_after,
                row.crossing.step if row.crossing else None,
                row.crossing.seconds if row.crossing else None,
                row.seconds_per_step, row.peak_rss_mb, "; ".join(row.run.notes), row.run.path,
            )  # fmt: skip
            writer.writerow(
                {k: "" if v is None else v for k, v in zip(fields, values, strict=True)}
            )
