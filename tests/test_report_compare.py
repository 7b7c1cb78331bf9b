"""`tepo report`'s comparison with the reference group, every number computed by hand here.

The runs of test_report_dynamics (held-out at steps 0, 2, 4) plus a one-seed gspo run:
grpo: final .6 .4 (mean .5, s² .02); mean over training (.4+.6)/2 = .5 and .5 (s² 0)
tepo: final .7 .3 (mean .5, s² .08); mean over training .6 and .3 (mean .45, s² .045)
gspo: final .8 (one run: borrows grpo's s² .02)

tepo − grpo, final: δ 0; Welch a = .04, b = .01, df = .05²/(.04² + .01²) = 1.47 → 1,
half = 12.7062·√.05 = 2.84119; no difference, so no seed count.
tepo − grpo, mean over training: δ −.05; a = .0225, b = 0, df 1, half = 12.7062·.15 = 1.90593;
seeds = ⌈2·(1.959964 + .841621)²·.0225 / .05²⌉ = ⌈141.28⌉ = 142.
gspo − grpo, final: δ .3; a = .02, b = .01, df = .03²/(.02² + .01²) = 1.8 → 1,
half = 12.7062·√.03 = 2.20078; seeds = ⌈15.69776·.02 / .09⌉ = ⌈3.488⌉ = 4.
"""

from __future__ import annotations

import csv
import math

import pytest
from test_report_dynamics import OPTIONS, write_run

from tepo_cli.eval.report import build_report
from tepo_cli.eval.report.compare import difference
from tepo_cli.eval.report.stats import seeds_for_power, t_quantile


@pytest.fixture()
def sweep(tmp_path):
    root = tmp_path / "sweep"
    write_run(root, "grpo", 0, [0.2, 0.4, 0.6], entropy=[1.0, 0.8, 0.6, 0.4])
    write_run(root, "grpo", 1, [0.2, 0.6, 0.4], entropy=[1.0, 1.0, 0.8, 0.8])
    write_run(root, "tepo", 0, [0.2, 0.5, 0.7], entropy=[1.0, 1.0, 1.0, 1.0])
    write_run(root, "tepo", 1, [0.3, 0.3, 0.3], entropy=[1.0, 1.0, 0.9, 0.9])
    write_run(root, "gspo", 0, [0.2, 0.5, 0.8], entropy=[1.0, 1.0, 1.0, 1.0])
    return root


def by_key(report):
    return {(row.group, row.quantity): row for row in report.differences}


def test_differences_intervals_and_seed_counts_against_the_reference(sweep, tmp_path):
    report = build_report(sweep, tmp_path / "out", OPTIONS, plots=False)
    rows = by_key(report)
    final = rows[("algo=tepo", "held-out final")]
    assert (final.n, final.reference_n) == (2, 2)
    assert final.difference == pytest.approx(0.0, abs=1e-12)
    assert final.half_width == pytest.approx(12.7062 * math.sqrt(0.05), rel=1e-9)
    assert final.seeds_needed is None and final.separable is False
    mean = rows[("algo=tepo", "held-out mean over training")]
    assert mean.difference == pytest.approx(-0.05)
    assert mean.half_width == pytest.approx(1.90593, rel=1e-9)
    # pooled s² = (.045 + 0)/2, δ = .05: 18 (t₀.₉₇₅ + t₀.₈)² at 282 df ≈ 18 × 7.90 = 142.2
    assert mean.seeds_needed == 143
    one_seed = rows[("algo=gspo", "held-out final")]
    assert (one_seed.n, one_seed.difference) == (1, pytest.approx(0.3))
    assert one_seed.half_width == pytest.approx(12.7062 * math.sqrt(0.03), rel=1e-9)
    # s² = .02 (borrowed), δ = .3: n = 4 needs 4.99 > 4 at 6 df; n = 5 needs 4.54 at 8 df
    assert one_seed.seeds_needed == 5
    # entropy over the last 2 steps: tepo (1.0 + .9)/2 = .95 against grpo (.5 + .8)/2 = .65
    entropy = rows[("algo=tepo", "entropy last 2")]
    assert entropy.difference == pytest.approx(0.3)
    # change, last 2 − first 2: grpo .5 − .9 = −.4 and .8 − 1 = −.2 (mean −.3); tepo 0 and −.1
    change = rows[("algo=tepo", "entropy change, last 2 − first 2")]
    assert (change.reference_mean, change.mean) == (pytest.approx(-0.3), pytest.approx(-0.05))
    assert not any(row.group == "algo=grpo" for row in report.differences)
    # worst drop: grpo .2 .4 .6 -> 0 and .2 .6 .4 -> .2 (mean .1); tepo .2 .5 .7 -> 0, .3 .3 .3 -> 0
    drop = rows[("algo=tepo", "held-out worst drop")]
    assert (drop.reference_mean, drop.mean) == (pytest.approx(0.1), 0.0)


