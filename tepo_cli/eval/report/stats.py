"""Across-seed statistics: mean with a Student-t 95 % confidence interval, and time to a threshold.

scipy is not a dependency, so the t quantiles are tables (df 1-30, exact to 4 decimals) and a
Cornish-Fisher expansion above that (error < 1e-4 for df > 30).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# t_{0.975, df} for df = 1..30
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
# t_{0.80, df} for df = 1..30 (the power term of a sample size)
_T80 = (
    1.3764, 1.0607, 0.9785, 0.9410, 0.9195, 0.9057, 0.8960, 0.8889, 0.8834, 0.8791,
    0.8755, 0.8726, 0.8702, 0.8681, 0.8662, 0.8647, 0.8633, 0.8620, 0.8610, 0.8600,
    0.8591, 0.8583, 0.8575, 0.8569, 0.8562, 0.8557, 0.8551, 0.8546, 0.8542, 0.8538,
)  # fmt: skip
_Z975 = 1.959964
_Z80 = 0.841621
# probability -> (its table, its standard normal quantile)
_TABLES = {0.975: (_T975, _Z975), 0.8: (_T80, _Z80)}


def t_quantile(probability: float, df: int) -> float:
    """The `probability` quantile (0.975 or 0.8) of Student's t with `df` degrees of freedom."""
    if df < 1:
        raise ValueError("t quantile needs at least one degree of freedom")
    table, z = _TABLES[probability]
    if df <= len(table):
        return table[df - 1]
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t_quantile_975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom."""
    return t_quantile(0.975, df)


def seeds_for_power(delta: float, variance: float) -> int | None:
    """Runs per group a two-sided 5 % two-sample t test needs to detect a difference `delta` with
    80 % power at a common `variance`: the smallest n ≥ 2 with
    n ≥ 2 (t₀.₉₇₅ + t₀.₈)² s² / δ², both quantiles at the test's 2n − 2 degrees of freedom (the
    normal quantiles' 2 (1.96 + 0.84)² s² / δ² understates it at a few seeds). None: δ = 0."""
    if abs(delta) <= 1e-12:
        return None
    ratio = 2 * variance / delta**2
    n = 2
    while n < ratio * (t_quantile(0.975, 2 * n - 2) + t_quantile(0.8, 2 * n - 2)) ** 2:
        n += 1
    return n


@dataclass(frozen=True)
class Estimate:
    """Mean over n values; `half_width` of the 95 % CI (None when n < 2: no spread to judge)."""

    mean: float
    half_width: float | None
    n: int

    def format(self, digits: int) -> str:
        if self.half_width is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def estimate(values: Iterable[float | None]) -> Estimate | None:
    """mean ± t_{0.975, n-1} · s / √n over the values that are present; None if there are none."""
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not present:
        return None
    n = len(present)
    mean = statistics.fmean(present)
    if n < 2:
        return Estimate(mean, None, n)
    half = t_quantile_975(n - 1) * statistics.stdev(present) / math.sqrt(n)
    return Estimate(mean, half, n)


@dataclass(frozen=True)
class Crossing:
    """The first step at which a metric reached the threshold, and the training seconds to it."""

    step: int
    seconds: float | None  # sum of step_seconds up to and including `step`; None if not logged
    cpu_seconds: float | None = None  # the same of step_cpu_seconds


def first_crossing(
    metrics: Sequence[dict[str, Any]], key: str, threshold: float, window: int = 1
) -> Crossing | None:
    """First step whose trailing mean of `key` over the last `window` logged values is ≥ threshold.

    Steps where `key` is missing or null do not count towards the window. Seconds are the sum of
    `step_seconds` of every step up to the crossing (evaluations excluded).
    """
    recent: list[float] = []
    seconds: float | None = 0.0
    for record in metrics:
        if "step" not in record:
            continue  # not a training step (e.g. a record of MPO's warm-up)
        step_seconds = record.get("step_seconds")
        seconds = None if seconds is None or step_seconds is None else seconds + step_seconds
        value = record.get(key)
        if value is None:
            continue
        recent = [*recent, float(value)][-max(1, window) :]
        if statistics.fmean(recent) >= threshold:
            return Crossing(int(record["step"]), seconds)
    return None
