"""`env=single`'s sampler: one answer per prompt, graded by the reward — the rollouts tepo has
always made, for training, the held-out evaluation inside `tepo train` and `tepo eval`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import BenchmarkConfig, TrainerConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.prompt_templates import render_prompt
from tepo_cli.envs.samples import HeldOut, Samples
from tepo_cli.rewards import Reward


class Answers:
    """The prompts are the benchmark's; each completion is one answer."""

    def __init__(self, benchmark: BenchmarkConfig) -> None:
        self.benchmark = benchmark

    def sample(
        self,
        backend: Any,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        reward: Reward,
        sampling: Any,
        after_turn: Callable[[], None] | None = None,
    ) -> Samples:
        """The round's answers, ungraded: the trainer grades them as a stage of its own."""
        prompts = [render_prompt(tokenizer, self.benchmark, p.question) for p in problems]
        rollout = backend.generate(prompts, sampling)
        return Samples(rollout, None, [{} for _ in rollout.texts], {}, None)

    def records(
        self,
        backend: Any,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        reward: Reward,
        sampling: Any,
    ) -> Iterator[list[dict[str, Any]]]:
        """Yield the records of each generation batch (so callers can write them as they come)."""
        per_batch = max(1, sampling.batch_size // sampling.n)
        for start in range(0, len(problems), per_batch):
            chunk = problems[start : start + per_batch]
            prompts = [render_prompt(tokenizer, self.benchmark, p.question) for p in chunk]
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
                    zip(
                        owners,
                        rollout.texts,
                        results,
                        rollout.lengths,
                        rollout.truncated,
                        strict=True,
                    )
                )
            ]

    def held_out(
        self,
        backend: Any,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        padding: list[Problem],
        reward: Reward,
        sampling: Any,
    ) -> HeldOut:
        """Greedy answers, graded; the accuracy is the share of samples graded correct, and
        the seconds are the generation's (the batches are made lazily, as they are read)."""
        began = time.perf_counter()
        batches = self.records(backend, tokenizer, problems + padding, reward, sampling)
        records = [r for batch in _first_records(batches, len(problems)) for r in batch]
        seconds = time.perf_counter() - began
        accuracy = sum(r["passed"] for r in records) / max(1, len(records))
        answers = [_answer_record(record) for record in records]
        return HeldOut(accuracy * len(records), len(records), answers, None, seconds)

    def held_out_problems(self, task: Any) -> list[Problem]:
        """The whole held-out split."""
        return task.eval_problems()

    def summary(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Nothing beyond the accuracy and lengths every evaluation has."""
        return {}

    def start_line(self, trainer: TrainerConfig, task: Any) -> None:
        """Nothing: one answer per prompt is what a run does unless told otherwise."""
        return None


def _batch_seeded(sampling: Any, first_problem: int) -> Any:
    """Seeds continue across batches: problem i of the list draws from seed + i * n + j."""
    if sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + first_problem * sampling.n)


def _first_records(
    batches: Iterable[list[dict[str, Any]]], count: int
) -> Iterator[list[dict[str, Any]]]:
    """The records of the first `count` problems (one sample each): the padding's dropped."""
    for batch in batches:
        kept = batch[:count]
        count -= len(kept)
        if kept:
            yield kept


def _answer_record(record: dict[str, Any]) -> dict[str, Any]:
    """A graded answer as eval_samples.jsonl keeps it: the prompt (the same at every evaluation,
    rebuilt from the problem's question) is left out."""
    return {key: value for key, value in record.items() if key not in ("prompt", "sample")}
