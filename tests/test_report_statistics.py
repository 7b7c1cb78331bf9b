"""The report's statistics on small hand-computed tables.

Every expected number is derived here from first principles (closed forms of the t distribution
at 1 and 2 df, mpmath's incomplete beta as the float64 reference elsewhere, arithmetic by hand in
the comments), never taken from the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tepo_cli.eval.report.censored import Time, logrank, logrank_z, time_to_level
from tepo_cli.eval.report.distributions import t_cdf, t_ppf, t_sf
from tepo_cli.eval.report.inference import (
    Inference,
    adjust,
    detectable,
    interval_level,
    paired,
    welch,
)
from tepo_cli.eval.report.per_problem import per_problem_paired
from tepo_cli.eval.report.protocol_metrics import RUN_METRICS
from tepo_cli.eval.report.runs import Run


def _mp_t_sf(t: float, df: float) -> float:
    """P(T > t) = I_{df/(df+t²)}(df/2, 1/2) / 2 for t ≥ 0, in mpmath's arbitrary precision."""
    mp = pytest.importorskip("mpmath")
    tail = mp.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True) / 2
    return float(tail if t >= 0 else 1 - tail)


@pytest.mark.parametrize("t", [-3.0, -0.4, 0.0, 0.7, 1.3, 6.0])
def test_t_cdf_matches_the_closed_forms_at_one_and_two_df(t):
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


@pytest.mark.parametrize(("t", "df"), [(1.963961, 2.88235), (0.3, 7.5), (2.5, 30.2), (4.0, 1.3)])
def test_t_sf_at_a_real_df_matches_the_incomplete_beta(t, df):
    assert t_sf(t, df) == pytest.approx(_mp_t_sf(t, df), rel=1e-9)


def test_t_ppf_inverts_the_cdf_and_matches_the_tables():
    assert t_ppf(0.975, 4) == pytest.approx(2.7764, abs=1e-4)  # stats.py's table
    # at 2 df, F(t) = ½ + t/(2√(2 + t²)) inverts to t = u√(2/(1 − u²)), u = 2F − 1 = .9
    assert t_ppf(0.95, 2) == pytest.approx(0.9 * math.sqrt(2 / (1 - 0.9**2)), rel=1e-9)
    assert t_ppf(0.05, 3.3) == pytest.approx(-t_ppf(0.95, 3.3), rel=1e-12)
    assert t_cdf(t_ppf(0.9, 5.7), 5.7) == pytest.approx(0.9, abs=1e-10)


def test_welch_on_a_small_table():
    # treatment 1 2 3 (mean 2, s² 1), control 0 1 (mean .5, s² .5): a = 1/3, b = 1/4,
    # se = √(7/12), t = 1.5/√(7/12) = 1.963961, df = (7/12)² / ((1/3)²/2 + (1/4)²/1) = 2.882353
    result = welch([1.0, 2.0, 3.0], [0.0, 1.0], alpha=0.05, direction="greater")
    se, df = math.sqrt(7 / 12), (7 / 12) ** 2 / ((1 / 3) ** 2 / 2 + (1 / 4) ** 2)
    assert df == pytest.approx(2.882353, abs=1e-6)
    assert result.estimate == pytest.approx(1.5)
    assert result.p == pytest.approx(_mp_t_sf(1.5 / se, df), rel=1e-9)
    assert (result.n_treatment, result.n_control, result.level) == (3, 2, pytest.approx(0.9))
    half = result.high - 1.5
    assert t_cdf(half / se, df) == pytest.approx(0.95, abs=1e-10)  # a 90 % two-sided interval
    less = welch([1.0, 2.0, 3.0], [0.0, 1.0], alpha=0.05, direction="less")
    assert less.p == pytest.approx(1 - result.p, rel=1e-9)
    both = welch([1.0, 2.0, 3.0], [0.0, 1.0], alpha=0.05, direction="two-sided")
    assert both.p == pytest.approx(2 * result.p, rel=1e-9)
    assert both.level == pytest.approx(0.95)


