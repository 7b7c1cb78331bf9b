"""The report's tables on the terminal, fitted to its width (120 columns and up).

Two things make a table wider than it has to be. A column whose cell is the same in every row
(every run at the level at step 0; a threshold no run reached) says one thing once per row: it
is left out and said once under the table ("The same in every row, so not shown: ..."); a count
of runs "(n)", a zero spread "± 0.0" and the n of "not reached (0/n)" do not make cells differ.
And a group label is several `key=value` words, one of which can be wider than a column can be:
rich then folds it mid-word. When some table cannot fit without that (each column as narrow as
its widest word), every table names the groups G1, G2, ... instead, and the first table is
followed by what each stands for, one entry per group, wrapped between words. A table still too
wide is split into consecutive parts that fit, each beginning with the column that names its
rows. Numbers never wrap (their headers are wrapped to the numbers' width instead), and a
header "... to it" whose antecedent column is not beside it says what "it" is. Report.md and
the CSV files keep every column and the full labels.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tepo_cli.eval.report.render import NONE, TEXT_COLUMNS

Columns = Sequence[tuple[str, Callable[[Any], str]]]
_NOT_REACHED = re.compile(r"^not reached \(0/\d+\)$")
_COUNT = re.compile(r" \(\d+\)$")
_ZERO_SPREAD = re.compile(r" ± 0(\.0+)?$")
GROUP_COLUMN = "group"


@dataclass(frozen=True)
class Spec:
    """One table as the report builds it: its columns (header, cell of a row) and rows."""

    title: str
    columns: Columns
    rows: Sequence[Any]
    caption: str = ""


@dataclass(frozen=True)
class Shown:
    """A table's cells after the constant columns are left out, and what those said."""

    title: str
    headers: list[str]
    cells: list[list[str]]
    caption: str
    constant: list[tuple[str, str]]


def print_fitted(console: Console, specs: list[Spec], labels: list[str]) -> None:
    """Print each table of `specs` that has rows, within `console.width`; `labels`: the group
    labels in the report's order (their short names G1, G2, ... follow it)."""
    shown = [_without_constant(spec) for spec in specs if spec.rows]
    names: dict[str, str] = {}
    if any(_width(table, {}) > console.width for table in shown):
        names = {label: f"G{number}" for number, label in enumerate(labels, start=1)}
    for index, table in enumerate(shown):
        parts = _split(table, names, console.width)
        for number, part in enumerate(parts, start=1):
            title = part.title if len(parts) == 1 else f"{part.title} ({number}/{len(parts)})"
            console.print(_table(replace(part, title=title), names, console.width), highlight=False)
        # under the last part, at the console's width (a caption would wrap to the table's)
        if table.caption:
            console.print(table.caption, highlight=False, markup=False)
        if table.constant:
            console.print(_constant_said(table.constant), highlight=False, markup=False)
        if names and index == 0:
            console.print(
                _names_said(names, console.width), highlight=False, soft_wrap=True, markup=False
            )
        elif names:
            console.print("G1, G2, ...: the groups named under the first table.")


def _without_constant(spec: Spec) -> Shown:
    headers = [header for header, _ in spec.columns]
    named = _named(headers)
    cells = [[get(row) for _, get in spec.columns] for row in spec.rows]
    constant: list[tuple[str, str]] = []
    dropped: set[int] = set()
    for index in range(1, len(headers)):  # the first column names the row
        values = {_said(row[index]) for row in cells}
        if len(cells) > 1 and len(values) == 1:
            constant.append((named[index], values.pop()))
            dropped.add(index)
    keep = [index for index in range(len(headers)) if index not in dropped]
    # "seconds to it" after its "steps to ..." column was left out: say what "it" is
    shown = [named[i] if _refers(headers[i]) and i - 1 in dropped else headers[i] for i in keep]
    return Shown(
        spec.title, shown, [[row[i] for i in keep] for row in cells], spec.caption, constant
    )


def _refers(header: str) -> bool:
    return " to it" in header


def _named(headers: list[str]) -> list[str]:
    """Each header with "to it" said in full: "it" is the level of the last "steps to ..."
    header before it ("seconds to it" after "steps to 50% (0.250)": "seconds to 50% (0.250)")."""
    named, level = [], None
    for header in headers:
        if header.startswith("steps to ") and not _refers(header):
            level = header.removeprefix("steps to ")
        named.append(
            header.replace(" to it", f" to {level}") if _refers(header) and level else header
        )
    return named


def _said(cell: str) -> str:
    """What a cell says, for telling constant columns: a count of runs `(n)` and a zero spread
    `± 0.0` left out, every "not reached (0/n)" alike."""
    if _NOT_REACHED.match(cell):
        return "not reached"
    return _ZERO_SPREAD.sub("", _COUNT.sub("", cell))


