"""The comparison with the reference group (compare.py) as table columns, a legend and a CSV."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from tepo_cli.eval.report.compare import Difference
from tepo_cli.eval.report.dynamics import Reference

NONE = "—"


def _digits(row: Difference) -> int:
    if row.quantity.startswith("length"):
        return 0
    return 1 if row.quantity.startswith("steps") else 3


def _interval(row: Difference) -> str:
    """The difference ± half-width, with each side's n (n = 1: the variance was borrowed)."""
    digits = _digits(row)
    text = f"{row.difference:+.{digits}f}"
    sizes = f"n {row.n} vs {row.reference_n}"
    if row.half_width is not None:
        return f"{text} ± {row.half_width:.{digits}f} ({sizes})"
    if max(row.n, row.reference_n) > 1:
        return f"{text} ({sizes}; no spread, no interval)"
    return f"{text} ({sizes})"


def _separable(row: Difference) -> str:
    if row.borrowed and row.half_width is not None:
        return "n/a (n = 1)"
    return {None: NONE, True: "yes", False: "no"}[row.separable]


def _seeds(row: Difference) -> str:
    if row.half_width is None:
        return NONE
    return "no difference" if row.seeds_needed is None else str(row.seeds_needed)


def compare_columns() -> list[tuple[str, Callable[[Difference], str]]]:
    return [
        ("group", lambda r: r.group),
        ("quantity", lambda r: r.quantity),
        ("group mean (n)", lambda r: f"{r.mean:.{_digits(r)}f} ({r.n})"),
        ("reference (n)", lambda r: f"{r.reference_mean:.{_digits(r)}f} ({r.reference_n})"),
        ("difference ± 95 % CI", _interval),
        ("CI excludes 0", _separable),
        ("seeds for 80 % power", _seeds),
    ]


def compare_legend(reference: Reference | None) -> str:
    against = reference.label if reference is not None else "the reference group"
    return (
        f"each group minus {against}, over finished runs: Welch's 95 % CI of the difference of "
        "the means, n per side in brackets (a group with one run borrows the other group's "
        "variance, an assumption, so its row has no verdict: n/a (n = 1); no spread at all: no "
        "interval); "
        "seeds for 80 % power: seeds per group a two-sided 5 % test would need to detect a "
        "difference of the observed size at the observed spread (a t test's: the smallest n "
        "with n ≥ 2 (t₀.₉₇₅ + t₀.₈)² s² / δ² at 2n − 2 degrees of freedom). "
        "held-out final: the last evaluation; held-out mean over training (AUC): the mean of the "
        "evaluations after step 0 (higher when learning is faster); worst drop: the largest fall "
        "from one evaluation to the next (steadiness); entropy and length: mean over "
        "the last steps; entropy change: each run's last steps' mean entropy minus its first "
        "steps' (a collapse is a fall); steps to a level, censored: the first evaluated step at the "
        "level, a run that never reached it counted at its last evaluation (a lower bound)."
    )


def write_csv_compare(path: Path, rows: list[Difference]) -> None:
    fields = ["group", "quantity", "mean", "n", "reference_mean", "reference_n", "difference"]
    fields += ["ci95", "ci_excludes_zero", "seeds_for_80_power"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for r in rows:
            values = (
                r.group, r.quantity, r.mean, r.n, r.reference_mean, r.reference_n, r.difference,
                r.half_width, r.separable, r.seeds_needed,
            )  # fmt: skip
            writer.writerow(["" if v is None else v for v in values])
