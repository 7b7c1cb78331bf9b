"""A rich table printed whole where nobody resizes the window.

rich takes a console that is a file or a pipe (a log, `| tee`, CI) to be 80 columns wide and cuts
the cells that do not fit to "…": a model's path, a data file's. There the table gets the width
its cells need; on a terminal it keeps the terminal's, where the cut is visible and the window
can be widened.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

_UNBOUNDED = 10_000  # columns to measure a table's natural width against


def print_whole(console: Console, table: Table) -> None:
    if not console.is_terminal:
        wide = console.options.update_width(_UNBOUNDED)
        console.width = max(console.width, console.measure(table, options=wide).maximum)
    console.print(table)