def _constant_said(constant: list[tuple[str, str]]) -> str:
    said = "; ".join(
        f"{header}: {'none' if value in (NONE, '') else value}" for header, value in constant
    )
    return f"The same in every row, so not shown: {said}."


def _split(shown: Shown, names: dict[str, str], width: int) -> list[Shown]:
    """`shown` as consecutive tables of its columns that each fit `width`, each beginning with
    the first column (what names the row); one table when it fits whole."""
    parts: list[list[int]] = [[0]]
    for index in range(1, len(shown.headers)):
        trial = _columns(shown, [*parts[-1], index])
        if len(parts[-1]) > 1 and _width(trial, names) > width:
            parts.append([0, index])
        else:
            parts[-1].append(index)
    named = _named(shown.headers)
    tables = []
    for part in parts:  # "seconds to it" whose "steps to ..." went to the part before: say it
        table = _columns(shown, part)
        headers = [
            named[i] if _refers(shown.headers[i]) and i - 1 not in part else shown.headers[i]
            for i in part
        ]
        tables.append(replace(table, headers=headers))
    return tables


def _columns(shown: Shown, indices: list[int]) -> Shown:
    headers = [shown.headers[i] for i in indices]
    cells = [[row[i] for i in indices] for row in shown.cells]
    return Shown(shown.title, headers, cells, shown.caption, shown.constant)


def _width(shown: Shown, names: dict[str, str]) -> int:
    """The narrowest the table can be without folding a word: each column as wide as its widest
    word (its widest cell where it does not wrap; headers wrap between words), plus a space of
    padding either side and a border line between columns and at both ends."""
    widths = [_column_width(shown, index, names) for index in range(len(shown.headers))]
    return sum(widths) + 3 * len(widths) + 1


def _column_width(shown: Shown, index: int, names: dict[str, str]) -> int:
    header = shown.headers[index]
    cells = [names.get(row[index], row[index]) for row in shown.cells]
    pieces = cells if header not in TEXT_COLUMNS else [w for cell in cells for w in cell.split()]
    return max(cell_len(piece) for piece in [*pieces, *header.split()])


def _table(shown: Shown, names: dict[str, str], room: int) -> Table:
    table = Table(title=shown.title, title_justify="left")
    widths = _fitted_widths(shown, names, room)
    for index, header in enumerate(shown.headers):
        if header in TEXT_COLUMNS:  # wraps between words, never narrower than its widest word
            table.add_column(header, justify="left", overflow="fold", width=widths[index])
        else:  # a number never wraps: its header is wrapped to the numbers' width instead
            width = _column_width(shown, index, names)
            lines = textwrap.wrap(header, width, break_long_words=False)
            table.add_column("\n".join(lines), justify="right", no_wrap=True, min_width=width)
    for row in shown.cells:
        table.add_row(*(Text(names.get(cell, cell) if h == GROUP_COLUMN else cell)  # not markup
                        for h, cell in zip(shown.headers, row, strict=True)))  # fmt: skip
    return table


def _fitted_widths(shown: Shown, names: dict[str, str], room: int) -> list[int | None]:
    """The text columns' widths when the table does not fit `room` whole: each as wide as its
    widest word, then the columns that could use more widened one character at a time, the one
    short of its widest cell by the most first, until the table fills `room`; None for every
    column when it fits (rich sizes it). rich's own shrinking evens the wrapping columns out and
    would fold a word of a column whose widest word is wider than the others'."""
    count = len(shown.headers)
    least = [_column_width(shown, index, names) for index in range(count)]
    whole = [
        max(least[i], *(cell_len(names.get(row[i], row[i])) for row in shown.cells))
        if shown.headers[i] in TEXT_COLUMNS
        else least[i]
        for i in range(count)
    ]
    if sum(whole) + 3 * count + 1 <= room:
        return [None] * count
    widths = list(least)
    for _ in range(room - (sum(least) + 3 * count + 1)):
        short = max(range(count), key=lambda i: whole[i] - widths[i])
        if whole[short] == widths[short]:
            break
        widths[short] += 1
    return [*widths]


def _names_said(names: dict[str, str], width: int) -> str:
    """One line per group (a long label goes on under its first word, indented), wrapped
    between its `key=value` words only."""
    lines = ["Groups:"]
    for label, short in names.items():
        lines += textwrap.wrap(
            label, width, initial_indent=f"  {short:<4} ", subsequent_indent=" " * 7,
            break_long_words=False, break_on_hyphens=False,
        )  # fmt: skip
    return "\n".join(lines)
