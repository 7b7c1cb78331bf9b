"""The per-run metrics a protocol can register, by name: each a function of one run's records.

A protocol names its primaries by these names (`metric: eval_auc`), with `params`; the report
computes exactly these, so what was registered and what is tested cannot drift apart. Two
metrics are not one number per run and have their own test: `steps_to_level` (a censored time,
log-rank, censored.py) and `per_problem_paired` (per-problem outcomes, per_problem.py).

Windows are inclusive step ranges [first, last] of metrics.jsonl's training steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from tepo_cli.eval.report.dynamics import held_out_curve
from tepo_cli.eval.report.runs import Run

Params = dict[str, Any]


@dataclass(frozen=True)
class Metric:
    name: str
    of_run: Callable[[Run, Params], float | None]
    params: frozenset[str]  # the params it accepts
    tests: tuple[str, ...]  # the tests that apply to it; the first is its default
    says: str  # what it is, for the legend


def _window(run: Run, key: str, window: Any) -> float | None:
    """Mean of `key` over the training steps in the inclusive range [first, last]."""
    first, last = (int(v) for v in window)
    values = [
        float(m[key])
        for m in run.metrics
        if "step" in m and first <= int(m["step"]) <= last and m.get(key) is not None
    ]
    return statistics.fmean(values) if values else None


def eval_auc(run: Run, params: Params) -> float | None:
    """Mean held-out accuracy over the evaluations after step 0: with a common schedule, the area
    under the learning curve per evaluation, higher when learning is faster (and step 0, the
    same for every run, adds nothing to a difference)."""
    values = [value for step, value in held_out_curve(run).items() if step > 0]
    return statistics.fmean(values) if values else None


def final_accuracy(run: Run, params: Params) -> float | None:
    """Held-out accuracy at `params.step` (default: the run's last evaluation)."""
    curve = held_out_curve(run)
    if not curve:
        return None
    return curve.get(int(params["step"])) if "step" in params else curve[max(curve)]


_FIRST, _LAST = (1, 10), (91, 100)  # the decisive experiment's windows (audit §4.1)
_EVERY_STEP = (1, 10**9)  # a window without bounds: every step


def entropy_change(run: Run, params: Params) -> float | None:
    """Mean token entropy over the `last` window minus over the `first` (a collapse is a fall)."""
    first = _window(run, "entropy", params.get("first", _FIRST))
    last = _window(run, "entropy", params.get("last", _LAST))
    return None if first is None or last is None else last - first


def entropy_relative_change(run: Run, params: Params) -> float | None:
    """entropy_change / the `first` window's mean: −0.20 is a 20 % fall (the gate's measure)."""
    first = _window(run, "entropy", params.get("first", _FIRST))
    last = _window(run, "entropy", params.get("last", _LAST))
    if first is None or last is None or first == 0:
        return None
    return (last - first) / first


def entropy_mean(run: Run, params: Params) -> float | None:
    """Mean token entropy over `window` [first, last] (default: every step): the level, where
    entropy_change is the fall (e.g. a final entropy, paired by seed, for an equal-learning check)."""
    return _window(run, "entropy", params.get("window", _EVERY_STEP))


def train_accuracy_mean(run: Run, params: Params) -> float | None:
    """Mean training `accuracy` (share of correct sampled answers) over `window` [first, last]
    (default: every step). Every step draws fresh problems, so it is a dense learning curve."""
    window = params.get("window", _EVERY_STEP)
    return _window(run, "accuracy", window)


def step_mean(run: Run, params: Params) -> float | None:
    """Mean of the training records' `params.key` (e.g. clip_frac) over `window` [first, last]
    (default: every step): any per-step quantity a claim is about."""
    return _window(run, str(params["key"]), params.get("window", _EVERY_STEP))


def eval_max_drop(run: Run, params: Params) -> float | None:
    """The largest fall of held-out accuracy between two consecutive evaluations after step 0
    (0 when it never falls): a collapse is one large drop; the set's sampling noise gives small
    ones. Step 0 is left out as in eval_auc (a protocol may evaluate it in one run only)."""
    curve = held_out_curve(run)
    values = [curve[step] for step in sorted(curve) if step > 0]
    if len(values) < 2:
        return None
    return max(0.0, *(before - after for before, after in pairwise(values)))


def grad_norm_spikes(run: Run, params: Params) -> float | None:
    """Share of the updating steps whose gradient norm exceeds `factor` (default 3) times the
    run's own median: spikes on each run's scale (objectives' norms differ in size). A step
    that updated nothing (every row skipped: no or a zero norm) is not counted."""
    norms = [float(m["grad_norm"]) for m in run.metrics if "step" in m and m.get("grad_norm")]
    if not norms:
        return None
    bound = float(params.get("factor", 3.0)) * statistics.median(norms)
    return sum(norm > bound for norm in norms) / len(norms)


RUN_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("eval_auc", eval_auc, frozenset(), ("welch", "paired"), eval_auc.__doc__ or ""),
        Metric(
            "final_accuracy", final_accuracy, frozenset({"step"}), ("welch", "paired"),
            "held-out accuracy at the last evaluation (or params.step)",
        ),
        Metric(
            "entropy_change", entropy_change, frozenset({"first", "last"}), ("welch", "paired"),
            "mean entropy over the last window minus the first",
        ),
        Metric(
            "entropy_relative_change", entropy_relative_change, frozenset({"first", "last"}),
            ("welch", "paired"), "entropy change / the first window's mean",
        ),
        Metric(
            "entropy_mean", entropy_mean, frozenset({"window"}), ("paired", "welch"),
            "mean token entropy over the window",
        ),
        Metric(
            "train_accuracy_mean", train_accuracy_mean, frozenset({"window"}),
            ("paired", "welch"), "mean training accuracy over the window",
        ),
        Metric(
            "step_mean", step_mean, frozenset({"key", "window"}), ("welch", "paired"),
            "mean of a metrics.jsonl key over the window",
        ),
        Metric(
            "eval_max_drop", eval_max_drop, frozenset(), ("welch", "paired"),
            "the largest fall between consecutive held-out evaluations after step 0",
        ),
        Metric(
            "grad_norm_spikes", grad_norm_spikes, frozenset({"factor"}), ("welch", "paired"),
            "share of updating steps with a gradient norm over factor x the run's median",
        ),
    )
}  # fmt: skip

