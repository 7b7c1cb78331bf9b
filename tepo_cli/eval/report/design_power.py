"""`tepo protocol power PROTOCOL.yaml --from DIR`: what a protocol's seeds can detect, before its
runs, at the spread of runs already made (a pilot sweep, an earlier experiment's arms).

protocol.md states "the power the seeds give" before the first run; this computes it with the
formulas the report uses after the runs (inference.py), so the design and the analysis agree:
for each claim, the smallest true difference found with 80 % power at the claim's level (α over
the primaries under a correction: the strictest step, as the report's "detectable"), and, for an
effect the user names, the power at it and the seeds per arm that reach 80 %.

The spread is the metric's standard deviation pooled within the prior runs' groups (runs grouped
by their overrides, seeds being the repeats, as `tepo report` groups them; only finished runs),
so a prior sweep of other objectives still measures the seed-to-seed spread and not the
differences between its arms. A Welch claim's standard error at n runs an arm is s √(2 / n) with
2n − 2 degrees of freedom. A paired claim's is s_d / √n with n − 1, s_d the standard deviation of
the differences between runs of one seed in two prior groups (around their mean difference,
pooled over every two groups that share 2 or more seeds): what pairing removes is measured,
not assumed. Where no two prior groups share seeds it is s √(2 / n) [our reading: runs of one
seed taken as uncorrelated across arms, ρ = 0, which a pairing that correlates them beats].
Log-rank and McNemar claims have no run-level spread to scale: listed, not computed.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.grouping import group_runs
from tepo_cli.eval.report.inference import detectable_at, power_at
from tepo_cli.eval.report.protocol_check import check, claim_params
from tepo_cli.eval.report.protocol_metrics import RUN_METRICS
from tepo_cli.eval.report.protocol_report import power_family
from tepo_cli.eval.report.render import markdown_table
from tepo_cli.eval.report.runs import Run, find_runs, load_run
from tepo_cli.eval.report.terminal import Spec, print_fitted
from tepo_cli.protocol.arguments import parse_power
from tepo_cli.protocol.spec import load_protocol

POWER = 0.8
MOST_SEEDS = 1000  # beyond this "seeds for 80 %" says none: the effect is out of reach
NONE = "—"


@dataclass(frozen=True)
class Spread:
    """A metric's seed-to-seed standard deviation, pooled within the prior groups, or (of="seed
    differences") that of the differences between two groups' runs of one seed."""

    sd: float | None  # None: no group had two finished runs with the metric (no two seeds shared)
    runs: int  # prior finished runs with a value
    groups: int  # groups of 2 or more such runs (or pairs of groups sharing 2 or more seeds)
    of: str = "runs"  # runs | seed differences


@dataclass(frozen=True)
class ClaimPower:
    name: str
    kind: str  # primary / secondary
    metric: str
    test: str
    direction: str
    alpha: float  # the claim's level: α / the primaries under a correction, α for a secondary
    n: int  # runs per arm (the protocol's seeds)
    spread: Spread | None  # None: a test without a run-level spread (log-rank, McNemar)
    detectable: float | None
    effect: float | None = None  # the difference the user asked about (treatment − control)
    power: float | None = None  # at `effect`
    seeds: int | None = None  # per arm for 80 % at `effect`; None: over MOST_SEEDS or no spread


def pooled_sd(groups: list[list[float]]) -> Spread:
    """√(Σ within-group squared deviations / Σ (n_g − 1)) over the groups of 2 or more values."""
    used = [values for values in groups if len(values) >= 2]
    df = sum(len(values) - 1 for values in used)
    runs = sum(len(values) for values in groups)
    if df == 0:
        return Spread(None, runs, 0)
    squares = sum(statistics.variance(values) * (len(values) - 1) for values in used)
    return Spread(math.sqrt(squares / df), runs, len(used))


def paired_sd(groups: list[dict[int, float]]) -> Spread:
    """The spread of seed differences: for every two groups, the differences of their runs at
    the seeds both have (2 or more), pooled around each pair's mean difference as pooled_sd
    pools groups. None where no two groups share two seeds."""
    differences = [
        [first[seed] - second[seed] for seed in sorted(first.keys() & second.keys())]
        for i, first in enumerate(groups)
        for second in groups[i + 1 :]
    ]
    pooled = pooled_sd(differences)
    runs = sum(len(values) for values in groups)
    return Spread(pooled.sd, runs, pooled.groups, "seed differences")


