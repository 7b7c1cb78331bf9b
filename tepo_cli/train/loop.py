"""The training recipe: set up (or resume), evaluate, then steps of collect -> update -> log ->
checkpoint, evaluate, save."""

from __future__ import annotations

import contextlib
import copy
import json
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tepo_cli.config.errors import ConfigError, RunError, StopRequested
from tepo_cli.config.schema import TrainConfig
from tepo_cli.data.tasks import DatasetTask, build_task
from tepo_cli.kernels.lean_layers import make_lean
from tepo_cli.models.critic import Critic
from tepo_cli.models.loading import load_model, load_tokenizer
from tepo_cli.models.mtp import mtp_support_problem
from tepo_cli.rewards import build_reward
from tepo_cli.rollout import build_backend
from tepo_cli.train import checkpoint, faults
from tepo_cli.train import experience as exp
from tepo_cli.train.atomic_dir import write_directory
from tepo_cli.train.critic_files import CRITIC_DIR, build_critic, save_critic
from tepo_cli.train.distributed import Topology
from tepo_cli.train.engine import build_engine
from tepo_cli.train.guards import skipped_optimizer_steps, torch_optimizer
from tepo_cli.train.held_out import held_out_accuracy
from tepo_cli.train.host_memory import return_freed_buffers
from tepo_cli.train.metrics import RunLog
from tepo_cli.train.mtp_files import MTP_FILE, mtp_unsupported_message, save_mtp_modules
from tepo_cli.train.mtp_warmup import warm_up, warmup_stream_seed
from tepo_cli.train.policy import Policy
from tepo_cli.train.records import step_record, step_samples
from tepo_cli.train.resumable import CountingStream, capture_rng, restore_rng
from tepo_cli.train.resume import log_lengths, truncate_logs
from tepo_cli.train.stop import StopSignals
from tepo_cli.train.update import accumulation_steps, update


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Start:
    """Where the loop begins: step 0, or a checkpoint's step with the states it saved."""

    step: int = 0
    trainer_state: dict[str, Any] = field(default_factory=dict)
    rank_state: dict[str, Any] = field(default_factory=dict)


