"""A protocol's claims checked against the metrics, params and tests `tepo report` computes,
before any run is read or anything written (protocol_report.py computes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.inference import DIRECTIONS
from tepo_cli.eval.report.protocol_metrics import (
    REQUIRED,
    RUN_METRICS,
    accepted,
    metric_names,
    param_problem,
)


def claim_params(claim: Any) -> dict[str, Any]:
    return dict(getattr(claim, "params", None) or {})


def check(protocol: Any, source: Path) -> None:
    """Every claim's metric, params and test are ones the report computes; one ConfigError
    paragraph naming the claim and key otherwise (before anything is read or written)."""
    claims = [("primaries", c) for c in protocol.primaries]
    claims += [("secondaries", c) for c in protocol.secondaries]
    for section, claim in claims:
        where = f"{source}: {section} {claim.name!r}"
        for key, metric, params in [
            ("metric", claim.metric, claim_params(claim)),
            *(
                [("gate.metric", claim.gate.metric, claim_params(claim.gate))]
                if getattr(claim, "gate", None) is not None
                else []
            ),
        ]:
            _check_metric(where, key, metric, params)
        gate = getattr(claim, "gate", None)
        if gate is not None and gate.metric not in RUN_METRICS:
            raise ConfigError(
                f"{where}: gate.metric {gate.metric!r} must be one number per run, one of: "
                f"{', '.join(RUN_METRICS)}. Nothing was written."
            )
        _, tests = accepted(claim.metric)
        test = getattr(claim, "test", None)
        if test is not None and test not in tests:
            raise ConfigError(
                f"{where}: test {test!r} does not apply to {claim.metric}; it takes: "
                f"{', '.join(tests)}. Nothing was written."
            )
        if claim.direction not in DIRECTIONS:
            raise ConfigError(
                f"{where}: direction {claim.direction!r} must be one of "
                f"{', '.join(DIRECTIONS)}. Nothing was written."
            )


def _check_metric(where: str, key: str, metric: str, params: dict[str, Any]) -> None:
    """`metric` (a claim's or its gate's, named by `key`) is one the report computes, with
    params it takes, each with an allowed value."""
    if metric not in metric_names():
        raise ConfigError(
            f"{where}: {key} {metric!r} is not a metric the report computes; the metrics "
            f"are: {', '.join(metric_names())}. Nothing was written."
        )
    allowed, _ = accepted(metric)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: params {', '.join(unknown)} are not parameters of {metric}; it "
            f"takes: {', '.join(sorted(allowed)) or 'none'}. Nothing was written."
        )
    for name, what in REQUIRED.get(metric, {}).items():
        if name not in params:
            raise ConfigError(
                f"{where}: {metric} needs {key.replace('metric', 'params')}.{name} ({what}). "
                "Nothing was written."
            )
    for name, value in params.items():
        problem = param_problem(name, value)
        if problem is not None:
            raise ConfigError(
                f"{where}: {key.replace('metric', 'params')}.{name}={value!r} is not "
                f"allowed: it is {problem}. Nothing was written."
            )