# Not one number per run: their own tests (censored.py, per_problem.py).
STEPS_TO_LEVEL = "steps_to_level"
PER_PROBLEM = "per_problem_paired"
SPECIAL: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    STEPS_TO_LEVEL: (frozenset({"level", "consecutive", "censor_at"}), ("logrank",)),
    PER_PROBLEM: (frozenset({"step"}), ("mcnemar",)),
}


# The params a metric cannot do without, each with what it is (the refusal's words).
REQUIRED: dict[str, dict[str, str]] = {
    STEPS_TO_LEVEL: {"level": "the held-out accuracy to reach, e.g. 0.30"},
    "step_mean": {"key": "the metrics.jsonl key to average, e.g. clip_frac"},
}


def metric_names() -> list[str]:
    return [*RUN_METRICS, *SPECIAL]


def accepted(metric: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """(params, tests) a metric accepts; KeyError for an unknown metric."""
    if metric in RUN_METRICS:
        return RUN_METRICS[metric].params, RUN_METRICS[metric].tests
    return SPECIAL[metric]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _window_problem(value: Any) -> str | None:
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 <= value[0] <= value[1]
    )
    return None if ok else "an inclusive step window [first, last] of two integers, first ≤ last"


# param -> what is wrong with a value (None: fine)
_PARAM_RULES: dict[str, Callable[[Any], str | None]] = {
    "first": _window_problem,
    "last": _window_problem,
    "window": _window_problem,
    "step": lambda v: None if isinstance(v, int) and v >= 0 else "an evaluated step (integer ≥ 0)",
    "level": lambda v: None if _is_number(v) and 0 <= v <= 1 else "an accuracy in [0, 1]",
    "consecutive": lambda v: None if isinstance(v, int) and v >= 1 else "an integer ≥ 1",
    "censor_at": lambda v: None if _is_number(v) and v > 0 else "a step > 0",
    "factor": lambda v: None if _is_number(v) and v > 1 else "a number > 1",
    "key": lambda v: None if isinstance(v, str) and v else "a metrics.jsonl key (e.g. clip_frac)",
}


def param_problem(name: str, value: Any) -> str | None:
    """What a param's value must be, when `value` is not that; None when it is."""
    return _PARAM_RULES[name](value)