def test_welch_refuses_a_single_run_and_a_zero_spread():
    alone = welch([0.5], [0.2, 0.3], 0.05, "greater")
    assert alone.p is None and alone.low is None and alone.note == "n < 2 in an arm"
    flat = welch([0.3, 0.3], [0.2, 0.2], 0.05, "greater")
    assert flat.p is None and flat.low is None and flat.high is None
    assert flat.estimate == pytest.approx(0.1)


def test_paired_by_seed_on_a_small_table():
    # seeds 10-12 in both arms (13 only in control: dropped): differences .2 .05 .2, mean .15,
    # sd √((.05² + .1² + .05²)/2) = √.0075, se = √.0075/√3 = .05, t = 3 at 2 df:
    # P(T > 3) = 1/2 − 3/(2√11) = .0477329
    treatment = {10: 0.5, 11: 0.4, 12: 0.6}
    control = {10: 0.3, 11: 0.35, 12: 0.4, 13: 0.9}
    result = paired(treatment, control, 0.05, "greater")
    assert result.estimate == pytest.approx(0.15)
    assert result.p == pytest.approx(0.5 - 3 / (2 * math.sqrt(11)), rel=1e-9)
    assert (result.n_treatment, result.n_control) == (3, 3)
    # 90 % interval: .15 ± t₀.₉₅,₂ · .05 = .15 ± 2.919986 · .05
    assert result.low == pytest.approx(0.15 - 0.9 * math.sqrt(2 / 0.19) * 0.05, rel=1e-9)
    assert paired({10: 0.5}, {10: 0.3}, 0.05, "greater").p is None


def test_the_difference_a_design_detects_with_80_percent_power():
    # the paired table above: se .05 at 2 df, where t's quantiles have a closed form,
    # t_p = (2p − 1) / √(2p(1 − p)): t₀.₉₇₅ = .95/√.04875 = 4.302653, t₀.₈ = .6/√.32 = 1.060660,
    # so (4.302653 + 1.060660) · .05 = .268166 at one-sided α = .025
    def closed(p: float) -> float:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))

    result = paired({10: 0.5, 11: 0.4, 12: 0.6}, {10: 0.3, 11: 0.35, 12: 0.4}, 0.05, "greater")
    expected = (closed(0.975) + closed(0.8)) * 0.05
    assert expected == pytest.approx(0.268166, abs=1e-6)
    assert detectable(result, 0.025, "greater") == pytest.approx(expected, rel=1e-9)
    assert detectable(result, 0.025, "less") == pytest.approx(expected, rel=1e-9)
    # a two-sided claim splits α over its sides: α = .05 is .025 a side, the same figure
    assert detectable(result, 0.05, "two-sided") == pytest.approx(expected, rel=1e-9)
    # at 90 % power: t₀.₉ at 2 df = .8/√.18
    at_90 = (closed(0.975) + closed(0.9)) * 0.05
    assert detectable(result, 0.025, "greater", power=0.9) == pytest.approx(at_90, rel=1e-9)
    # no t statistic, no figure: a single pair, no spread, a log-rank test
    assert detectable(paired({10: 0.5}, {10: 0.3}, 0.05, "greater"), 0.05, "greater") is None
    assert detectable(welch([0.4, 0.4], [0.3, 0.3], 0.05, "greater"), 0.05, "greater") is None
    times = [Time(10, True), Time(20, False)]
    assert detectable(logrank(times, times, 0.05, "less"), 0.05, "less") is None


def test_at_the_detectable_difference_a_paired_test_finds_it_about_four_times_in_five():
    # the shift approximation against the t test itself: 40,000 seeded draws of n differences
    # ~ N(d, 1) with d the detectable difference at the true se 1/√n; the one-sided test at
    # α = .025 rejects 76.6 % (n = 3), 79.3 % (n = 5), 79.9 % (n = 10) of them at 200,000 draws
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    for n, low in ((3, 0.75), (5, 0.775), (10, 0.785)):
        design = Inference(0.0, None, None, 0.95, None, n, n, "paired", "", 1 / math.sqrt(n), n - 1)
        d = detectable(design, 0.025, "greater")
        draws = rng.normal(d, 1.0, (40_000, n))
        t = draws.mean(axis=1) / (draws.std(axis=1, ddof=1) / math.sqrt(n))
        power = float((t > t_ppf(0.975, n - 1)).mean())
        assert low < power < 0.81, (n, power)


