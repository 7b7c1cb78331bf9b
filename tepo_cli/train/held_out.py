"""The trainer's held-out evaluation: greedy accuracy through the rollout back-end and the run's
sampler (answers, or one episode per problem), every rank a shard, logged as an evaluation
record."""

from __future__ import annotations

from typing import Any

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.records import Problem
from tepo_cli.envs.sampler import Sampler
from tepo_cli.rewards import Reward
from tepo_cli.rollout import RolloutBackend, Sampling, stop_rule
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.metrics import RunLog
from tepo_cli.train.env_errors import report_env_errors


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


def held_out_accuracy(
    cfg: TrainConfig,
    sampler: Sampler,
    backend: RolloutBackend,
    tokenizer: Any,
    task: Any,
    reward: Reward,
    topo: Topology,
    log: RunLog | None,
    step: int,
    when: str,
) -> float:
    """Greedy accuracy on the held-out split (`sampler.held_out_problems`); ranks evaluate
    disjoint shards and add up. With a multi-turn environment each problem is one greedy
    episode, graded by its environment, and no answers are logged."""
    problems, padding = rank_shard(sampler.held_out_problems(task), topo.rank, topo.world_size)
    sampling = Sampling(
        n=1,
        greedy=True,
        max_new_tokens=cfg.rollout.max_new_tokens,
        batch_size=cfg.rollout.batch_size,
        stop=stop_rule(cfg.rollout),  # answers end where training's do, and are graded so
    )
    held_out = sampler.held_out(backend, tokenizer, problems, padding, reward, sampling)
    report_env_errors(held_out.errors, f"eval {when} (step {step})", log)
    solved, samples, records = held_out.solved, held_out.problems, held_out.answers
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
        "seconds": held_out.seconds,
    }
    if totals[4] > 0:  # what the answers look like: did the model learn to stop, or to reckon?
        record.update(
            length_mean=float(totals[2] / totals[4]), truncated_frac=float(totals[3] / totals[4])
        )
    if log is not None:
        log.evaluation(record, answers)
    return record["accuracy"]


def in_problem_order(shards: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rank r evaluated problems r, r + world, ... (`rank_shard`): interleave the shards back."""
    merged: list[dict[str, Any]] = []
    for index in range(max((len(shard) for shard in shards), default=0)):
        merged.extend(shard[index] for shard in shards if index < len(shard))
    return merged
