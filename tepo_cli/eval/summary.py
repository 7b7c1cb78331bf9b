"""Headline numbers of an evaluation: pass@1, unbiased pass@k, maj@k (answer-graded benchmarks)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem
from tepo_cli.eval.passk import maj_at_k, mean_pass_at_k
from tepo_cli.rewards import get_grader


def answer_matcher(
    grader: str, cfg: RewardConfig | None = None
) -> Callable[[str, str], bool] | None:
    """How two extracted answers are compared under the reward settings `cfg` (the grader's
    defaults when None), for majority voting; None: no answer to vote on."""
    return get_grader(grader).answer_matcher(cfg or RewardConfig(name=grader))


def summarize(
    records: Sequence[dict[str, Any]],
    problems: Sequence[Problem],
    n: int,
    pass_k: Sequence[int],
    grader: str,
    reward_cfg: RewardConfig | None = None,
) -> dict[str, Any]:
    by_problem: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_problem[record["id"]].append(record)
    ordered = [sorted(by_problem[p.id], key=lambda r: r["sample"]) for p in problems]
    counts = [(len(samples), sum(r["passed"] for r in samples)) for samples in ordered]
    summary: dict[str, Any] = {
        "problems": len(problems),
        "samples": len(records),
        "accuracy": sum(c for _, c in counts) / max(1, len(records)),
    }
    for k in sorted(set(pass_k)):
        if k <= n:
            summary[f"pass@{k}"] = mean_pass_at_k(counts, k)
    matcher = answer_matcher(grader, reward_cfg)
    if matcher is not None and n > 1:
        answers = [[r["extracted"] for r in samples] for samples in ordered]
        summary[f"maj@{n}"] = maj_at_k(
            answers, n, lambda i, answer: matcher(answer, problems[i].answer), equivalent=matcher
        )
    lengths = [r["length"] for r in records if r.get("length") is not None]
    summary["mean_length"] = sum(lengths) / len(lengths) if lengths else None
    # The median too: a few answers running to max_new_tokens pull the mean far up
    summary["median_length"] = statistics.median(lengths) if lengths else None
    summary["truncated_frac"] = sum(r["truncated"] for r in records) / max(1, len(records))
    return summary