def test_holm_bonferroni_and_none():
    # sorted .01 .03 .04: .01·3 = .03; .03·2 = .06; .04·1 = .04 → max(.06, .04) = .06
    assert adjust([0.01, 0.04, 0.03], "holm") == pytest.approx([0.03, 0.06, 0.06])
    assert adjust([0.01, 0.04, 0.03], "bonferroni") == pytest.approx([0.03, 0.12, 0.09])
    assert adjust([0.01, 0.04, 0.03], "none") == pytest.approx([0.01, 0.04, 0.03])
    # an untestable member counts as p = 1: the family stays two
    assert adjust([0.01, None], "holm") == pytest.approx([0.02, 1.0])
    assert adjust([0.6, 0.5], "holm") == pytest.approx([1.0, 1.0])
    assert interval_level(0.05, "greater") == pytest.approx(0.9)


def test_time_to_level_with_consecutive_evaluations_and_censoring():
    curve = {0: 0.20, 10: 0.25, 20: 0.31, 30: 0.29, 40: 0.33, 50: 0.35}
    assert time_to_level(curve, 0.30) == Time(20.0, True)
    # means of two: (10,20) .28, (20,30) .30 → reached at 30
    assert time_to_level(curve, 0.30, consecutive=2) == Time(30.0, True)
    assert time_to_level(curve, 0.40) == Time(50.0, False)  # censored at the last evaluation
    assert time_to_level(curve, 0.40, censor_at=100) == Time(100.0, False)
    assert time_to_level(curve, 0.34, censor_at=40) == Time(40.0, False)  # reached after it
    assert time_to_level(curve, 0.15) == Time(10.0, True)  # step 0 is before training
    assert time_to_level(curve, 0.15, include_start=True) == Time(0.0, True)
    assert time_to_level({0: 0.5}, 0.3) is None


def test_logrank_on_a_small_table():
    # treatment reaches at 20 and 30; control at 40 and never (censored at 100).
    # t=20: 4 at risk, 2 treatment, 1 reach (treatment): E .5, V 1·½·½·3/3 = .25
    # t=30: 3 at risk (30 | 40, 100), 1 treatment, 1 reach (treatment): E 1/3, V ⅓·⅔·2/2 = 2/9
    # t=40: 2 at risk, no treatment: E 0, V 0. O − E = 2 − 5/6, Z = (7/6)/√(.25 + 2/9)
    treatment = [Time(20, True), Time(30, True)]
    control = [Time(40, True), Time(100, False)]
    z = (7 / 6) / math.sqrt(0.25 + 2 / 9)
    assert logrank_z(treatment, control) == pytest.approx(z, rel=1e-12)
    result = logrank(treatment, control, 0.05, "less")
    # restricted means 25 and 70; of the 6 ways to split the 4 runs 2/2, only the observed one
    # (the two earliest reaches) has Z ≥ the observed Z: p = 1/6
    assert result.estimate == pytest.approx(-45.0)
    assert result.p == pytest.approx(1 / 6)
    assert result.low is None and (result.n_treatment, result.n_control) == (2, 2)
    # the other direction: every split has Z ≤ the observed one
    assert logrank(treatment, control, 0.05, "greater").p == pytest.approx(1.0)
    nobody = [Time(100, False), Time(100, False)]
    assert logrank(nobody, nobody, 0.05, "less").p is None


