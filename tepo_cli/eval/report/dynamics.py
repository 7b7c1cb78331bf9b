"""What the seed papers' claims are judged by, per group over its finished seeds.

- Held-out accuracy at every evaluated step (mean ± 95 % CI): the learning curve itself.
- Convergence time, as TEPO's paper measures it: the first evaluated step (and the training
  seconds to it) at which a run's held-out accuracy reaches a fraction (50 %, 90 %) of the best
  mean held-out accuracy of a reference group (GRPO by default) — one level for every group, so
  the steps compare. Where training starts above such a level (a model that already solves a
  fifth of the problems), `--levels gain` takes the fractions of the reference's gain instead:
  start + fraction × (best − start), start being its mean before training.
- Held-out AUC: each run's mean held-out accuracy over its evaluations after step 0.
- Steps to a level, censored: as convergence time, but a run that never reached the level counts
  at its last evaluated step (it took at least that long) instead of being left out.
- Entropy collapse: the mean token entropy of the sampled answers over the first and the last
  `last` steps, and TEPO's KL-mask share (`kl_mask_frac`), when logged.
- Answer length and the truncated share over the last `last` steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.censored import time_to_level
from tepo_cli.eval.report.grouping import Group
from tepo_cli.eval.report.rows import Options
from tepo_cli.eval.report.runs import Run
from tepo_cli.eval.report.stats import Crossing, Estimate, estimate


@dataclass(frozen=True)
class Reference:
    """The levels the fractions make: of the best mean held-out accuracy of one group, or, with
    `gain`, of that group's gain from its mean before training (`start`) to its best."""

    label: str
    best: float
    step: int
    start: float = 0.0
    gain: bool = False

    def level(self, fraction: float) -> float:
        if self.gain:
            return self.start + fraction * (self.best - self.start)
        return fraction * self.best


@dataclass(frozen=True)
class Reach:
    """Over a group's finished runs: steps and seconds to fraction × the reference's best."""

    fraction: float
    steps: Estimate | None
    seconds: Estimate | None
    cpu_seconds: Estimate | None
    reached: int
    finished: int
    # over every finished run, one that never reached the level counted at its last evaluation
    censored: Estimate | None = None


@dataclass(frozen=True)
class DynamicsRow:
    group: Group
    curve: dict[int, Estimate]  # evaluated step -> held-out accuracy over the finished runs
    best: Estimate | None  # each run's best held-out accuracy
    auc: Estimate | None  # each run's mean held-out accuracy after step 0
    reaches: list[Reach]
    entropy_first: Estimate | None
    entropy_last: Estimate | None
    mask_frac: Estimate | None
    length_last: Estimate | None
    truncated_last: Estimate | None


def held_out_curve(run: Run) -> dict[int, float]:
    """Held-out accuracy by training step (0: before training); a later record of a step wins."""
    return {
        int(record["step"]): float(record["accuracy"])
        for record in run.evals
        if record.get("step") is not None and record.get("accuracy") is not None
    }


def group_curve(runs: list[Run]) -> dict[int, Estimate]:
    curves = [held_out_curve(run) for run in runs if run.finished]
    steps = sorted({step for curve in curves for step in curve})
    points = {step: estimate(curve.get(step) for curve in curves) for step in steps}
    return {step: value for step, value in points.items() if value is not None}


def find_reference(
    groups: list[Group], wanted: str | None, gain: bool = False, explicit: bool = True
) -> Reference | None:
    """The group matching every `key=value` of `wanted` (e.g. "algo=grpo": a swept value, or else
    the runs' config, `algo.name` for a group choice), with the best mean of its held-out curve
    (and its mean before training, step 0); None when no group matches or it has no evaluation.
    When several groups match, a comparison against one of them, chosen silently, would read as
    one against all: ConfigError where the user named `wanted` (`explicit`), else None (the
    default `algo=grpo` in a sweep of another key too: the report goes on without a reference)."""
    if not wanted:
        return None
    matching = matching_groups(groups, wanted)
    if len(matching) > 1 and not explicit:
        return None
    if len(matching) > 1:
        labels = ", ".join(repr(g.label) for g in matching)
        raise ConfigError(
            f"--reference {wanted!r} matches {len(matching)} groups ({labels}): name one, with "
            f"as many key=value pairs as it takes, e.g. --reference {matching[0].label!r}. "
            "Nothing was written."
        )
    if not matching:
        return None
    curve = group_curve(matching[0].runs)
    if not curve:
        return None
    step = max(curve, key=lambda s: (curve[s].mean, -s))
    start = curve[0].mean if 0 in curve else 0.0
    return Reference(matching[0].label, curve[step].mean, step, start, gain)


