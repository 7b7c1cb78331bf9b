"""`tepo report DIR [options]`: argument parsing and exit codes (the work is in build.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.build import build_report
from tepo_cli.eval.report.rows import Options

DESCRIPTION = """\
Summarise a run or a multirun sweep: runs are grouped by the overrides that differ between them
(not by seed: seeds are the repeats; nor by resume or what a run records but does not train,
e.g. trainer.eval_before), and each group gets mean ± 95 % CI over its finished runs. Crashed,
failed, interrupted and running runs are listed with their state. Writes report.md, report.csv
(groups), report_runs.csv and plot_*.png into DIR (or --out)."""

DEFAULT_REFERENCE = "algo=grpo"  # where a sweep holds several GRPO groups: no reference


def _add_level_options(parse: argparse.ArgumentParser) -> None:
    """The options of 'steps to reach' a level and of the final reward, in --help's order."""
    parse.add_argument(
        "--threshold", type=float, default=0.5, help="level for 'steps to reach' (default 0.5)"
    )
    parse.add_argument(
        "--threshold-key",
        default="accuracy",
        help="metrics.jsonl key compared with --threshold (default: accuracy, the share of\n"
        "correct samples, comparable across objectives; reward_mean is not: DAPO's rewards\n"
        "are ±1 plus an overlong penalty)",
    )
    parse.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="compare the trailing mean of this many steps with the threshold (default 1: raw)",
    )
    parse.add_argument(
        "--last", type=int, default=5, help="final reward = mean of the last N steps (default 5)"
    )
    parse.add_argument(
        "--reference",
        default=None,
        help="the group (key=value ...) whose best mean held-out accuracy the --fractions are of,\n"
        "for steps to a level (TEPO's convergence time); 'none': no such columns\n"
        "(default algo=grpo where that names one group; a named one that names several\n"
        "is refused)",
    )
    parse.add_argument(
        "--fractions",
        default="0.5,0.9",
        help="fractions of the reference's best held-out accuracy (default 0.5,0.9)",
    )
    parse.add_argument(
        "--levels",
        choices=("best", "gain"),
        default="best",
        help="best: the --fractions are of the reference's best held-out accuracy; gain: of its\n"
        "gain from before training to its best (for models that start well above 0)",
    )


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="tepo report", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    parse.add_argument(
        "directory",
        type=Path,
        metavar="DIR",
        nargs="?",
        help="a run directory or a multirun directory (with --protocol, by default runs/ beside\n"
        "the protocol file, where `tepo protocol run` publishes its runs)",
    )
    parse.add_argument(
        "--out", type=Path, metavar="DIR", help="where to write the files (default: DIR)"
    )
    _add_level_options(parse)
    parse.add_argument(
        "--groups",
        metavar="NAME,...|REGEX",
        help="the groups to draw and table: labels as the report prints them, separated by\n"
        "commas, or a regular expression searched for in each label, e.g. 'algo=(grpo|tepo)'\n"
        "(default: all; a group named by --reference is always kept)",
    )
    parse.add_argument("--no-plots", action="store_true", help="tables only")
    parse.add_argument(
        "--protocol",
        type=Path,
        metavar="PROTOCOL.yaml",
        help="a pre-registered protocol: compute exactly its primary claims and print their\n"
        "verdicts (Holm-adjusted one-sided p), then its secondaries as exploratory; runs are\n"
        "the directories named {arm}_seed{seed} under DIR. Writes report_protocol.md/.csv;\n"
        "refused until every registered run is finished (see --interim)",
    )
    parse.add_argument(
        "--interim",
        action="store_true",
        help="with --protocol: compute the verdicts before every registered run is in, each\n"
        "table labelled INTERIM (a look the protocol did not register)",
    )
    parse.add_argument(
        "--seeds",
        metavar="S,S,...",
        help="with --protocol: compare the arms over these registered seeds only (a subset a\n"
        "deviation declares, e.g. those whose runs share a machine), each table labelled\n"
        "SUBSET; gates still read their registered seeds",
    )
    return parse


def main(arguments: list[str]) -> int:
    args = parser().parse_args(arguments)
    if args.smooth < 1 or args.last < 1:
        print("tepo report: --smooth and --last must be at least 1.", file=sys.stderr)
        return 2
    try:
        fractions = tuple(float(f) for f in args.fractions.split(",") if f.strip())
    except ValueError:
        fractions = ()
    if not fractions or not all(0 < f <= 1 for f in fractions):
        print(
            f"tepo report: --fractions {args.fractions!r} must be numbers in (0, 1] separated by "
            "commas, e.g. 0.5,0.9.",
            file=sys.stderr,
        )
        return 2
    if args.interim and args.protocol is None:
        print("tepo report: --interim labels a pre-registered protocol's verdicts; it needs "
              "--protocol PROTOCOL.yaml. Nothing was written.", file=sys.stderr)  # fmt: skip
        return 2
    if args.seeds is not None and args.protocol is None:
        print("tepo report: --seeds compares a pre-registered protocol's arms over some of its "
              "seeds; it needs --protocol PROTOCOL.yaml. Nothing was written.", file=sys.stderr)  # fmt: skip
        return 2
    if args.protocol is not None:
        return _protocol(args)
    if args.directory is None:
        print("tepo report: give DIR, a run directory or a multirun directory written by `tepo "
              "train` (only with --protocol does it default, to runs/ beside the protocol file). "
              "Nothing was written.", file=sys.stderr)  # fmt: skip
        return 2
    given = args.reference is not None
    wanted = args.reference if given else DEFAULT_REFERENCE
    reference = None if wanted.lower() in ("", "none") else wanted
    options = Options(
        args.threshold,
        args.threshold_key,
        args.smooth,
        args.last,
        reference,
        fractions,
        gain=args.levels == "gain",
        reference_given=given,
        groups=args.groups,
    )
    console = Console()
    if not console.is_terminal:
        console.width = 160  # a log file or a pipe: keep each row on one line
    try:
        report = build_report(args.directory, args.out, options, not args.no_plots, console)
    except ConfigError as error:
        print(f"tepo report: {error}", file=sys.stderr)
        return 2
    _say_wrote(console, report.files)
    return 0


def _protocol(args: argparse.Namespace) -> int:
    from tepo_cli.eval.report.build_protocol import build_protocol_report
    from tepo_cli.protocol.spec import published_dir

    try:
        seeds = None if args.seeds is None else [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"tepo report: --seeds {args.seeds!r} must be seeds of the protocol, integers "
              "separated by commas, e.g. 13,14. Nothing was written.", file=sys.stderr)  # fmt: skip
        return 2
    console = Console()
    if not console.is_terminal:
        console.width = 160
    try:
        root = args.directory or published_dir(args.protocol)
        _, files = build_protocol_report(
            root, args.protocol, args.out, console, args.interim, not args.no_plots, seeds
        )
    except ConfigError as error:
        print(f"tepo report: {error}", file=sys.stderr)
        return 2
    _say_wrote(console, files)
    return 0


def _say_wrote(console: Console, files: list[Path]) -> None:
    """The files written, on one line however long: paths to copy, as they are (no markup)."""
    line = f"wrote {', '.join(str(path) for path in files)}"
    console.print(line, highlight=False, markup=False, soft_wrap=True)