def design_se(test: str, spread: Spread, n: int) -> tuple[float, int]:
    """(standard error, degrees of freedom) of the claim's t statistic at n runs an arm."""
    sd = spread.sd or 0.0
    if test != "paired":
        return sd * math.sqrt(2.0 / n), 2 * n - 2
    if spread.of == "seed differences":
        return sd / math.sqrt(n), n - 1
    return sd * math.sqrt(2.0 / n), n - 1  # ρ = 0


def seeds_for(effect: float, spread: Spread, test: str, alpha: float, direction: str) -> int | None:
    """The fewest runs per arm (2 or more) with 80 % power at `effect`; None beyond MOST_SEEDS."""
    for n in range(2, MOST_SEEDS + 1):
        se, df = design_se(test, spread, n)
        if power_at(effect, se, df, alpha, direction) >= POWER:
            return n
    return None


def claim_power(
    claim: Any, kind: str, alpha: float, n: int, runs: list[Run], effect: float | None
) -> ClaimPower:
    """One claim's design power at the spread of `runs` (finished prior runs)."""
    test, direction = claim.test, claim.direction
    base = ClaimPower(claim.name, kind, claim.metric, test, direction, alpha, n, None, None, effect)
    if claim.metric not in RUN_METRICS or test not in ("welch", "paired"):
        return base
    of_run, params = RUN_METRICS[claim.metric].of_run, claim_params(claim)
    groups = [
        [(int(run.seed), v) for run in group.runs if _finite(v := of_run(run, params))]
        for group in group_runs(runs)[1]
    ]
    spread = pooled_sd([[value for _, value in group] for group in groups])
    if test == "paired" and (differences := paired_sd([dict(group) for group in groups])).sd:
        spread = differences
    if not spread.sd:  # no group of two, or every run the same: nothing to scale
        return replace(base, spread=spread)
    se, df = design_se(test, spread, n)
    detectable = detectable_at(se, df, alpha, direction)
    if effect is None:
        return replace(base, spread=spread, detectable=detectable)
    power = power_at(effect, se, df, alpha, direction)
    seeds = seeds_for(effect, spread, test, alpha, direction)
    return replace(base, spread=spread, detectable=detectable, power=power, seeds=seeds)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def design_power(protocol: Any, runs: list[Run], effects: dict[str, float]) -> list[ClaimPower]:
    """Every claim of the protocol, primaries first, at the spread of the finished `runs`."""
    n = len(protocol.seeds)
    strict = protocol.alpha / power_family(protocol.correction, len(protocol.primaries))
    finished = [run for run in runs if run.finished]
    claims = [("primary", strict, c) for c in protocol.primaries]
    claims += [("secondary", protocol.alpha, c) for c in protocol.secondaries]
    return [
        claim_power(claim, kind, alpha, n, finished, effects.get(claim.name))
        for kind, alpha, claim in claims
    ]


def parse_effects(texts: list[str], protocol: Any) -> dict[str, float]:
    """`--effect CLAIM=VALUE`s as {claim: value}; ConfigError naming the first bad one."""
    claims = {c.name: c for c in [*protocol.primaries, *protocol.secondaries]}
    effects: dict[str, float] = {}
    for text in texts:
        name, _, value = text.partition("=")
        claim = claims.get(name.strip())
        try:
            effect = float(value)
        except ValueError:
            effect = math.nan
        if claim is None or not math.isfinite(effect):
            raise ConfigError(
                f"--effect {text!r}: give CLAIM=VALUE, a claim of the protocol "
                f"({', '.join(claims)}) and the difference treatment − control on its metric's "
                "scale, e.g. --effect convergence=0.05. Nothing was computed."
            )
        wrong = {"greater": effect <= 0, "less": effect >= 0, "two-sided": effect == 0}
        if wrong[claim.direction]:
            raise ConfigError(
                f"--effect {text!r}: claim {claim.name!r} is registered as "
                f"{claim.direction!r} (treatment − control {_SIGN[claim.direction]}), so an "
                "effect it can find has that sign. Nothing was computed."
            )
        effects[claim.name] = effect
    return effects