def train(cfg: TrainConfig, run_dir: Path, topo: Topology) -> dict[str, Any]:
    seed_everything(cfg.seed + topo.rank)
    return_freed_buffers(cfg.trainer.mmap_threshold_kb)
    task = build_task(cfg.benchmark)
    if isinstance(task, DatasetTask):
        task.check_training()
    reward = build_reward(cfg.reward, cfg.benchmark)
    tokenizer = load_tokenizer(cfg.model)
    lm = load_model(cfg.model, tokenizer, topo.device)
    if cfg.kernel.lean_layers:
        make_lean(lm)
    model = build_policy(cfg, lm)
    reference = _frozen_reference(model, cfg) if cfg.algo.needs_ref else None
    critic = build_critic(cfg, model, topo) if cfg.advantage.needs_critic else None
    resume_from = _choose_checkpoint(cfg, run_dir, topo)
    log = (
        RunLog(run_dir, cfg.trainer.max_steps, cfg.trainer.progress and topo.is_main)
        if topo.is_main
        else None
    )
    sizes = _model_sizes(model, critic)  # before ZeRO-3 partitions the parameters
    warmup_summary: dict[str, Any] = {}
    if model.mtp is not None and resume_from is None:
        # Before the engine exists: its optimizer then starts from the warmed-up modules.
        warmup_stream = task.train_stream(warmup_stream_seed(cfg.seed))
        warmup_summary = warm_up(cfg, model, tokenizer, warmup_stream, _emitter(log))
    engine = build_engine(model, cfg, accumulation_steps(cfg), topo.world_size)
    critic_engine = (
        build_engine(
            critic, cfg, accumulation_steps(cfg), topo.world_size, lr=cfg.advantage.critic_lr
        )
        if critic is not None
        else None
    )
    policy: Policy = engine.module
    generator = torch.Generator().manual_seed(cfg.seed)
    start = _load_checkpoint(engine, resume_from, topo, critic_engine)
    # After the checkpoint: an engine of its own starts from the resumed weights.
    backend = build_backend(cfg.rollout, policy.lm, tokenizer, policy.share_prompts)
    stream = CountingStream(task.train_stream(cfg.seed), start.trainer_state.get("stream_drawn", 0))
    # DAPO refills come from a per-rank stream, so ranks never wait on each other's draws.
    refill = (
        CountingStream(
            task.train_stream(cfg.seed * 1000 + 1 + topo.rank),
            start.rank_state.get("refill_drawn", 0),
        )
        if cfg.algo.dynamic_sampling
        else None
    )
    if start.rank_state:
        restore_rng(start.rank_state["rng"], generator)
    per_rank = cfg.trainer.prompts_per_step // topo.world_size
    summary: dict[str, Any] = start.trainer_state.get("summary") or {
        "run_dir": str(run_dir),
        "steps": 0,
        **sizes,
        **warmup_summary,
    }
    step_seconds: list[float] = start.trainer_state.get("step_seconds", [])
    bad_in_row: int = start.trainer_state.get("bad_steps_in_row", 0)
    with log or contextlib.nullcontext(), StopSignals() as signals, contextlib.closing(backend):
        if cfg.trainer.eval_before and start.step == 0:
            summary["eval_before"] = held_out_accuracy(
                cfg, backend, tokenizer, task, reward, topo, log, 0, "before"
            )
        for step in range(start.step + 1, cfg.trainer.max_steps + 1):
            faults.enter_step(step)
            began = time.perf_counter()
            problems = [next(stream) for _ in range(cfg.trainer.prompts_per_step)]
            local = problems[topo.rank * per_rank : (topo.rank + 1) * per_rank]
            experience = exp.collect(
                cfg,
                policy,
                reference,
                tokenizer,
                local,
                reward,
                refill,
                critic_engine.module if critic_engine is not None else None,
                backend,
                exp.rollout_seed(cfg.seed, step, topo.rank),
            )
            update_start = time.perf_counter()
            skipped_before = skipped_optimizer_steps(engine)
            metrics = update(cfg, engine, experience, generator, critic_engine)
            metrics["update_seconds"] = time.perf_counter() - update_start
            metrics["sync_seconds"] = backend.sync(policy.lm)
            skipped = skipped_optimizer_steps(engine) - skipped_before
            metrics["skipped_optimizer_steps"] = skipped
            record = step_record(
                cfg, step, engine, experience, metrics, time.perf_counter() - began
            )
            step_seconds.append(record["step_seconds"])
            if log is not None:
                log.step(record, step_samples(cfg, step, experience))
            summary.update(steps=step, final_reward_mean=record["reward_mean"])
            bad_in_row = bad_in_row + 1 if skipped else 0
            if bad_in_row >= cfg.trainer.max_bad_steps:
                raise RunError(_too_many_bad_steps(cfg, step, run_dir))
            if (
                cfg.trainer.eval_every
                and step % cfg.trainer.eval_every == 0
                and step < cfg.trainer.max_steps
            ):
                held_out_accuracy(cfg, backend, tokenizer, task, reward, topo, log, step, "during")
            signum = signals.requested(topo.device)
            if signum or (cfg.trainer.save_every and step % cfg.trainer.save_every == 0):
                trainer_state = {
                    "step": step,
                    "stream_drawn": stream.drawn,
                    "summary": summary,
                    "step_seconds": step_seconds,
                    "bad_steps_in_row": bad_in_row,
                    "logs": log_lengths(run_dir) if topo.is_main else {},
                }
                rank_state = {
                    "rng": capture_rng(generator),
                    "refill_drawn": refill.drawn if refill is not None else 0,
                }
                saved = checkpoint.save(
                    engine,
                    run_dir,
                    step,
                    trainer_state,
                    rank_state,
                    topo,
                    cfg.trainer.keep_checkpoints,
                    critic_engine,
                )
            if signum:
                raise StopRequested(signum, _stopped(signum, step, saved, run_dir))
        # No optimizer step follows: the AdamW moments (2x the weights) go before the final
        # evaluation and save, which then run in the memory of inference plus the weights.
        for owner in (engine, critic_engine):
            if owner is not None:
                torch_optimizer(owner).state.clear()
        if cfg.trainer.eval_after:
            summary["eval_after"] = held_out_accuracy(
                cfg, backend, tokenizer, task, reward, topo, log, cfg.trainer.max_steps, "after"
            )
        if step_seconds:
            summary["median_step_seconds"] = float(np.median(step_seconds))
        if topo.world_size > 1:
            summary["rank_param_checksums"] = _rank_checksums(engine, topo)
            if critic_engine is not None:
                summary["critic_rank_param_checksums"] = _rank_checksums(critic_engine, topo)
        if cfg.trainer.save_final:
            _save_final(engine, tokenizer, run_dir / "final", topo)
            summary["final_model"] = str(run_dir / "final")
            if policy.mtp is not None:
                save_mtp_modules(engine, cfg, run_dir / MTP_FILE, topo)
                summary["mtp_modules"] = str(run_dir / MTP_FILE)
            if critic_engine is not None and cfg.advantage.save_critic:
                save_critic(critic_engine, run_dir / CRITIC_DIR, topo)
                summary["critic"] = str(run_dir / CRITIC_DIR)
        if log is not None:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            _report(log, summary)
    return summary


