"""The trainer's held-out evaluation: greedy accuracy through the rollout back-end, every rank a
shard, logged as an evaluation record."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.records import Problem
from tepo_cli.eval.accuracy import evaluate, sample_and_grade
from tepo_cli.rewards import Reward
from tepo_cli.rollout import RolloutBackend, Sampling
from tepo_cli.train.distributed import Topology
from tepo_cli.train.metrics import RunLog


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
    """Greedy accuracy on the held-out split; ranks evaluate disjoint shards and add up."""
    problems: list[Problem] = task.eval_problems()[topo.rank :: topo.world_size]
    sampling = Sampling(
        n=1,
        greedy=True,
        max_new_tokens=cfg.rollout.max_new_tokens,
        batch_size=cfg.rollout.batch_size,
    )
    batches = sample_and_grade(backend, tokenizer, problems, cfg.benchmark, reward, sampling)
    result = evaluate(batches, len(problems))
    totals = torch.tensor(
        [result.accuracy * result.samples, result.samples], dtype=torch.float64, device="cpu"
    )
    if dist.is_initialized() and topo.world_size > 1:
        totals = totals.to(topo.device)
        dist.all_reduce(totals)
        totals = totals.cpu()
    accuracy = float(totals[0] / totals[1])
    if log is not None:
        log.evaluation(
            {
                "step": step,
                "when": when,
                "accuracy": accuracy,
                "problems": int(totals[1]),
                "seconds": result.seconds,
            }
        )
    return accuracy