_SIGN = {"greater": "above 0", "less": "below 0", "two-sided": "not 0"}


def prior_runs(directories: list[Path]) -> list[Run]:
    """The runs under each directory (read as `tepo report` reads a sweep)."""
    runs: list[Run] = []
    for directory in directories:
        if not directory.is_dir():
            raise ConfigError(
                f"--from {directory}: not a directory. Give a run or multirun directory of "
                "runs made earlier (a pilot sweep, another experiment's published runs) whose "
                "seed-to-seed spread the protocol's runs should share. Nothing was computed."
            )
        runs += [load_run(path, directory) for path in find_runs(directory)]
    if not any(run.finished for run in runs):
        where = ", ".join(str(d) for d in directories)
        raise ConfigError(
            f"--from {where}: no finished run there, so no spread to design from. Nothing was "
            "computed."
        )
    return runs


def _number(value: float | None, digits: int = 3) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def _spread(row: ClaimPower) -> str:
    if row.spread is None:
        return f"not computed ({row.test})"
    if row.spread.sd is None:
        return f"none ({row.spread.runs} runs, no group of 2)"
    if row.spread.of == "seed differences":
        pairs = row.spread.groups
        return f"{row.spread.sd:.3f} (seed differences, {pairs} pair{'s' * (pairs != 1)} of groups)"
    return f"{row.spread.sd:.3f} ({row.spread.runs} runs, {row.spread.groups} groups)"


def _seeds(row: ClaimPower) -> str:
    if row.effect is None or not (row.spread and row.spread.sd):
        return NONE
    return f"> {MOST_SEEDS}" if row.seeds is None else str(row.seeds)


Columns = list[tuple[str, Callable[[ClaimPower], str]]]


def columns(with_effects: bool) -> Columns:
    shown: Columns = [
        ("claim", lambda r: r.name),
        ("kind", lambda r: r.kind),
        ("metric", lambda r: r.metric),
        ("test", lambda r: f"{r.test}, {r.direction}"),
        ("runs per arm", lambda r: str(r.n)),
        ("level", lambda r: f"{r.alpha:.4g}"),
        ("prior spread (SD)", _spread),
        ("detectable at 80 %", lambda r: _number(r.detectable)),
    ]
    if with_effects:
        shown += [
            ("effect", lambda r: NONE if r.effect is None else f"{r.effect:+.3f}"),
            ("power at effect", lambda r: _number(r.power, 2)),
            ("runs per arm for 80 %", _seeds),
        ]
    return shown


LEGEND = (
    "level: the one-sided α of a claim (α / 2 a side for a two-sided one) at which it is "
    "tested: α over the primaries under a correction (its strictest step), α for a secondary "
    "(uncorrected). prior spread: the metric's standard deviation between seeds, pooled within "
    "the groups of finished runs under --from. detectable at 80 %: the smallest true difference "
    "the protocol's runs would find four times in five at that spread (the report's "
    "'detectable'); a smaller one may well be missed. A paired claim is sized at the spread of "
    "the differences between prior groups' runs of one seed where they share seeds, else as if "
    "the arms' runs of one seed were uncorrelated. The spread is itself an estimate from the runs it "
    "names: with few, these figures are rough."
)


def main(argv: list[str]) -> int:
    args = parse_power(argv)
    try:
        protocol = load_protocol(args.protocol)
        check(protocol, args.protocol)
        effects = parse_effects(args.effect, protocol)
        rows = design_power(protocol, prior_runs(args.prior), effects)
    except ConfigError as error:
        print(f"tepo protocol power: {error}", file=sys.stderr)
        return 2
    shown = columns(bool(effects))
    title = f"Protocol {protocol.name}: what {len(protocol.seeds)} runs per arm can detect"
    if args.markdown:
        print(f"{title}\n\n{markdown_table(shown, rows)}\n\n{LEGEND}")
        return 0
    console = Console()
    if not console.is_terminal:
        console.width = 160
    print_fitted(console, [Spec(title, shown, rows, LEGEND)], [])
    return 0