def build_policy(cfg: TrainConfig, lm: Any) -> Policy:
    """The trained module: the LM, its log-prob head and, for MPO's future=mtp, the MTP modules."""
    depths = cfg.algo.mtp_depths
    if depths:
        problem = mtp_support_problem(getattr(lm.config, "model_type", None), lm)
        if problem is not None:
            raise ConfigError(mtp_unsupported_message(cfg, problem))
    return Policy(
        lm,
        cfg.kernel,
        share_prompts=cfg.model.share_prompts,
        mtp_depths=depths,
        mtp=cfg.algo.mtp,
    )


def _choose_checkpoint(cfg: TrainConfig, run_dir: Path, topo: Topology) -> Path | None:
    """With `resume`, the newest good checkpoint (all ranks the same one), the logs cut back to
    it; None to start at step 0. Chosen before the engine exists: whether the MTP warm-up runs
    depends on it."""
    if not cfg.resume:
        return None
    chosen: list[str | None] = [None]
    if topo.is_main:
        for leftover in checkpoint.remove_staging(run_dir):
            _warn(f"removed {leftover}, a checkpoint the run was killed while writing")
        good = checkpoint.latest_good(run_dir, _warn)
        chosen = [str(good) if good is not None else None]
    if dist.is_initialized() and topo.world_size > 1:
        dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        if topo.is_main:
            truncate_logs(run_dir, {})
            _warn(f"{run_dir} has no usable checkpoint: the run starts over from step 0")
        return None
    found = Path(chosen[0])
    if topo.is_main:
        truncate_logs(run_dir, checkpoint.read_trainer_state(found)["logs"])
    return found


def _load_checkpoint(
    engine: Any, found: Path | None, topo: Topology, critic_engine: Any = None
) -> Start:
    """Restore the engines (weights, optimizer, schedule, MTP modules, critic) and the run's
    states."""
    if found is None:
        return Start()
    trainer_state, rank_state = checkpoint.load(engine, found, topo, critic_engine)
    if topo.is_main:
        print(
            f"tepo train: resuming {found.parent.parent} after step {trainer_state['step']} "
            f"({found.name})",
            file=sys.stderr,
        )
    return Start(trainer_state["step"], trainer_state, rank_state)


def _emitter(log: RunLog | None) -> Callable[[dict[str, Any]], None]:
    return log.warmup if log is not None else (lambda record: None)


def _model_sizes(policy: Policy, critic: Critic | None = None) -> dict[str, int]:
    """Parameter counts: the policy's own and, with MPO's future=mtp, the MTP modules', and the
    critic's with advantage=gae."""
    sizes = {"policy_parameters": sum(p.numel() for p in policy.lm.parameters())}
    if policy.mtp is not None:
        sizes["mtp_parameters"] = policy.mtp.parameter_count()
    if critic is not None:
        sizes["critic_parameters"] = sum(p.numel() for p in critic.parameters())
    return sizes


def _warn(message: str) -> None:
    print(f"tepo train: warning: {message}", file=sys.stderr)


def _too_many_bad_steps(cfg: TrainConfig, step: int, run_dir: Path) -> str:
    good = checkpoint.sealed_checkpoints(run_dir)
    kept = f"the last good checkpoint is {good[0]}" if good else "no checkpoint was written yet"
    return (
        f"{cfg.trainer.max_bad_steps} steps in a row (up to step {step}) had a non-finite loss or "
        f"gradient and were skipped (trainer.max_bad_steps); {kept}. Lower trainer.lr, check "
        f"the rewards and advantages in metrics.jsonl, or raise trainer.max_bad_steps."
    )


def _stopped(signum: int, step: int, saved: Path, run_dir: Path) -> str:
    name = signal.Signals(signum).name
    return (
        f"stopped by {name} after step {step}; checkpoint written to {saved}. Continue it with "
        f"the same command plus resume={run_dir} (for a sweep: the same sweep command plus "
        f"resume=true)."
    )


def _frozen_reference(model: Policy, cfg: TrainConfig) -> Policy:
    """A frozen copy of the policy's LM (never of its MTP modules) for the KL term."""
    reference = Policy(copy.deepcopy(model.lm), cfg.kernel, share_prompts=model.share_prompts)
    reference.eval()
    reference.requires_grad_(False)
    return reference


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
    consolidated = None
    if engine.zero_optimization_stage() == 3:
        # Collective: every rank calls it; rank 0 gets the full weights, the others None.
        consolidated = engine._zero3_consolidated_16bit_state_dict()
    if not topo.is_main:
        return
    state_dict = None if consolidated is None else policy.hf_state_dict(consolidated)

    def write(staging: Path) -> None:
        policy.lm.save_pretrained(staging, state_dict=state_dict)
        tokenizer.save_pretrained(staging)

    write_directory(target, write, "the final model")


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
