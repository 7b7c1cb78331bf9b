"""The trainer's held-out evaluation: greedy accuracy through the rollout back-end, every rank a
shard, logged as an evaluation record."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.records import Problem
from tepo_cli.eval.accuracy import evaluate, sample_and_grade
from tepo_cli.rewards import Reward
from tepo_cli.rollout import RolloutBackend, Sampling
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.metrics import RunLog
from tepo_cli.train.env_errors import report_env_errors
from tepo_cli.train.multi_turn import sample_episodes


def rank_shard(
    problems: list[Problem], rank: int, world_size: int
) -> tuple[list[Problem], list[Problem]]:
    """This rank's share of the problems, and the padding that brings every rank's share to the
    same size. Under ZeRO-3 every generate() is a collective (each forward gathers the layers'
    parameters from all ranks), so every rank must make as many of them as the others: 3
    problems over 2 ranks are 2 + 1, and the second rank generates one padding problem too, whose
    samples are not counted."""
    shard = problems[rank::world_size]
    size = -(-len(problems) // world_size)
    return shard, [problems[0]] * (size - len(shard)) if problems else []


def held_out_problems(cfg: TrainConfig, task: Any) -> list[Problem]:
    """The held-out split's problems; with a multi-turn environment the first `env.eval_size`
    of them (all when null): each is a whole episode, several generations long."""
    limit = cfg.env.eval_size if cfg.env.multi_turn else None
    return task.eval_problems() if limit is None else task.eval_problems(limit)


def _first_records(
    batches: Iterator[list[dict[str, Any]]], count: int
) -> Iterator[list[dict[str, Any]]]:
    """The records of the first `count` problems (one sample each): the padding's dropped."""
    for batch in batches:
        kept = batch[:count]
        count -= len(kept)
        if kept:
            yield kept


def held_out_accuracy(
    cfg: TrainConfig,
    backend: RolloutBackend,
    tokenizer: Any,
    task: Any,
    reward: Reward,
    topo: Topology,
    log: RunLog | None,
    step: int,
    when: str,
) -> float:
    """Greedy accuracy on the held-out split; ranks evaluate disjoint shards and add up. With a
    multi-turn environment each problem is one greedy episode, graded by its environment."""
    problems, padding = rank_shard(held_out_problems(cfg, task), topo.rank, topo.world_size)
    sampling = Sampling(
        n=1,
        greedy=True,
        max_new_tokens=cfg.rollout.max_new_tokens,
        batch_size=cfg.rollout.batch_size,
    )
    records: list[dict[str, Any]] = []  # graded answers; none from a multi-turn environment
    if cfg.env.multi_turn:  # greedy episodes with the run's environment
        began = time.perf_counter()
        correct, errors = _episodes_correct(
            cfg, backend, tokenizer, problems + padding, reward, sampling, len(problems)
        )
        solved, samples = float(sum(correct[: len(problems)])), len(problems)
        report_env_errors(errors, f"eval {when} (step {step})", log)
        seconds = time.perf_counter() - began
    else:
        batches = sample_and_grade(
            backend, tokenizer, problems + padding, cfg.benchmark, reward, sampling
        )
        result = evaluate(_first_records(batches, len(problems)), len(problems))
        solved, samples, seconds = result.accuracy * result.samples, result.samples, result.seconds
        records = [_answer_record(record) for record in result.records]
    length = sum(record["length"] for record in records)
    truncated = sum(record["truncated"] for record in records)
    totals = torch.tensor(
        [solved, samples, length, truncated, len(records)], dtype=torch.float64, device="cpu"
    )
    totals = collective.all_sum(totals).cpu()
    answers = in_problem_order(collective.from_every_rank(records))
    record: dict[str, Any] = {
        "step": step,
        "when": when,
        "accuracy": float(totals[0] / totals[1]),
        "problems": int(totals[1]),
        "seconds": seconds,
    }
    if totals[4] > 0:  # what the answers look like: did the model learn to stop, or to reckon?
        record.update(
            length_mean=float(totals[2] / totals[4]), truncated_frac=float(totals[3] / totals[4])
        )
    if log is not None:
        log.evaluation(record, answers)
    return record["accuracy"]


def _answer_record(record: dict[str, Any]) -> dict[str, Any]:
    """A graded answer as eval_samples.jsonl keeps it: the prompt (the same at every evaluation,
    rebuilt from the problem's question) is left out."""
    return {key: value for key, value in record.items() if key not in ("prompt", "sample")}


def in_problem_order(shards: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rank r evaluated problems r, r + world, ... (`rank_shard`): interleave the shards back."""
    merged: list[dict[str, Any]] = []
    for index in range(max((len(shard) for shard in shards), default=0)):
        merged.extend(shard[index] for shard in shards if index < len(shard))
    return merged


def _episodes_correct(
    cfg: TrainConfig,
    backend: RolloutBackend,
    tokenizer: Any,
    problems: list[Problem],
    reward: Reward,
    sampling: Sampling,
    real: int,
) -> tuple[list[bool], list[str]]:
    """One greedy episode per problem: whether its environment graded it correct; and the
    environment errors of this rank's real problems (the padding's are not counted)."""
    one_each = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"n": 1})})
    episodes = sample_episodes(one_each, backend, tokenizer, problems, reward, sampling)
    errors = [r["error"] for r in episodes.records[:real] if r["error"] is not None]
    return [result.correct for result in episodes.results], errors
