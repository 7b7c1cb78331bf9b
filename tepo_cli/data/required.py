"""A benchmark script's prepared data, checked before it starts anything.

Without this `scripts/bench_step.py --job long` on a machine where MATH-500 was never prepared
started each side, which failed seconds later, and went on to report "failed, 0 steps": a
benchmark that measured nothing and said so in a table. A script calls `require_prepared` first
and stops with one paragraph naming the missing file and the command that makes it.

`tepo data check NAME[:SPLIT]... [--for WHO]` does the same for a shell script (exit 0: all
there; 2: the paragraph).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from tepo_cli.data.prepare import benchmark_names, prepared_file, problem_with

EXIT_CODE = 2


def missing_data(needed: Iterable[tuple[str, str]], who: str) -> str | None:
    """One paragraph on the prepared splits `needed` ((benchmark, split) pairs) that cannot be
    read here; None when every one can."""
    missing = [(name, split, why) for name, split in needed if (why := problem_with(name))]
    if not missing:
        return None
    files = "; ".join(
        f"{prepared_file(name, split)} ({name}'s {split} split: {why})"
        for name, split, why in missing
    )
    names = ",".join(dict.fromkeys(name for name, _, _ in missing))
    return (
        f"{who}: the prepared data it needs is not on this machine: {files}. Make it once with "
        f"`tepo data prepare benchmark={names}` (it downloads pinned wheels from the package "
        f"index into $TEPO_CACHE, default ~/.cache/tepo), then run this again. Nothing was run."
    )


def require_prepared(needed: Iterable[tuple[str, str]], who: str) -> None:
    """Exit with status 2 and the paragraph on stderr when some of `needed` is missing."""
    message = missing_data(needed, who)
    if message is not None:
        print(message, file=sys.stderr)
        sys.exit(EXIT_CODE)


def check_command(arguments: list[str]) -> int:
    """`tepo data check NAME[:SPLIT]... [--for WHO]`: 0 when each prepared split is readable,
    else 2 and the paragraph (WHO: the script named in it, default `tepo data check`)."""
    who = "tepo data check"
    if "--for" in arguments:
        at = arguments.index("--for")
        who = " ".join(arguments[at + 1 : at + 2]) or who
        arguments = arguments[:at] + arguments[at + 2 :]
    if not arguments:
        print("usage: tepo data check NAME[:SPLIT] ... [--for WHO]", file=sys.stderr)
        return EXIT_CODE
    needed = [_pair(spec) for spec in arguments]
    unknown = sorted({name for name, _ in needed} - set(benchmark_names()))
    if unknown:
        print(
            f"{who}: {', '.join(unknown)} is not a benchmark `tepo data prepare` makes; those "
            f"are: {', '.join(benchmark_names())}.",
            file=sys.stderr,
        )
        return EXIT_CODE
    message = missing_data(needed, who)
    if message is None:
        return 0
    print(message, file=sys.stderr)
    return EXIT_CODE


def _pair(spec: str) -> tuple[str, str]:
    """`mbpp` (its test split) or `math500:train`."""
    name, _, split = spec.partition(":")
    return name, split or "test"
