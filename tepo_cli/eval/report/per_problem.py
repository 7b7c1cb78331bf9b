"""Per-problem paired analysis of held-out outcomes (`eval_samples.jsonl`).

Both arms answer the same held-out problems, so each problem is its own control: problem j's
pass rate in an arm, p_arm,j, is the share of its graded answers that passed over that arm's runs
(seeds) and the chosen evaluations; d_j = p_treatment,j − p_control,j. The estimate is the mean of
d_j and its standard error is the problem-clustered one, sd(d) / √J: a paired t test over the J
problems (J − 1 df). With one run per arm at one evaluation d_j ∈ {−1, 0, 1} and this is the
large-sample form of McNemar's test on the discordant problems; with more seeds and evaluations it
uses all of them without treating the answers of one problem as independent.

What it can and cannot say: problems are the random unit, the seeds are held fixed, so it
measures "on problems like these, these runs of the treatment pass more often" — the seed-to-seed
spread that the per-run tests (Welch, paired by seed) account for is not in its SE. It is an
exploratory, sharper look at where the per-run difference comes from, not a substitute for them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tepo_cli.core.run_dir import EVAL_SAMPLES
from tepo_cli.eval.report.inference import Inference, interval_level, t_result
from tepo_cli.eval.report.runs import Run


def read_outcomes(run: Run) -> list[dict[str, Any]]:
    """The run's per-problem held-out records (step, id, passed); [] when it kept none. Read on
    demand: the file also holds every graded answer's text."""
    file: Path = run.path / EVAL_SAMPLES
    if not file.is_file():
        return []
    records = []
    for line in file.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run
        if isinstance(record, dict) and {"step", "id", "passed"} <= record.keys():
            records.append(record)
    return records


def pass_rates(outcomes: Sequence[Sequence[dict[str, Any]]], step: int | None) -> dict[str, float]:
    """Problem id -> share of passed answers over the runs' records at `step` (None: pooled over
    every evaluation after step 0). Within a run a later record of the same (step, problem) wins,
    as in eval.jsonl: a resumed run that evaluated a step again counts it once."""
    passed: dict[str, list[float]] = defaultdict(list)
    for records in outcomes:
        latest = {(int(r["step"]), str(r["id"])): bool(r["passed"]) for r in records}
        for (at, problem), ok in latest.items():
            if (step is None and at > 0) or at == step:
                passed[problem].append(1.0 if ok else 0.0)
    return {problem: statistics.fmean(values) for problem, values in passed.items()}


def per_problem_paired(
    treatment: Sequence[Run],
    control: Sequence[Run],
    alpha: float,
    direction: str,
    step: int | None = None,
) -> Inference:
    """Mean over problems of the treatment's minus the control's pass rate, with the
    problem-clustered paired t test; n per arm is the number of runs that kept outcomes."""
    kept_t = [r for r in (read_outcomes(run) for run in treatment) if r]
    kept_c = [r for r in (read_outcomes(run) for run in control) if r]
    level = interval_level(alpha, direction)
    n = (len(kept_t), len(kept_c))
    if not kept_t or not kept_c:
        note = "no eval_samples.jsonl in an arm"
        return Inference(None, None, None, level, None, *n, "per-problem paired t", note)
    rates_t, rates_c = pass_rates(kept_t, step), pass_rates(kept_c, step)
    problems = sorted(set(rates_t) & set(rates_c))
    if len(problems) < 2:
        note = f"{len(problems)} problem(s) in both arms"
        return Inference(None, None, None, level, None, *n, "per-problem paired t", note)
    differences = [rates_t[j] - rates_c[j] for j in problems]
    estimate = statistics.fmean(differences)
    se = statistics.stdev(differences) / math.sqrt(len(problems))
    result = t_result(estimate, se, len(problems) - 1, alpha, direction, n, "per-problem paired t")
    return Inference(
        result.estimate, result.low, result.high, result.level, result.p, *n, result.test,
        f"{len(problems)} problems" + (f"; {result.note}" if result.note else ""),
    )  # fmt: skip
