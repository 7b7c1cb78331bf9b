"""Distribution functions for p-values: Student's t (any real df) and the standard normal.

scipy is not a dependency (stats.py keeps t quantile tables for the same reason). A p-value needs
the t distribution at a non-integer df (Welch–Satterthwaite), so the CDF comes from the
regularised incomplete beta function, I_x(a, b), by its continued fraction (modified Lentz, as in
Numerical Recipes §6.4): P(|T| > t) = I_{df/(df+t²)}(df/2, 1/2). The quantile inverts the CDF by
bisection, run to a relative width far below what a p-value printed to 2-3 digits needs.
"""

from __future__ import annotations

import math

_EPSILON = 1e-15
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (converges fast for x < (a + 1) / (a + b + 2))."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPSILON:
            break
    return result


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 ≤ x ≤ 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta needs 0 ≤ x ≤ 1, got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` > 0 degrees of freedom (df need not be an integer)."""
    if df <= 0:
        raise ValueError("the t distribution needs df > 0")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t)."""
    return 1.0 - t_sf(t, df)


def t_ppf(probability: float, df: float) -> float:
    """The `probability` quantile of Student's t with `df` degrees of freedom (bisection)."""
    if not 0.0 < probability < 1.0:
        raise ValueError("a quantile needs 0 < probability < 1")
    if probability < 0.5:
        return -t_ppf(1.0 - probability, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < probability:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if t_cdf(middle, df) < probability:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


def normal_cdf(z: float) -> float:
    """Φ(z), the standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def tail_p(statistic: float, direction: str, cdf) -> float:
    """The p-value of `statistic` (larger: treatment above control) for a declared direction:
    "greater" P(S ≥ s), "less" P(S ≤ s), "two-sided" 2 min of the two, for a symmetric `cdf`."""
    if direction == "greater":
        return 1.0 - cdf(statistic)
    if direction == "less":
        return cdf(statistic)
    if direction == "two-sided":
        return min(1.0, 2.0 * (1.0 - cdf(abs(statistic))))
    raise ValueError(f"direction must be greater, less or two-sided, not {direction!r}")
