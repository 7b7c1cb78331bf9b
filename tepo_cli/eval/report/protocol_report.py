"""`tepo report RUNS_DIR --protocol PROTOCOL.yaml`: exactly the registered claims, with verdicts.

A pre-registered protocol (tepo_cli/protocol/spec.py) names its arms, seeds, α, the correction and
its primary claims (metric, treatment, control, direction, test, optional gate). This computes
those and nothing else for the verdicts, so the analysis cannot be chosen after seeing the data.

Runs are matched to arms **by directory name**, `{arm}_seed{seed}` (what `tepo protocol run`
writes), for an arm and a seed the protocol declares. A run whose `.hydra/overrides.yaml` is
recorded but lacks one of its arm's overrides, or whose config's seed is another, is excluded and
said (a renamed or mis-filed directory must not enter an arm). Only finished runs count; the
runs the protocol declares that are absent or unfinished are listed, and n is what is there.

Verdict of a primary, in this order:
- "untestable (gate)": its gate's metric, averaged over the gate arm's gate seeds, is not within
  its bound (`at_most` / `at_least`), or those runs are not all there yet;
- "untestable (n < 2)": fewer than 2 runs (or seed pairs) in an arm, or no p-value otherwise;
- "supported": the family-adjusted p (Holm by default, over all primaries; an untestable one
  counts as p = 1, so the family stays the registered one) is below α;
- "not supported": otherwise.
Secondaries are computed the same way and reported below, labelled exploratory, unadjusted.
Under both tables, each finished run's value of every metric that is one number (or one censored
time) per run: the numbers the tests compared, so a reader can see which runs made a difference.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.censored import Time, logrank, time_to_level
from tepo_cli.eval.report.dynamics import held_out_curve
from tepo_cli.eval.report.inference import (
    Inference,
    adjust,
    detectable,
    paired,
    welch,
)
from tepo_cli.eval.report.machines import run_machine
from tepo_cli.eval.report.per_problem import per_problem_paired
from tepo_cli.eval.report.protocol_check import check, claim_params
from tepo_cli.eval.report.protocol_metrics import (
    PER_PROBLEM,
    RUN_METRICS,
    STEPS_TO_LEVEL,
)
from tepo_cli.eval.report.run_history import RunHistory
from tepo_cli.eval.report.runs import Run

SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
UNTESTABLE_GATE = "untestable (gate)"
UNTESTABLE_N = "untestable (n < 2)"


@dataclass(frozen=True)
class ClaimResult:
    name: str
    metric: str
    treatment: str
    control: str
    direction: str
    result: Inference
    adjusted_p: float | None = None  # primaries only
    verdict: str = ""  # primaries only
    gate: str = ""  # what the gate found, when there is one
    detectable: float | None = None  # primaries: at 80 % power and α / primaries (inference.py)


@dataclass(frozen=True)
class RunValues:
    """One finished run's value of each per-run column (`per_run_columns`): a number, a Time for
    steps_to_level, None where the run's records do not give one."""

    arm: str
    seed: int
    run: str
    values: tuple[float | Time | None, ...]
    machine: str | None = None  # where it trained, when it recorded it (machines.py)


@dataclass
class ProtocolReport:
    name: str
    alpha: float
    correction: str
    arms: dict[str, dict[int, Run]]  # arm -> seed -> finished run
    primaries: list[ClaimResult]
    secondaries: list[ClaimResult]
    missing: list[str] = field(default_factory=list)  # declared runs not found
    unfinished: list[str] = field(default_factory=list)  # found, not finished (state)
    excluded: list[str] = field(default_factory=list)  # named like a run, but not one (why)
    registered: int = 0  # the runs the protocol declares
    finished: int = 0  # of those, the finished ones (every seed's, whatever `subset`)
    subset: tuple[int, ...] = ()  # the seeds compared when not all (--seeds): not registered
    stopped: str = ""  # an early stop's label (protocol/early_stop.py): fewer seeds, declared
    machines: str | None = None  # several machines, or a group in two precisions (machines.py)
    columns: list[str] = field(default_factory=list)  # per-run columns: claim (metric)
    per_run: list[RunValues] = field(default_factory=list)  # finished runs, registered order
    history: list[RunHistory] = field(default_factory=list)  # each journaled run's tries
    deviations: list[str] = field(default_factory=list)  # the journal's experiment-wide lines
    registration: str = ""  # its first commit against its first run (registration.py)

    @property
    def runs_in(self) -> str:
        """'' when every registered run is finished and used; else "k of N registered runs"."""
        return (
            ""
            if self.finished == self.registered
            else f"{self.finished} of {self.registered} registered runs"
        )

    @property
    def label(self) -> str:
        """'' for the registered analysis; else what every table of another look carries: one
        before the end (interim), or over some of the seeds (a subset a deviation declares), and
        the early stop that left the registered analysis fewer seeds."""
        looks = [f"INTERIM, {self.runs_in}"] if self.runs_in else []
        if self.subset:
            looks.append(f"SUBSET, seeds {', '.join(map(str, self.subset))} of the registered")
        other = f"{'; '.join(looks)}: not the registered analysis" if looks else ""
        return "; ".join(part for part in (self.stopped, other) if part)


