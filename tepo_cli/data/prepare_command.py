"""The `tepo data prepare [benchmark=NAME[,NAME...]|all] [force=true]` command: arguments in,
a rich table out (benchmark, split, rows, path, status)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tepo_cli.core.errors import ConfigError, RunError
from tepo_cli.core.whole_table import print_whole
from tepo_cli.data.prepare import PreparedBenchmark, benchmark_names, prepare, split_file

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_arguments(arguments: Sequence[str]) -> tuple[list[str] | None, bool, Path | None]:
    """``["benchmark=gsm8k,math", "force=true", "cache_dir=/data"]`` -> (names, force, cache)."""
    names: list[str] | None = None
    force = False
    cache_dir: Path | None = None
    for argument in arguments:
        key, sep, value = argument.partition("=")
        key = key.lstrip("+")
        if not sep:
            raise ConfigError(f"`tepo data prepare` takes key=value arguments, got '{argument}'.")
        if key in {"benchmark", "benchmarks"}:
            names = [part.strip() for part in value.strip("[]").split(",") if part.strip()]
        elif key == "force":
            if value.lower() not in _TRUE | _FALSE:
                raise ConfigError(f"force must be true or false, got '{value}'.")
            force = value.lower() in _TRUE
        elif key == "cache_dir":
            cache_dir = Path(value).expanduser()
        else:
            raise ConfigError(
                f"Unknown argument '{key}' for `tepo data prepare`; it takes "
                f"benchmark=<{'|'.join(benchmark_names())}|all> (comma-separated), "
                f"force=true|false and cache_dir=<dir> (default $TEPO_CACHE or ~/.cache/tepo)."
            )
    return names, force, cache_dir


def render_table(results: Sequence[PreparedBenchmark], console: Console) -> None:
    """One row per prepared file: benchmark, split, rows, path, status."""
    table = Table(title="tepo data prepare")
    for column in ("benchmark", "split", "rows", "path", "status"):
        justify = "right" if column == "rows" else "left"
        table.add_column(column, justify=justify, overflow="fold" if column == "path" else None)
    for result in results:
        style = "green" if result.status == "up to date" else "yellow"
        for split, rows in result.splits.items():
            path = Text(str(result.folder / split_file(split)))  # as it is: never markup
            table.add_row(result.name, split, f"{rows:,}", path, Text(result.status, style=style))
    print_whole(console, table)  # each path whole, to copy


def prepare_command(arguments: Sequence[str], console: Console | None = None) -> int:
    """Run `tepo data prepare` with `arguments`; returns the process exit status."""
    errors = console or Console(stderr=True)  # a paragraph on stderr, unless a console is given
    console = console or Console()
    try:
        names, force, cache_dir = parse_arguments(arguments)
        with console.status("preparing benchmark data") as status:
            results = prepare(
                names,
                cache_dir=cache_dir,
                force=force,
                on_event=lambda message: status.update(message),
            )
    except ConfigError as error:
        _say(errors, f"tepo data prepare: {error}")
        return 2
    except RunError as error:
        _say(errors, f"tepo data prepare failed: {error}")
        return 1
    render_table(results, console)
    return 0


def _say(console: Console, paragraph: str) -> None:
    """An error paragraph as it is: pip's "[Errno 2]" or a path's brackets are not markup."""
    console.print(paragraph, style="red", markup=False, highlight=False, soft_wrap=True)
