"""Score a model on a list of problems: generate, grade, report accuracy and per-sample records."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.data.arith import Problem
from tepo_cli.data.prompts import render_prompt
from tepo_cli.rewards import RewardFn
from tepo_cli.rollout.hf import Sampling, generate


@dataclass
class EvalResult:
    accuracy: float
    problems: int
    samples: int
    seconds: float
    records: list[dict[str, Any]] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "problems": self.problems,
            "samples": self.samples,
            "seconds": self.seconds,
            "samples_per_second": self.samples / self.seconds if self.seconds else None,
        }


def evaluate(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    benchmark: BenchmarkConfig,
    reward_fn: RewardFn,
    sampling: Sampling,
) -> EvalResult:
    """Accuracy = the share of samples graded correct (pass@1 averaged over `sampling.n`)."""
    start = time.perf_counter()
    prompts = [render_prompt(tokenizer, benchmark, p.question) for p in problems]
    rollout = generate(model, tokenizer, prompts, sampling)
    records = []
    for index, completion in enumerate(rollout.texts):
        problem = problems[index // sampling.n]
        result = reward_fn(completion, problem)
        records.append(
            {
                "id": problem.id,
                "prompt": prompts[index // sampling.n],
                "completion": completion,
                "answer": problem.answer,
                "extracted": result.extracted,
                "passed": result.correct,
            }
        )
    correct = sum(r["passed"] for r in records)
    return EvalResult(
        accuracy=correct / max(1, len(records)),
        problems=len(problems),
        samples=len(records),
        seconds=time.perf_counter() - start,
        records=records,
    )