def test_logrank_falls_back_to_the_normal_approximation(monkeypatch):
    import tepo_cli.eval.report.censored as censored

    monkeypatch.setattr(censored, "MAX_SPLITS", 1)
    treatment = [Time(20, True), Time(30, True)]
    control = [Time(40, True), Time(100, False)]
    z = (7 / 6) / math.sqrt(0.25 + 2 / 9)
    result = censored.logrank(treatment, control, 0.05, "less")
    assert result.p == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-12)


def _run(path: Path, metrics=(), evals=(), samples=()) -> Run:
    path.mkdir(parents=True)
    if samples:
        (path / "eval_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return Run(path, path.name, "finished", {}, [], list(metrics), list(evals), None)


def test_per_problem_paired_on_a_small_table(tmp_path):
    # problems a b c; evaluations at steps 0 (left out: before training), 10, 20.
    # treatment runs: t1 passes a b at 10, a at 20; t2 passes a at 10, a c at 20.
    # pass rates over (2 runs × 2 evaluations): a 4/4, b 1/4, c 1/4
    # control run c1 passes a at 10, nothing at 20: a 1/2, b 0, c 0
    # d = .5 .25 .25: mean 1/3, sd √((1/6)² + 2(1/12)²)/√2 = .144338, se = sd/√3 = .083333,
    # t = 4 at 2 df: P(T > 4) = 1/2 − 4/(2√18)
    def outcomes(passed_by_step):
        return [
            {"step": step, "id": problem, "passed": problem in passed, "completion": "…"}
            for step, passed in passed_by_step.items()
            for problem in "abc"
        ]

    # t1 was resumed and evaluated step 20 twice, failing b the first time: the later record wins
    resumed = [{"step": 20, "id": "b", "passed": False}, {"step": 20, "id": "a", "passed": False}]
    t1_records = resumed + outcomes({0: "abc", 10: "ab", 20: "a"})
    t1 = _run(tmp_path / "t1", samples=t1_records)
    t2 = _run(tmp_path / "t2", samples=outcomes({0: "abc", 10: "a", 20: "ac"}))
    c1 = _run(tmp_path / "c1", samples=outcomes({0: "", 10: "a", 20: ""}))
    result = per_problem_paired([t1, t2], [c1], 0.05, "greater")
    assert result.estimate == pytest.approx(1 / 3)
    assert result.p == pytest.approx(0.5 - 4 / (2 * math.sqrt(18)), rel=1e-9)
    assert (result.n_treatment, result.n_control) == (2, 1)
    assert "3 problems" in result.note
    # at step 10 only: treatment a 1, b 1/2, c 0; control a 1: d = 0 .5 0, mean 1/6,
    # sd √((1/6)² + (1/3)² + (1/6)²)/√2 = .288675, se = 1/6, t = 1 at 2 df
    at_10 = per_problem_paired([t1, t2], [c1], 0.05, "greater", step=10)
    assert at_10.estimate == pytest.approx(1 / 6)
    assert at_10.p == pytest.approx(0.5 - 1 / (2 * math.sqrt(3)), rel=1e-9)
    empty = _run(tmp_path / "empty")
    assert per_problem_paired([t1], [empty], 0.05, "greater").p is None


def test_run_metrics_on_one_run(tmp_path):
    # entropy 1.0 over steps 1-3, .7 over 4-5 and .6 at step 6; accuracy .1·step
    metrics = [
        {"step": s, "entropy": e, "accuracy": 0.1 * s}
        for s, e in zip(range(1, 7), (1.0, 1.0, 1.0, 0.7, 0.7, 0.6), strict=True)
    ]
    evals = [{"step": 0, "accuracy": 0.2}, {"step": 3, "accuracy": 0.3}]
    evals += [{"step": 6, "accuracy": 0.5}]
    run = _run(tmp_path / "r", metrics, evals)
    window = {"first": [1, 2], "last": [5, 6]}
    assert RUN_METRICS["eval_auc"].of_run(run, {}) == pytest.approx(0.4)  # (.3 + .5)/2
    assert RUN_METRICS["final_accuracy"].of_run(run, {}) == pytest.approx(0.5)
    assert RUN_METRICS["final_accuracy"].of_run(run, {"step": 3}) == pytest.approx(0.3)
    # last (.7 + .6)/2 = .65, first 1.0: −.35 and −35 %
    assert RUN_METRICS["entropy_change"].of_run(run, window) == pytest.approx(-0.35)
    assert RUN_METRICS["entropy_relative_change"].of_run(run, window) == pytest.approx(-0.35)
    assert RUN_METRICS["train_accuracy_mean"].of_run(run, {}) == pytest.approx(0.35)
    assert RUN_METRICS["train_accuracy_mean"].of_run(run, {"window": [5, 6]}) == pytest.approx(0.55)
    assert RUN_METRICS["entropy_change"].of_run(run, {"first": [1, 2], "last": [91, 100]}) is None
    assert RUN_METRICS["entropy_mean"].of_run(run, {"window": [5, 6]}) == pytest.approx(0.65)
    assert RUN_METRICS["entropy_mean"].of_run(run, {}) == pytest.approx(5 / 6)  # (3 + 1.4 + .6)/6
    assert RUN_METRICS["entropy_mean"].of_run(run, {"window": [7, 9]}) is None


def test_stability_metrics_on_one_run(tmp_path):
    # held-out .50 (step 0, left out) → .20 → .30 → .22 → .25 → .10: falls .08 and .15 after
    # step 0, the largest .15 (with step 0 it would be .30)
    evals = [
        {"step": s, "accuracy": a}
        for s, a in zip((0, 1, 2, 4, 6, 8), (0.5, 0.2, 0.3, 0.22, 0.25, 0.1), strict=True)
    ]
    # gradient norms 1, 2, 2, 0 (nothing updated: not counted), 7, 3, None, 1: median of the six
    # updating steps (1, 1, 2, 2, 3, 7) is 2; over 3 × 2 = 6 only the 7 (1 of 6); over 1.2 × 2 = 2.4
    # the 7 and the 3 (2 of 6)
    norms = (1.0, 2.0, 2.0, 0.0, 7.0, 3.0, None, 1.0)
    metrics = [{"step": s, "grad_norm": n} for s, n in enumerate(norms, start=1)]
    run = _run(tmp_path / "r", metrics, evals)
    assert RUN_METRICS["eval_max_drop"].of_run(run, {}) == pytest.approx(0.15)
    assert RUN_METRICS["grad_norm_spikes"].of_run(run, {}) == pytest.approx(1 / 6)
    assert RUN_METRICS["grad_norm_spikes"].of_run(run, {"factor": 1.2}) == pytest.approx(2 / 6)
    rising = _run(tmp_path / "up", [], [{"step": 5, "accuracy": 0.1}, {"step": 9, "accuracy": 0.2}])
    assert RUN_METRICS["eval_max_drop"].of_run(rising, {}) == 0.0  # never falls
    assert RUN_METRICS["grad_norm_spikes"].of_run(rising, {}) is None  # never updated
    one = _run(tmp_path / "one", [], [{"step": 0, "accuracy": 0.9}, {"step": 5, "accuracy": 0.1}])
    assert RUN_METRICS["eval_max_drop"].of_run(one, {}) is None  # no pair to fall between


def test_step_mean_averages_any_key_over_a_window(tmp_path):
    # clip_frac .1 .2 .3 .4 at steps 1-4 (step 3 lacks it): all .7/3, steps 2-4 .6/2
    metrics = [{"step": s, "clip_frac": c} for s, c in ((1, 0.1), (2, 0.2), (4, 0.4))]
    metrics.insert(2, {"step": 3})
    run = _run(tmp_path / "r", metrics)
    step_mean = RUN_METRICS["step_mean"].of_run
    assert step_mean(run, {"key": "clip_frac"}) == pytest.approx(0.7 / 3)
    assert step_mean(run, {"key": "clip_frac", "window": [2, 4]}) == pytest.approx(0.3)
    assert step_mean(run, {"key": "kl"}) is None  # never logged
