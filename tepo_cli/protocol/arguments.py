"""`tepo protocol`'s arguments: `run` (what it trains, where, and the modes beside training),
`power` (what the protocol's seeds can detect, from runs made earlier: eval/report/design_power.py)
and `stop` (an early end after whole seeds, journaled: protocol/early_stop.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

USAGE = (
    "tepo protocol run PROTOCOL.yaml [--runs-dir DIR] [--results-dir DIR] [--only REGEX] "
    "[--time-limit MINUTES] [--list] [--status] [--dry-run] [--pilot STEPS] "
    "[--rerun RUN [--rerun-steps N]]"
)
POWER_USAGE = (
    "tepo protocol power PROTOCOL.yaml --from DIR [--from DIR ...] [--effect CLAIM=VALUE ...] "
    "[--markdown]"
)
RESULTS_HELP = "the published records and journal.jsonl (default runs/ beside the protocol file)"
STOP_USAGE = "tepo protocol stop PROTOCOL.yaml --seeds S,S,... --reason TEXT [--results-dir DIR]"


@dataclass(frozen=True)
class Options:
    protocol: Path
    runs_dir: Path
    results_dir: Path
    only: str | None
    time_limit: float | None
    list_only: bool
    dry_run: bool
    status: bool
    pilot: int | None
    rerun: str | None
    rerun_steps: int
    allow_commit_mismatch: bool
    allow_protocol_change: bool


def parser() -> argparse.ArgumentParser:
    """`tepo protocol`'s arguments (its commands: `run`, `power` and `stop`)."""
    parser = argparse.ArgumentParser(
        prog="tepo protocol",
        description="Pre-registered experiments (docs/guides/protocols.md).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{run,power,stop}")
    run = commands.add_parser(
        "run",
        usage=USAGE,
        help="train the protocol's runs, interleaved and resumable",
        description=(
            "Train every run of PROTOCOL.yaml in its registered order, one at a time. Run it "
            "again after any interruption: published runs are skipped, the unfinished one "
            "resumes from its last checkpoint."
        ),
    )
    run.add_argument("protocol", type=Path, metavar="PROTOCOL.yaml")
    run.add_argument(
        "--runs-dir",
        type=Path,
        metavar="DIR",
        help="where the runs train (default multirun/<protocol name>)",
    )
    run.add_argument(
        "--results-dir",
        type=Path,
        metavar="DIR",
        help=RESULTS_HELP,
    )
    run.add_argument("--only", metavar="REGEX", help="only the runs whose name matches REGEX")
    run.add_argument(
        "--time-limit",
        type=_minutes,
        metavar="MINUTES",
        help="stop before MINUTES from this command's start (a scheduler's wall time): each run "
        "gets what is left as trainer.time_limit_minutes and stops at a step with a "
        "checkpoint; no run starts once it is spent; exit 143, the same command resumes",
    )
    _add_modes(run)
    _add_power(commands)
    _add_stop(commands)
    return parser


def _add_stop(commands: argparse._SubParsersAction) -> None:
    stop = commands.add_parser(
        "stop",
        usage=STOP_USAGE,
        help="end the experiment early after whole seeds, as a journaled deviation",
        description=(
            "Declare, before reading any outcome, that the experiment ends with --seeds: each "
            "arm's run of every kept seed finished and published. Journaled with --reason; then "
            "`tepo protocol run` trains no run of the other seeds and `tepo report --protocol` "
            "compares the kept ones, every table labelled with the stop."
        ),
    )
    stop.add_argument("protocol", type=Path, metavar="PROTOCOL.yaml")
    stop.add_argument(
        "--seeds", type=_seeds, required=True, metavar="S,S,...", help="the seeds kept"
    )
    stop.add_argument("--reason", required=True, help="why, in one sentence (journaled)")
    stop.add_argument("--results-dir", type=Path, metavar="DIR", help=RESULTS_HELP)


def _add_power(commands: argparse._SubParsersAction) -> None:
    power = commands.add_parser(
        "power",
        usage=POWER_USAGE,
        help="what the protocol's runs can detect, at the spread of runs made earlier",
        description=(
            "Before the first run: for each claim of PROTOCOL.yaml, the smallest true difference "
            "its runs per arm find with 80 % power at the claim's level, at the seed-to-seed "
            "spread of the finished runs under --from (pooled within their groups); with "
            "--effect, the power at that difference and the runs per arm for 80 %. For "
            'protocol.md\'s "what the design can see" (docs/guides/protocols.md).'
        ),
    )
    power.add_argument("protocol", type=Path, metavar="PROTOCOL.yaml")
    power.add_argument(
        "--from",
        dest="prior",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="runs made earlier, as `tepo report` reads them (a sweep, a pilot, another "
        "experiment's published runs); repeat to pool several",
    )
    power.add_argument(
        "--effect",
        action="append",
        default=[],
        metavar="CLAIM=VALUE",
        help="a difference treatment − control on the claim's metric (in its direction): the "
        "power at it and the runs per arm that reach 80 %%; repeat for several claims",
    )
    power.add_argument(
        "--markdown", action="store_true", help="print a Markdown table (for protocol.md)"
    )


def parse_power(argv: list[str]) -> argparse.Namespace:
    """`tepo protocol power`'s command line (the words after `power`)."""
    return parser().parse_args(["power", *argv])


def parse_stop(argv: list[str]) -> argparse.Namespace:
    """`tepo protocol stop`'s command line (the words after `stop`)."""
    return parser().parse_args(["stop", *argv])


def parse(argv: list[str]) -> Options:
    """The command line as Options (each field is the argument of its name)."""
    args = parser().parse_args(argv)
    return Options(**{field.name: getattr(args, field.name) for field in fields(Options)})


def _add_modes(run: argparse.ArgumentParser) -> None:
    """What `run` does besides training (list, status, dry run) and the deviations it allows."""
    run.add_argument(
        "--list", dest="list_only", action="store_true", help="print the runs and their overrides"
    )
    run.add_argument(
        "--status",
        action="store_true",
        help="where each run stands (published, its step and checkpoint, or not started), "
        "with no metric but steps and seconds: watch the experiment without reading outcomes",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="validate every run's config, train nothing"
    )
    run.add_argument(
        "--pilot",
        type=_steps,
        metavar="STEPS",
        help="before the runs: each arm's first run for STEPS steps at a seed no run uses, not "
        "evaluated, killed and deleted; says only its seconds and memory (journaled)",
    )
    run.add_argument(
        "--rerun",
        metavar="RUN",
        help="train a published run again from its own overrides until --rerun-steps, and say "
        "how many of its records come out equal (which keys differ, never a value; journaled)",
    )
    run.add_argument(
        "--rerun-steps",
        type=_steps,
        default=3,
        metavar="N",
        help="the steps a --rerun trains and compares (default 3)",
    )
    run.add_argument(
        "--allow-commit-mismatch",
        action="store_true",
        help="run at a commit other than the protocol's (journaled as a deviation)",
    )
    run.add_argument(
        "--allow-protocol-change",
        action="store_true",
        help="go on after the protocol file changed since its runs started (journaled)",
    )


def _minutes(text: str) -> float:
    try:
        minutes = float(text)
    except ValueError:
        minutes = 0.0
    if not minutes > 0 or minutes == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes (above 0)")
    return minutes


def _steps(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps (1 or more)")
    return int(text)


def _seeds(text: str) -> list[int]:
    parts = text.split(",")
    if not all(part.strip().lstrip("-").isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of seeds (integers, S,S,...)")
    return [int(part) for part in parts]
