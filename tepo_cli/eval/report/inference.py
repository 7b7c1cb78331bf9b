"""Tests of one claim (treatment − control): Welch, paired by seed, and the family's correction.

Each test returns a `Inference`: the estimate (treatment − control), the interval that matches
the test at level α (two-sided 1 − 2α for a one-sided test, so "the interval lies above 0" and
"one-sided p < α" say the same; 1 − α for a two-sided one), the p-value for the declared direction,
and each arm's n. Where the data cannot give a p-value (fewer than 2 runs in an arm, no spread at
all) p is None and `note` says why; a zero-width interval is never produced.

Welch's df is the exact Welch–Satterthwaite value (not floored as in compare.py's table: the
t distribution here takes a real df).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tepo_cli.eval.report.distributions import t_cdf, t_ppf, tail_p

DIRECTIONS = ("greater", "less", "two-sided")
CORRECTIONS = ("holm", "bonferroni", "none")


@dataclass(frozen=True)
class Inference:
    estimate: float | None  # treatment − control (the statistic's natural scale)
    low: float | None  # the interval's ends; None: no interval (see note)
    high: float | None
    level: float  # the interval's coverage, e.g. 0.90
    p: float | None  # for the declared direction; None: untestable (see note)
    n_treatment: int
    n_control: int
    test: str
    note: str = ""
    se: float | None = None  # the t statistic's standard error (t tests with an interval only)
    df: float | None = None  # and its degrees of freedom


def interval_level(alpha: float, direction: str) -> float:
    """The two-sided coverage whose interval agrees with the test: 1 − 2α one-sided, 1 − α two."""
    return 1.0 - (2.0 * alpha if direction != "two-sided" else alpha)


def t_result(
    estimate: float,
    se: float,
    df: float,
    alpha: float,
    direction: str,
    n: tuple[int, int],
    test: str,
) -> Inference:
    level = interval_level(alpha, direction)
    if se <= 0.0 or not math.isfinite(se):
        return Inference(estimate, None, None, level, None, *n, test, "no spread: no interval")
    half = t_ppf(0.5 + level / 2.0, df) * se
    p = tail_p(estimate / se, direction, lambda s: t_cdf(s, df))
    return Inference(estimate, estimate - half, estimate + half, level, p, *n, test, "", se, df)


def detectable(result: Inference, alpha: float, direction: str, power: float = 0.8) -> float | None:
    """The smallest true difference (its size, in the claim's direction) the design detects with
    probability `power` at level `alpha` (split over the two sides of a two-sided claim), at the
    spread the runs showed (`detectable_at` at the test's se and df). What a "not supported" can
    rule out: a true effect this large would have been found about four times in five. None for a
    test without a t statistic (log-rank, McNemar)."""
    if result.se is None or result.df is None:
        return None
    return detectable_at(result.se, result.df, alpha, direction, power)


def detectable_at(se: float, df: float, alpha: float, direction: str, power: float = 0.8) -> float:
    """(t_{1−α, df} + t_{power, df}) · se, the usual shift approximation of the non-central t (its
    true power there is 77–80 % at 3–10 seeds, simulated in tests/test_report_statistics.py)."""
    return (t_ppf(1.0 - _side(alpha, direction), df) + t_ppf(power, df)) * se


def power_at(effect: float, se: float, df: float, alpha: float, direction: str) -> float:
    """The probability of finding `effect` (treatment − control, in the claim's direction) in
    that direction, by the same approximation: 1 − T_df(t_{1−α, df} − |effect| / se), so at
    `detectable_at`'s difference it is `power` exactly."""
    critical = t_ppf(1.0 - _side(alpha, direction), df)
    return 1.0 - t_cdf(critical - abs(effect) / se, df)


def _side(alpha: float, direction: str) -> float:
    return alpha / 2.0 if direction == "two-sided" else alpha


def welch(
    treatment: Sequence[float], control: Sequence[float], alpha: float, direction: str
) -> Inference:
    """Welch's unequal-variance t test of mean(treatment) − mean(control)."""
    n, m = len(treatment), len(control)
    level = interval_level(alpha, direction)
    if n < 2 or m < 2:
        estimate = statistics.fmean(treatment) - statistics.fmean(control) if n and m else None
        return Inference(estimate, None, None, level, None, n, m, "welch", "n < 2 in an arm")
    a = statistics.variance(treatment) / n
    b = statistics.variance(control) / m
    estimate = statistics.fmean(treatment) - statistics.fmean(control)
    if a + b == 0.0:
        return Inference(estimate, None, None, level, None, n, m, "welch", "no spread: no interval")
    df = (a + b) ** 2 / (a * a / (n - 1) + b * b / (m - 1))
    return t_result(estimate, math.sqrt(a + b), df, alpha, direction, (n, m), "welch")


def paired(
    treatment: dict[int, float], control: dict[int, float], alpha: float, direction: str
) -> Inference:
    """Paired t test on the per-seed differences treatment[s] − control[s], over the seeds both
    arms have (the seed fixes the prompt stream and the first samples, so pairing removes what
    two runs of one seed share); df = pairs − 1."""
    seeds = sorted(set(treatment) & set(control))
    differences = [treatment[s] - control[s] for s in seeds]
    level = interval_level(alpha, direction)
    pairs = len(differences)
    if pairs < 2:
        estimate = differences[0] if differences else None
        note = f"{pairs} seed pair(s): a paired test needs 2"
        return Inference(estimate, None, None, level, None, pairs, pairs, "paired", note)
    estimate = statistics.fmean(differences)
    se = statistics.stdev(differences) / math.sqrt(pairs)
    return t_result(estimate, se, pairs - 1, alpha, direction, (pairs, pairs), "paired")


def adjust(p_values: Sequence[float | None], correction: str) -> list[float]:
    """Family-wise adjusted p-values. A member without a p-value (untestable) counts as p = 1:
    the family is the one declared, so an untestable primary does not buy the others a smaller
    correction. holm: step-down, p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)); bonferroni:
    min(1, m p); none: p."""
    values = [1.0 if p is None else p for p in p_values]
    m = len(values)
    if correction == "none":
        return values
    if correction == "bonferroni":
        return [min(1.0, m * p) for p in values]
    if correction != "holm":
        raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, not {correction!r}")
    order = sorted(range(m), key=lambda i: values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * values[index]))
        adjusted[index] = running
    return adjusted
