"""Generate and grade: per-sample records for a list of problems (n samples each)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.prompt_templates import render_prompt
from tepo_cli.rewards import Reward
from tepo_cli.rollout import RolloutBackend, Sampling


@dataclass
class EvalResult:
    accuracy: float
    problems: int
    samples: int
    seconds: float
    records: list[dict[str, Any]] = field(repr=False)


def sample_and_grade(
    backend: RolloutBackend,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    benchmark: BenchmarkConfig,
    reward: Reward,
    sampling: Sampling,
) -> Iterator[list[dict[str, Any]]]:
    """Yield the records of each generation batch (so callers can write them as they come)."""
    per_batch = max(1, sampling.batch_size // sampling.n)
    for start in range(0, len(problems), per_batch):
        chunk = problems[start : start + per_batch]
        prompts = [render_prompt(tokenizer, benchmark, p.question) for p in chunk]
        rollout = backend.generate(prompts, _batch_seeded(sampling, start))
        owners = [p for p in chunk for _ in range(sampling.n)]
        results = reward.score_many(rollout.texts, owners)
        yield [
            {
                "id": problem.id,
                "sample": index % sampling.n,
                "prompt": prompts[index // sampling.n],
                "completion": text,
                "answer": problem.answer,
                "extracted": result.extracted,
                "reward": result.reward,
                "passed": result.correct,
                "length": int(length),
                "truncated": bool(truncated),
            }
            for index, (problem, text, result, length, truncated) in enumerate(
                zip(owners, rollout.texts, results, rollout.lengths, rollout.truncated, strict=True)
            )
        ]


def evaluate(batches: Iterable[list[dict[str, Any]]], problems: int) -> EvalResult:
    """Consume `sample_and_grade`'s batches (it generates lazily, so this times the generation).

    Accuracy = the share of samples graded correct (pass@1 averaged over `sampling.n`)."""
    start = time.perf_counter()
    records = [record for batch in batches for record in batch]
    correct = sum(r["passed"] for r in records)
    return EvalResult(
        accuracy=correct / max(1, len(records)),
        problems=problems,
        samples=len(records),
        seconds=time.perf_counter() - start,
        records=records,
    )


def _batch_seeded(sampling: Sampling, first_problem: int) -> Sampling:
    """Seeds continue across batches: problem i of the list draws from seed + i * n + j."""
    if sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + first_problem * sampling.n)