def matching_groups(groups: list[Group], wanted: str) -> list[Group]:
    """The groups matching every `key=value` of `wanted` (find_reference)."""
    parts = [part.split("=", 1) for part in wanted.split()]
    return [g for g in groups if all(_matches(g, key, value) for key, value in parts)]


def _matches(group: Group, key: str, value: str) -> bool:
    if key in group.values:
        return group.values[key] == value
    configs = [run.config for run in group.runs]
    return bool(configs) and all(
        str(config.get(key, config.get(f"{key}.name"))) == value for config in configs
    )


def first_reaching(run: Run, level: float) -> Crossing | None:
    """The first evaluated step whose held-out accuracy is ≥ level, with the training seconds up to
    it (the sum of step_seconds of the steps before and at it; evaluations excluded) and the CPU
    seconds likewise (step_cpu_seconds; None for a run that logged none)."""
    curve = held_out_curve(run)
    step = next((s for s in sorted(curve) if curve[s] >= level - 1e-12), None)
    if step is None:
        return None
    return Crossing(
        step, _summed(run, "step_seconds", step), _summed(run, "step_cpu_seconds", step)
    )


def _summed(run: Run, key: str, step: int) -> float | None:
    """The sum of `key` over the training steps up to `step`; None when a step lacks it."""
    values = [m.get(key) for m in run.metrics if "step" in m and m["step"] <= step]
    return None if any(v is None for v in values) else float(sum(values))


def _auc(curve: dict[int, float]) -> float | None:
    """The mean of the evaluations after step 0: the area under the learning curve per
    evaluation on a common schedule (the same as compare.py's "mean over training")."""
    values = [value for step, value in curve.items() if step > 0]
    return statistics.fmean(values) if values else None


def _estimate_known(values: list[float | None]) -> Estimate | None:
    """Over every run or none: a run that did not log a time leaves the group's unknown."""
    return None if any(v is None for v in values) else estimate(values)


def _mean(metrics: list[dict[str, Any]], key: str, take: slice) -> float | None:
    values = [float(m[key]) for m in metrics if "step" in m and m.get(key) is not None]
    values = values[take]
    return statistics.fmean(values) if values else None


def dynamics_row(
    group: Group, reference: Reference | None, fractions: tuple[float, ...], last: int
) -> DynamicsRow:
    done = [run for run in group.runs if run.finished]
    reaches = []
    for fraction in fractions:
        crossings = (
            [first_reaching(run, reference.level(fraction)) for run in done] if reference else []
        )
        hit = [c for c in crossings if c is not None]
        times = (
            [time_to_level(held_out_curve(r), reference.level(fraction), include_start=True)
             for r in done]
            if reference
            else []
        )  # fmt: skip
        reaches.append(
            Reach(
                fraction,
                estimate(float(c.step) for c in hit),
                _estimate_known([c.seconds for c in hit]),
                _estimate_known([c.cpu_seconds for c in hit]),
                len(hit),
                len(done),
                estimate(t.step for t in times if t is not None),
            )
        )
    curves = [held_out_curve(run) for run in done]
    return DynamicsRow(
        group=group,
        curve=group_curve(group.runs),
        best=estimate(max(curve.values()) if curve else None for curve in curves),
        auc=estimate(_auc(curve) for curve in curves),
        reaches=reaches,
        entropy_first=estimate(_mean(r.metrics, "entropy", slice(None, last)) for r in done),
        entropy_last=estimate(_mean(r.metrics, "entropy", slice(-last, None)) for r in done),
        mask_frac=estimate(_mean(r.metrics, "kl_mask_frac", slice(None)) for r in done),
        length_last=estimate(_mean(r.metrics, "response_length", slice(-last, None)) for r in done),
        truncated_last=estimate(
            _mean(r.metrics, "truncated_frac", slice(-last, None)) for r in done
        ),
    )


def build_dynamics(
    groups: list[Group], options: Options
) -> tuple[Reference | None, list[DynamicsRow]]:
    """The reference group (`--reference`) and each group's steps to its levels."""
    reference = find_reference(
        groups, options.reference, options.gain, explicit=options.reference_given
    )
    fractions, last = options.fractions, options.last
    return reference, [dynamics_row(g, reference, fractions, last) for g in groups]