def match_runs(
    protocol: Any, runs: list[Run]
) -> tuple[dict[str, dict[int, Run]], list[str], list[str], list[str]]:
    """(arm -> seed -> finished run, missing names, unfinished names, excluded names with why)."""
    arms: dict[str, dict[int, Run]] = {arm: {} for arm in protocol.arms}
    found: set[str] = set()
    unfinished: list[str] = []
    excluded: list[str] = []
    expected = {
        f"{arm}_seed{seed}": (arm, int(seed)) for arm in protocol.arms for seed in protocol.seeds
    }
    for run in runs:
        name = run.path.name
        if name not in expected:
            continue
        arm, seed = expected[name]
        overrides = set(run.overrides or [])
        lacking = [
            o for o in protocol.arms[arm] if run.overrides is not None and o not in overrides
        ]
        configured = run.config.get("seed")
        if lacking:
            excluded.append(f"{run.name} (its overrides lack {', '.join(lacking)})")
            continue
        if configured is not None and int(configured) != seed:
            excluded.append(f"{run.name} (its config's seed is {configured}, not {seed})")
            continue
        if name in found:
            excluded.append(f"{run.name} (a second run named {name})")
            continue
        found.add(name)
        if run.finished:
            arms[arm][seed] = run
        else:
            unfinished.append(f"{run.name} ({run.state})")
    missing = [name for name in expected if name not in found]
    return arms, missing, unfinished, excluded


def _values(runs: dict[int, Run], metric: str, params: dict[str, Any]) -> dict[int, float]:
    of_run = RUN_METRICS[metric].of_run
    values = {seed: of_run(run, params) for seed, run in runs.items()}
    return {s: float(v) for s, v in values.items() if v is not None and math.isfinite(v)}


def evaluate(claim: Any, arms: dict[str, dict[int, Run]], alpha: float) -> Inference:
    """The claim's test on the finished runs of its two arms."""
    treatment, control = arms[claim.treatment], arms[claim.control]
    params, direction = claim_params(claim), claim.direction
    if claim.metric == STEPS_TO_LEVEL:

        def times(runs: dict[int, Run]) -> list[Time]:
            found = (_time_to_level(run, params) for run in runs.values())
            return [t for t in found if t is not None]

        return logrank(times(treatment), times(control), alpha, direction)
    if claim.metric == PER_PROBLEM:
        step = params.get("step")
        return per_problem_paired(
            list(treatment.values()), list(control.values()), alpha, direction,
            None if step is None else int(step),
        )  # fmt: skip
    test = getattr(claim, "test", None) or RUN_METRICS[claim.metric].tests[0]
    values_t = _values(treatment, claim.metric, params)
    values_c = _values(control, claim.metric, params)
    if test == "paired":
        return paired(values_t, values_c, alpha, direction)
    return welch(list(values_t.values()), list(values_c.values()), alpha, direction)


def gate_status(gate: Any, arms: dict[str, dict[int, Run]]) -> tuple[bool, str]:
    """(passed, what it found): the gate metric's mean over the gate seeds' runs against its
    bound; a gate whose runs are not all finished has not passed."""
    runs = arms[gate.arm]
    seeds = [int(s) for s in gate.seeds]
    absent = [s for s in seeds if s not in runs]
    if absent:
        return False, f"gate: {gate.arm} seed(s) {', '.join(map(str, absent))} not finished"
    values = _values({s: runs[s] for s in seeds}, gate.metric, claim_params(gate))
    if len(values) < len(seeds):
        return False, f"gate: {gate.metric} not computable for every {gate.arm} gate seed"
    mean = statistics.fmean(values.values())
    each = ", ".join(f"seed {s} {v:+.3f}" for s, v in sorted(values.items()))
    at_most, at_least = getattr(gate, "at_most", None), getattr(gate, "at_least", None)
    passed = (at_most is None or mean <= at_most) and (at_least is None or mean >= at_least)
    bound = f"≤ {at_most:+.3f}" if at_most is not None else f"≥ {at_least:+.3f}"
    word = "passed" if passed else "failed"
    return passed, f"gate {word}: {gate.arm} {gate.metric} mean {mean:+.3f} ({each}), needs {bound}"


