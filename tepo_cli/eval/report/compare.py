"""Each group against the reference group: is a claim's difference separable at this many seeds?

A claim ("TEPO converges faster than GRPO", "K-token blocks beat tokens") is a difference between
two groups of seeds in one per-run quantity. For each quantity this gives the difference of the
group means (group − reference), its 95 % confidence interval (Welch's), whether the interval
excludes zero, and how many seeds per group a two-sided test at the 5 % level would need to detect
a difference of the observed size with 80 % power, given the observed spread: the smallest n
with n ≥ 2 (t₀.₉₇₅ + t₀.₈)² s² / δ², t at 2n − 2 degrees of freedom and s² the two groups' pooled
variance (stats.seeds_for_power). When one group has a
single run (a variant measured on one seed), its variance is taken to be the other group's: an
assumption, said in the legend, not a measurement — so such a row gets an interval but never a
"CI excludes 0" verdict ("n/a (n = 1)"): one run cannot show that its difference is not its own
noise. A total variance of zero (e.g. every seed's best held-out accuracy the same, and a one-run
side borrowing it) gives no interval at all, never a zero-width one.

Steps to a level (the reference's `fractions`, as in the dynamics table) are compared as restricted
means: a run that never reaches the level counts at its last evaluated step (censored; a lower
bound), instead of being dropped, which favoured the group whose slow runs never got there.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tepo_cli.eval.report.censored import time_to_level
from tepo_cli.eval.report.dynamics import Reference, held_out_curve
from tepo_cli.eval.report.grouping import Group
from tepo_cli.eval.report.runs import Run
from tepo_cli.eval.report.stats import seeds_for_power, t_quantile_975


@dataclass(frozen=True)
class Difference:
    """group − reference in one quantity, over the finished runs that have it."""

    group: str
    quantity: str
    mean: float  # the group's mean
    reference_mean: float
    n: int
    reference_n: int
    difference: float
    half_width: float | None  # of the 95 % CI; None: neither side has a spread
    seeds_needed: int | None  # per group, for 80 % power; None: no difference observed

    @property
    def borrowed(self) -> bool:
        """One side has a single run: its variance is the other side's, an assumption."""
        return min(self.n, self.reference_n) < 2

    @property
    def separable(self) -> bool | None:
        """Whether the interval excludes 0; None (no verdict) without an interval or with a
        borrowed variance."""
        if self.half_width is None or self.borrowed:
            return None
        return abs(self.difference) > self.half_width


def per_run_quantities(
    last: int, levels: dict[str, float] | None = None
) -> dict[str, Callable[[Run], float | None]]:
    """The quantities compared, each a function of one finished run (None: it has none);
    `levels`: label -> held-out level for censored steps to it."""
    steps_to = {
        f"steps to {label}, censored": (lambda run, lv=level: _censored_steps(run, lv))
        for label, level in (levels or {}).items()
    }
    return {
        "held-out final": _final_held_out,
        "held-out mean over training": _mean_held_out,
        "held-out best": _best_held_out,
        "held-out worst drop": _worst_drop,
        f"entropy last {last}": lambda run: _metric_mean(run, "entropy", last),
        f"entropy change, last {last} − first {last}": lambda run: _entropy_change(run, last),
        f"length last {last}": lambda run: _metric_mean(run, "response_length", last),
        **steps_to,
    }


def _censored_steps(run: Run, level: float) -> float | None:
    """The first evaluated step with held-out accuracy ≥ level, or the last evaluated step when
    it never got there (censored: the run took at least that many)."""
    time = time_to_level(held_out_curve(run), level, include_start=True)
    return None if time is None else time.step


def _final_held_out(run: Run) -> float | None:
    curve = held_out_curve(run)
    return curve[max(curve)] if curve else None


def _mean_held_out(run: Run) -> float | None:
    """The mean of the evaluations after training began (step > 0): with a common evaluation
    schedule, the area under the learning curve per evaluation — higher when learning is faster."""
    values = [value for step, value in held_out_curve(run).items() if step > 0]
    return statistics.fmean(values) if values else None


