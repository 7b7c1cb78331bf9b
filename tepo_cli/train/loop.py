"""The training recipe: set up, evaluate, then steps of collect -> update -> log, evaluate, save."""

from __future__ import annotations

import contextlib
import copy
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tepo_cli.config.schema import TrainConfig
from tepo_cli.data.arith import Problem
from tepo_cli.data.tasks import DatasetTask, build_task
from tepo_cli.eval.accuracy import evaluate
from tepo_cli.models.loading import load_model, load_tokenizer
from tepo_cli.rewards import build_reward
from tepo_cli.rollout.hf import Sampling
from tepo_cli.train import experience as exp
from tepo_cli.train.distributed import Topology
from tepo_cli.train.engine import build_engine
from tepo_cli.train.metrics import RunLog
from tepo_cli.train.policy import Policy
from tepo_cli.train.update import accumulation_steps, update


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(cfg: TrainConfig, run_dir: Path, topo: Topology) -> dict[str, Any]:
    seed_everything(cfg.seed + topo.rank)
    task = build_task(cfg.benchmark)
    if isinstance(task, DatasetTask):
        task.check_training()
    reward = build_reward(cfg.reward, cfg.benchmark)
    tokenizer = load_tokenizer(cfg.model)
    model = Policy(load_model(cfg.model, tokenizer, topo.device), cfg.kernel)
    reference = _frozen_copy(model) if cfg.algo.needs_ref else None
    engine = build_engine(model, cfg, accumulation_steps(cfg), topo.world_size)
    policy: Policy = engine.module
    log = (
        RunLog(run_dir, cfg.trainer.max_steps, cfg.trainer.progress and topo.is_main)
        if topo.is_main
        else None
    )
    stream = task.train_stream(cfg.seed)
    # DAPO refills come from a per-rank stream, so ranks never wait on each other's draws.
    refill = (
        task.train_stream(cfg.seed * 1000 + 1 + topo.rank) if cfg.algo.dynamic_sampling else None
    )
    per_rank = cfg.trainer.prompts_per_step // topo.world_size
    generator = torch.Generator().manual_seed(cfg.seed)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": 0}
    with log or contextlib.nullcontext():
        if cfg.trainer.eval_before:
            summary["eval_before"] = _evaluate(
                cfg, policy, tokenizer, task, reward, topo, log, 0, "before"
            )
        step_seconds = []
        for step in range(1, cfg.trainer.max_steps + 1):
            start = time.perf_counter()
            problems = [next(stream) for _ in range(cfg.trainer.prompts_per_step)]
            local = problems[topo.rank * per_rank : (topo.rank + 1) * per_rank]
            experience = exp.collect(cfg, policy, reference, tokenizer, local, reward, refill)
            update_start = time.perf_counter()
            metrics = update(cfg, engine, experience, generator)
            metrics["update_seconds"] = time.perf_counter() - update_start
            record = _step_record(
                cfg, step, engine, experience, metrics, time.perf_counter() - start
            )
            step_seconds.append(record["step_seconds"])
            if log is not None:
                log.step(record, _samples(cfg, step, experience))
            summary.update(steps=step, final_reward_mean=record["reward_mean"])
            if (
                cfg.trainer.eval_every
                and step % cfg.trainer.eval_every == 0
                and step < cfg.trainer.max_steps
            ):
                _evaluate(cfg, policy, tokenizer, task, reward, topo, log, step, "during")
        if cfg.trainer.eval_after:
            summary["eval_after"] = _evaluate(
                cfg, policy, tokenizer, task, reward, topo, log, cfg.trainer.max_steps, "after"
            )
        if step_seconds:
            summary["median_step_seconds"] = float(np.median(step_seconds))
        if topo.world_size > 1:
            summary["rank_param_checksums"] = _rank_checksums(engine, topo)
        if cfg.trainer.save_final:
            _save_final(engine, tokenizer, run_dir / "final", topo)
            summary["final_model"] = str(run_dir / "final")
        if log is not None:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            _report(log, summary)
    return summary


def _frozen_copy(model: Policy) -> Policy:
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference


def _evaluate(
    cfg, policy, tokenizer, task, reward, topo: Topology, log, step: int, when: str
) -> float:
    """Greedy accuracy on the held-out split; ranks evaluate disjoint shards and add up."""
    problems: list[Problem] = task.eval_problems()[topo.rank :: topo.world_size]
    sampling = Sampling(
        n=1,
        greedy=True,
        max_new_tokens=cfg.rollout.max_new_tokens,
        batch_size=cfg.rollout.batch_size,
    )
    result = evaluate(policy.lm, tokenizer, problems, cfg.benchmark, reward, sampling)
    totals = torch.tensor([result.accuracy * result.samples, result.samples], dtype=torch.float64)
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


def _step_record(
    cfg: TrainConfig,
    step: int,
    engine: Any,
    experience: exp.Experience,
    update_metrics: dict[str, float],
    seconds: float,
) -> dict[str, Any]:
    rewards, lengths = experience.rewards, experience.rollout.lengths.float()
    groups = rewards.view(-1, cfg.rollout.n)
    stats = torch.stack(
        [
            rewards.sum(),
            (rewards**2).sum(),
            experience.correct.float().sum(),
            lengths.sum(),
            experience.rollout.truncated.float().sum(),
            (groups.max(dim=1).values == groups.min(dim=1).values).float().sum(),
            torch.tensor(float(rewards.numel())),
            torch.tensor(float(groups.shape[0])),
            torch.tensor(float(experience.sampled_groups)),
            torch.tensor(experience.overlong_mean * rewards.numel()),
        ]
    ).double()
    if dist.is_initialized() and dist.get_world_size() > 1:
        stats = stats.to(engine.device)
        dist.all_reduce(stats)
    (
        total,
        total_sq,
        correct,
        length,
        truncated,
        flat_groups,
        count,
        group_count,
        sampled,
        overlong,
    ) = stats.tolist()
    mean = total / count
    record: dict[str, Any] = {
        "step": step,
        "reward_mean": mean,
        "reward_std": max(0.0, total_sq / count - mean**2) ** 0.5,
        "accuracy": correct / count,
        "response_length": length / count,
        "truncated_frac": truncated / count,
        "zero_std_group_frac": flat_groups / group_count,
        "dropped_group_frac": 1.0 - group_count / sampled,
        "refill_rounds": experience.refill_rounds,
        "overlong_penalty_mean": overlong / count,
        "lr": float(engine.get_lr()[0]),
        "step_seconds": seconds,
        "tokens_per_second": length / seconds,
    }
    record.update({f"{k}_seconds": v for k, v in experience.seconds.items()})
    record.update(update_metrics)
    return record


def _samples(cfg: TrainConfig, step: int, experience: exp.Experience) -> list[dict[str, Any]]:
    samples = []
    for index in range(min(cfg.trainer.samples_per_step, len(experience.rollout.texts))):
        problem = experience.problems[index // cfg.rollout.n]
        samples.append(
            {
                "step": step,
                "question": problem.question,
                "answer": problem.answer,
                "completion": experience.rollout.texts[index],
                "reward": float(experience.rewards[index]),
                "advantage": float(experience.advantages[index]),
            }
        )
    return samples


def _rank_checksums(engine: Any, topo: Topology) -> list[float]:
    """Every rank's parameter checksum: data-parallel ranks must hold identical weights."""
    if engine.zero_optimization_stage() == 3:
        return []  # parameters are partitioned; there is nothing identical to compare
    with torch.no_grad():
        local = sum(p.double().sum() + p.double().pow(2).sum() for p in engine.module.parameters())
    gathered = [
        torch.zeros(1, dtype=torch.float64, device=topo.device) for _ in range(topo.world_size)
    ]
    dist.all_gather(gathered, local.reshape(1).to(topo.device))
    return [float(x) for x in gathered]


def _save_final(engine: Any, tokenizer: Any, target: Path, topo: Topology) -> None:
    """save_pretrained into a staging directory renamed into place (never a half-written model)."""
    policy: Policy = engine.module
    state_dict = None
    if engine.zero_optimization_stage() == 3:
        # Collective: every rank calls it; rank 0 gets the full weights.
        state_dict = policy.hf_state_dict(engine._zero3_consolidated_16bit_state_dict())
    if not topo.is_main:
        return
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    policy.lm.save_pretrained(staging, state_dict=state_dict)
    tokenizer.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)


def _report(log: RunLog, summary: dict[str, Any]) -> None:
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if before is not None and after is not None:
        log.info(
            f"held-out accuracy: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)"
        )
    if "final_model" in summary:
        log.info(
            f"final model: {summary['final_model']} "
            f"(score it: tepo eval model.path={summary['final_model']})"
        )