def per_run_columns(protocol: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(header, metric, params) of every registered metric, and gate, that has one value per run,
    primaries first, in the protocol's order; per_problem_paired has none."""
    columns = []
    for claim in [*protocol.primaries, *protocol.secondaries]:
        if claim.metric != PER_PROBLEM:
            columns.append((f"{claim.name} ({claim.metric})", claim.metric, claim_params(claim)))
        gate = getattr(claim, "gate", None)
        if gate is not None:
            columns.append((f"{claim.name} gate ({gate.metric})", gate.metric, claim_params(gate)))
    return columns


def _time_to_level(run: Run, params: dict[str, Any]) -> Time | None:
    level, consecutive = float(params["level"]), int(params.get("consecutive", 1))
    return time_to_level(held_out_curve(run), level, consecutive, params.get("censor_at"))


def _run_value(run: Run, metric: str, params: dict[str, Any]) -> float | Time | None:
    if metric == STEPS_TO_LEVEL:
        return _time_to_level(run, params)
    value = RUN_METRICS[metric].of_run(run, params)
    return float(value) if value is not None and math.isfinite(value) else None


def per_run_values(protocol: Any, arms: dict[str, dict[int, Run]]) -> list[RunValues]:
    """Each finished run's value of every per-run column, arms in the protocol's order, seeds
    ascending."""
    columns = per_run_columns(protocol)
    rows = []
    for arm, runs in arms.items():
        for seed, run in sorted(runs.items()):
            values = tuple(_run_value(run, metric, params) for _, metric, params in columns)
            rows.append(RunValues(arm, seed, run.path.name, values, run_machine(run)))
    return rows


def power_family(correction: str, primaries: int) -> int:
    """The divisor of α for the detectable difference: the primaries' count under a correction
    (Holm's first step, Bonferroni's every step: what a claim detects whatever the others show),
    1 without one."""
    return 1 if correction == "none" else primaries


def protocol_report(
    protocol: Any, runs: list[Run], source: Path, subset: list[int] | None = None
) -> ProtocolReport:
    """The verdicts of the protocol's primaries and its exploratory secondaries; with `subset`,
    compared over those of its seeds only, each gate still read on its registered seeds (a
    gate says whether a claim can be tested at all, whichever seeds are then compared)."""
    check(protocol, source)
    alpha, correction = float(protocol.alpha), str(protocol.correction)
    every_seed, missing, unfinished, excluded = match_runs(protocol, runs)
    seeds = _subset(protocol, subset, source)
    arms = {
        arm: {seed: run for seed, run in runs.items() if seed in seeds}
        for arm, runs in every_seed.items()
    }
    results = [evaluate(claim, arms, alpha) for claim in protocol.primaries]
    gates = [
        gate_status(claim.gate, every_seed)
        if getattr(claim, "gate", None) is not None
        else (True, "")
        for claim in protocol.primaries
    ]
    testable = [passed and r.p is not None for r, (passed, _) in zip(results, gates, strict=True)]
    family = [r.p if ok else None for r, ok in zip(results, testable, strict=True)]
    adjusted = adjust(family, correction)
    primaries = []
    for claim, result, (passed, gate_text), ok, p_adjusted in zip(
        protocol.primaries, results, gates, testable, adjusted, strict=True
    ):
        if not passed:
            verdict = UNTESTABLE_GATE
        elif not ok:
            verdict = UNTESTABLE_N
        else:
            verdict = SUPPORTED if p_adjusted < alpha else NOT_SUPPORTED
        smallest = detectable(
            result, alpha / power_family(correction, len(protocol.primaries)), claim.direction
        )
        row = ClaimResult(
            claim.name, claim.metric, claim.treatment, claim.control, claim.direction, result,
            p_adjusted if ok else None, verdict, gate_text, smallest,
        )  # fmt: skip
        primaries.append(row)
    secondaries = [
        ClaimResult(c.name, c.metric, c.treatment, c.control, c.direction, evaluate(c, arms, alpha))
        for c in protocol.secondaries
    ]
    return ProtocolReport(
        protocol.name, alpha, correction, arms, primaries, secondaries, missing, unfinished,
        excluded, len(protocol.runs()), sum(len(runs) for runs in every_seed.values()),
        tuple(sorted(seeds)) if subset else (),
        columns=[header for header, _, _ in per_run_columns(protocol)],
        per_run=per_run_values(protocol, arms),
    )  # fmt: skip


def _subset(protocol: Any, subset: list[int] | None, source: Path) -> set[int]:
    """The seeds to compare: all the protocol's, or `subset` (each one of them, at least two)."""
    registered = [int(seed) for seed in protocol.seeds]
    if subset is None:
        return set(registered)
    foreign = [seed for seed in subset if seed not in registered]
    if foreign or len(set(subset)) < 2:
        raise ConfigError(
            f"--seeds {','.join(map(str, subset))}: a subset compares at least two of the seeds "
            f"{source} registers ({', '.join(map(str, registered))})"
            + (f"; {', '.join(map(str, foreign))} is not one of them" if foreign else "")
            + ". Nothing was written or shown."
        )
    return set(subset)