def _best_held_out(run: Run) -> float | None:
    curve = held_out_curve(run)
    return max(curve.values()) if curve else None


def _worst_drop(run: Run) -> float | None:
    """The largest fall of held-out accuracy from one evaluation to the next (0 if it never
    fell): GSPO's claim is steadier training, and a collapse shows here first."""
    curve = held_out_curve(run)
    values = [curve[step] for step in sorted(curve)]
    if len(values) < 2:
        return None
    return max(0.0, *(before - after for before, after in itertools.pairwise(values)))


def _entropy_change(run: Run, steps: int) -> float | None:
    """Mean entropy of the last `steps` steps minus that of the first: a collapse is a fall, and
    the difference within one run leaves out where each seed's entropy happened to start."""
    values = [
        float(m["entropy"]) for m in run.metrics if "step" in m and m.get("entropy") is not None
    ]
    if not values:
        return None
    return statistics.fmean(values[-steps:]) - statistics.fmean(values[:steps])


def _metric_mean(run: Run, key: str, last: int) -> float | None:
    values = [float(m[key]) for m in run.metrics if "step" in m and m.get(key) is not None]
    return statistics.fmean(values[-last:]) if values else None


def difference(
    group: str, quantity: str, values: list[float], reference: list[float]
) -> Difference | None:
    """Welch's interval for mean(values) − mean(reference) and the seeds 80 % power would need."""
    if not values or not reference:
        return None
    n, m = len(values), len(reference)
    if n < 2 and m < 2:
        variance_a = variance_b = None
    else:
        variance_a = statistics.variance(values) if n > 1 else statistics.variance(reference)
        variance_b = statistics.variance(reference) if m > 1 else variance_a
    delta = statistics.fmean(values) - statistics.fmean(reference)
    half = seeds = None
    a = b = 0.0
    if variance_a is not None and variance_b is not None:
        a, b = variance_a / n, variance_b / m
    if variance_a is not None and variance_b is not None and a + b > 0:
        # no spread at all gives no interval, never a zero-width one
        df = _welch_df(a, b, n, m)
        half = t_quantile_975(df) * math.sqrt(a + b)
        seeds = seeds_for_power(delta, (variance_a + variance_b) / 2)
    return Difference(
        group, quantity, statistics.fmean(values), statistics.fmean(reference), n, m, delta, half,
        seeds,
    )  # fmt: skip


def _welch_df(a: float, b: float, n: int, m: int) -> int:
    """Welch–Satterthwaite degrees of freedom, rounded down (a wider interval); a side with one
    run contributes the other side's degrees of freedom (its variance was borrowed)."""
    df_a = n - 1 if n > 1 else m - 1
    df_b = m - 1 if m > 1 else n - 1
    denominator = a * a / df_a + b * b / df_b
    if denominator == 0:
        return df_a + df_b
    return max(1, math.floor((a + b) ** 2 / denominator))


def compare_groups(
    groups: list[Group],
    reference: Reference | None,
    last: int,
    fractions: tuple[float, ...] = (),
) -> list[Difference]:
    """Every other group against the reference group, quantity by quantity."""
    if reference is None:
        return []
    base = next((g for g in groups if g.label == reference.label), None)
    if base is None:
        return []
    levels = {f"{f:.0%} ({reference.level(f):.3f})": reference.level(f) for f in fractions}
    quantities = per_run_quantities(last, levels)
    rows = []
    for group in groups:
        if group is base:
            continue
        for name, of_run in quantities.items():
            values = _values(group, of_run)
            row = difference(group.label, name, values, _values(base, of_run))
            if row is not None:
                rows.append(row)
    return rows


def _values(group: Group, of_run: Callable[[Run], float | None]) -> list[float]:
    values = (of_run(run) for run in group.runs if run.finished)
    return [float(v) for v in values if v is not None and math.isfinite(v)]
