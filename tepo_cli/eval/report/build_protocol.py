"""`tepo report RUNS_DIR --protocol PROTOCOL.yaml`: load, check, compute, write, print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report import render_protocol
from tepo_cli.eval.report.grouping import Group
from tepo_cli.eval.report.machines import setup_note
from tepo_cli.eval.report.plots import write_plots
from tepo_cli.eval.report.protocol_report import ProtocolReport, check, protocol_report
from tepo_cli.eval.report.registration import registration
from tepo_cli.eval.report.run_history import (
    experiment_events,
    read_journals,
    reused_journals,
    run_histories,
)
from tepo_cli.eval.report.runs import Run, find_runs, load_run
from tepo_cli.protocol.early_stop import declared_stop
from tepo_cli.protocol.reuse import reused_runs
from tepo_cli.protocol.spec import Protocol, load_protocol

MARKDOWN = "report_protocol.md"
CSV = "report_protocol.csv"
RUNS_CSV = "report_protocol_runs.csv"


def build_protocol_report(
    root: Path,
    protocol_path: Path,
    out: Path | None = None,
    console: Console | None = None,
    interim: bool = False,
    plots: bool = True,
    seeds: list[int] | None = None,
) -> tuple[ProtocolReport, list[Path]]:
    """Verdicts of the protocol's primaries over the runs under `root`, and how each run went
    (the journal `tepo protocol run` keeps beside them: run_history.py); writes report_protocol.md,
    report_protocol.csv and report_protocol_runs.csv (each run's values) into `out` (default
    `root`), and each arm's curves as PNG plots when `plots`. The protocol is checked against
    the report's metrics before anything is read or written; ConfigError (one paragraph)
    otherwise.
    Until every registered run is in, nothing is written or shown unless `interim`: then every
    table is labelled as an interim look. `seeds`: the comparisons over those registered seeds
    only (a subset a deviation declares, e.g. the seeds whose arms trained on one machine), every
    table labelled so; it too waits for every registered run. A reused arm's runs (`reuse:`)
    that `root` lacks are read where the protocol they come from published them. An early stop
    its journal declares (`tepo protocol stop`) makes the kept seeds' runs the ones it waits for
    and compares, every table labelled with the stop; the dropped runs' tries stay in the history."""
    protocol = load_protocol(protocol_path)
    check(protocol, protocol_path)
    if not root.is_dir():
        raise ConfigError(
            f"{root} is not a directory. Give the directory holding the protocol's runs "
            "({arm}_seed{seed}/, as `tepo protocol run` writes them). Nothing was written."
        )
    every_reused = reused_runs(protocol, protocol_path)
    runs, journals = _runs_and_journals(root, protocol, every_reused)
    stop = declared_stop(journals, protocol)
    registered = [run.name for run in protocol.runs()]
    protocol = stop.applied(protocol) if stop else protocol
    report = protocol_report(protocol, runs, protocol_path, seeds)
    report.stopped = stop.label if stop else ""
    if not any(report.arms.values()) and not report.unfinished:
        raise ConfigError(
            f"no run of protocol {protocol.name!r} under {root}: its runs are directories named "
            f"{{arm}}_seed{{seed}} (e.g. {protocol.runs()[0].name}). Nothing was written."
        )
    if report.runs_in and not interim:
        raise ConfigError(_not_yet(protocol.name, protocol_path, report, every_reused))
    arms = {arm: list(runs.values()) for arm, runs in report.arms.items()}
    report.machines = setup_note([run for runs in arms.values() for run in runs], arms)
    report.history = run_histories(journals, registered, protocol.commit)
    report.deviations = experiment_events(journals)
    report.registration = registration(protocol_path, journals)
    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    groups = [Group(arm, {"arm": arm}, runs) for arm, runs in arms.items() if runs]
    images = write_plots(groups, out) if plots else []
    markdown = render_protocol.markdown(report, protocol_path, images)
    (out / MARKDOWN).write_text(markdown, encoding="utf-8")
    render_protocol.write_csv(out / CSV, report)
    render_protocol.write_runs_csv(out / RUNS_CSV, report)
    if console is not None:
        render_protocol.print_protocol(console, report)
    return report, [out / MARKDOWN, out / CSV, out / RUNS_CSV, *images]


def _runs_and_journals(
    root: Path, protocol: Protocol, every_reused: dict[str, Path]
) -> tuple[list[Run], list[list[dict[str, Any]]]]:
    """The runs under `root` and the reused ones it lacks, and the journals beside them."""
    run_dirs = find_runs(root)
    runs = [load_run(path, root) for path in run_dirs]
    here = {path.name for path in run_dirs}
    reused = {name: path for name, path in every_reused.items()
              if name not in here and path.is_dir()}  # fmt: skip
    runs += [load_run(path, path.parent) for path in reused.values()]
    journals = read_journals(root, run_dirs) + reused_journals(reused, set(protocol.reuse))
    return runs, journals


def _not_yet(
    name: str, protocol_path: Path, report: ProtocolReport, reused: dict[str, Path]
) -> str:
    lists = [("not found", report.missing), ("not finished", report.unfinished)]
    lists.append(("excluded", report.excluded))
    waiting = "; ".join(f"{what}: {', '.join(runs)}" for what, runs in lists if runs)
    awaited = [run for run in report.missing if run in reused]
    elsewhere = (
        f" ({', '.join(awaited)}: reused, trained by the protocol that publishes them in "
        f"{reused[awaited[0]].parent})"
        if awaited
        else ""
    )
    return (
        f"protocol {name!r}: {report.runs_in} are finished ({waiting}). The registered analysis "
        f"reads the outcomes once every run is in: finish them with `tepo protocol run "
        f"{protocol_path}`{elsewhere}, or pass --interim to compute the verdicts now, every "
        "table labelled as an interim look (one the protocol did not register: list it among "
        "its deviations). Nothing was written or shown."
    )