def test_the_comparison_is_in_the_markdown_and_its_csv(sweep, tmp_path):
    out = tmp_path / "out"
    build_report(sweep, out, OPTIONS, plots=False)
    markdown = (out / "report.md").read_text()
    assert "## Against the reference" in markdown
    assert (
        "| algo=tepo | held-out mean over training | 0.450 (2) | 0.500 (2) | -0.050 ± 1.906 "
        "(n 2 vs 2) | no |" in (markdown)
    )
    with (out / "report_compare.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    gspo = next(r for r in rows if r["group"] == "algo=gspo" and r["quantity"] == "held-out final")
    # one run, a borrowed variance: an interval and a seed count, but no verdict
    assert (gspo["seeds_for_80_power"], gspo["ci_excludes_zero"]) == ("5", "")
    gspo_row = "| algo=gspo | held-out final | 0.800 (1) | 0.500 (2) | +0.300 ± 2.201 (n 1 vs 2) "
    assert gspo_row + "| n/a (n = 1) | 5 |" in markdown
    # grpo's mean over training is .5 in both seeds and gspo's one run borrows that zero variance:
    # no interval (it was "+0.150 ± 0.000"), no verdict
    no_spread = "| +0.150 (n 1 vs 2; no spread, no interval) | — | — |"
    assert (
        "| algo=gspo | held-out mean over training | 0.650 (1) | 0.500 (2) " + no_spread in markdown
    )
    assert "± 0.000 (n" not in markdown


def test_a_clear_difference_is_separable_and_two_single_runs_have_no_interval():
    clear = difference("a", "q", [0.50, 0.52, 0.54], [0.20, 0.22, 0.24])
    assert clear is not None and clear.separable is True
    # s² = .0004 each, δ = .3: 2·7.84888·.0004/.09 = .0698 → at least 2 seeds
    assert clear.seeds_needed == 2
    alone = difference("a", "q", [0.5], [0.2])
    assert alone is not None and alone.half_width is None and alone.separable is None
    assert difference("a", "q", [], [0.2]) is None


def test_a_single_run_is_never_separable_however_far_it_lies():
    # one run at .9 against .20 .22 .24 (s² .0004, borrowed): Welch a = .0004, b = .0004/3,
    # df = (.0005333)²/(.0004² / 2 + .0001333² / 2) = 3.2 → 3, half = 3.1824·√.0005333 = .073496
    alone = difference("a", "q", [0.9], [0.20, 0.22, 0.24])
    assert alone is not None and alone.borrowed
    assert alone.half_width == pytest.approx(3.1824 * math.sqrt(0.0004 + 0.0004 / 3), rel=1e-9)
    assert abs(alone.difference) > alone.half_width and alone.separable is None
    both = difference("a", "q", [0.50, 0.52, 0.54], [0.20, 0.22, 0.24])
    assert both is not None and not both.borrowed and both.separable is True


def test_no_spread_gives_no_interval_never_a_zero_width_one():
    # offpolicy/report.md's "best −0.080 ± 0.000": one run at .11 against three runs at .19
    borrowed_zero = difference("a", "held-out best", [0.11], [0.19, 0.19, 0.19])
    assert borrowed_zero is not None and borrowed_zero.difference == pytest.approx(-0.08)
    assert borrowed_zero.half_width is None and borrowed_zero.separable is None
    assert borrowed_zero.seeds_needed is None
    flat = difference("a", "q", [0.3, 0.3], [0.2, 0.2])
    assert flat is not None and flat.half_width is None and flat.separable is None


def test_steps_to_a_level_are_compared_with_unreached_runs_censored(sweep, tmp_path):
    # levels .25 and .45 (50 % / 90 % of grpo's best mean .5); a run that never reaches a level
    # counts at its last evaluation, 4: tepo .45 → 2 and 4 (seed 1 never), grpo → 4 and 2
    report = build_report(sweep, tmp_path / "out", OPTIONS, plots=False)
    rows = by_key(report)
    level = rows[("algo=tepo", "steps to 90% (0.450), censored")]
    assert (level.mean, level.reference_mean, level.n) == (3.0, 3.0, 2)
    # .25: tepo 2 and 0 (seed 1 starts at .3), grpo 2 and 2: δ −1, a = 2/2, b = 0, df 1
    early = rows[("algo=tepo", "steps to 50% (0.250), censored")]
    assert early.difference == pytest.approx(-1.0)
    assert early.half_width == pytest.approx(12.7062 * 1.0, rel=1e-9)


def test_no_reference_group_no_comparison(sweep, tmp_path):
    options = OPTIONS.__class__(last=2, reference=None, fractions=(0.5,))
    report = build_report(sweep, tmp_path / "out", options, plots=False)
    assert report.differences == []


def _exact_power(n: int, effect: float) -> float:
    """A two-sided 5 % two-sample t test's power at n per group and effect δ/s: the noncentral t's
    tails beyond ±t₀.₉₇₅, integrated over the chi-square of the variance (float64 reference)."""
    mp = pytest.importorskip("mpmath")
    df, shift = 2 * n - 2, effect * math.sqrt(n / 2)
    critical = mp.mpf(t_quantile(0.975, df))

    def density(v):
        return mp.exp((df / 2 - 1) * mp.log(v) - v / 2 - (df / 2) * mp.log(2) - mp.loggamma(df / 2))

    def beyond(v):
        scale = mp.sqrt(v / df)
        return density(v) * (
            mp.ncdf(-critical * scale - shift) + 1 - mp.ncdf(critical * scale - shift)
        )

    return float(mp.quad(beyond, [0, df, mp.inf]))


@pytest.mark.parametrize(("delta", "variance"), [(0.3, 0.03), (0.1, 0.01), (0.05, 0.02)])
def test_seeds_for_power_is_the_first_seed_count_with_80_percent_power(delta, variance):
    seeds = seeds_for_power(delta, variance)
    effect = delta / math.sqrt(variance)
    assert _exact_power(seeds, effect) >= 0.8 > _exact_power(seeds - 1, effect)
    assert seeds_for_power(-delta, variance) == seeds
    assert seeds_for_power(0.0, variance) is None


def test_the_t_quantile_tables_are_student_s():
    mp = pytest.importorskip("mpmath")
    for df in (1, 2, 5, 30, 31, 60):
        for probability in (0.975, 0.8):
            x = mp.mpf(t_quantile(probability, df))
            upper = mp.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True) / 2
            assert float(1 - upper) == pytest.approx(probability, abs=2e-5), (df, probability)
