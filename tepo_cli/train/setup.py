"""Building a run: the task, reward, tokenizer and models, a feature's warm-up (MPO's), the
DeepSpeed engines, and — with `resume` — the newest good checkpoint's weights, streams and states.

The order matters for exact resume and for memory: the checkpoint is chosen before the engines
exist (the warm-up runs only on a fresh start, and the engines' optimizers start from the
warmed-up modules); the rollout engine is built after the checkpoint is loaded, from the resumed
weights, or, on a fresh start whose warm-up samples the policy's answers with it, before the
warm-up (the backbone it then holds stays frozen until step 1).
"""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tepo_cli.benchmarks import build_reward, build_task
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import host_allocator
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.machine import describe, moved_warning, note_machine
from tepo_cli.core.run_dir import METRICS
from tepo_cli.data.tasks import DatasetTask, Task
from tepo_cli.envs.sampler import Sampler, build_sampler
from tepo_cli.kernels.lean_layers import make_lean
from tepo_cli.kernels.tf32 import set_tf32
from tepo_cli.kernels.truncated import Truncation
from tepo_cli.models.critic import Critic
from tepo_cli.models.loading import load_model, load_tokenizer, resolve_dtype, weights_location
from tepo_cli.models.lora import full_numel, trainable_parameters
from tepo_cli.models.policy import Policy
from tepo_cli.models.reference import build_reference
from tepo_cli.rollout import build_backend
from tepo_cli.rollout.vllm_modes import resolve_modes
from tepo_cli.runtime import checkpoint
from tepo_cli.runtime.critic_files import build_critic
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.engine import build_engine, deepspeed_config
from tepo_cli.runtime.hooks import RunHooks
from tepo_cli.runtime.host_memory import set_up_host_memory
from tepo_cli.runtime.metrics import RunLog
from tepo_cli.runtime.resume import truncate_logs
from tepo_cli.runtime.rng_and_streams import restore_rng
from tepo_cli.runtime.state import RankState, TrainerState
from tepo_cli.trackers import Trackers, open_trackers
from tepo_cli.train.feature import feature_of
from tepo_cli.train.prompt_streams import open_prompts
from tepo_cli.train.run import Models, Run
from tepo_cli.train.sampling import training_sampling
from tepo_cli.train.update import accumulation_steps


def setup_run(cfg: TrainConfig, run_dir: Path, topo: Topology, hooks: RunHooks) -> Run:
    """A run ready for its first (or next) step, on this rank."""
    seed_everything(cfg.seed + topo.rank)
    # rollout.engine.sleep=true where it cannot be: refused before any model loads
    if cfg.rollout.backend == "vllm":
        resolve_modes(cfg.rollout.engine, on_cuda=topo.device.type == "cuda")
    allocator = set_up_host_memory(cfg.trainer.mmap_threshold_kb)  # glibc: threshold fixed
    task, data, sampler = _task_and_sampler(cfg, topo, allocator)
    reward = build_reward(cfg.reward, cfg.benchmark)
    tokenizer = load_tokenizer(cfg.model)
    zero3 = partitioned_load_config(cfg, topo)
    lm, tf32 = _load_lm(cfg, tokenizer, topo, zero3)
    model = build_policy(cfg, lm)
    # Attached modules and the critic are copies of the LM's layers without adapters: fully trained.
    critic = build_critic(cfg, model, topo) if cfg.advantage.needs_critic else None
    if cfg.model.lora.enabled:
        model.add_adapters(cfg.model.lora, weights_location(cfg.model))
    reference = build_reference(
        cfg, model, topo.world_size, lambda: _reference_lm(cfg, tokenizer, topo, zero3)
    )
    resume_from = choose_checkpoint(cfg, run_dir, topo)
    log = RunLog(run_dir, cfg.trainer.max_steps, cfg.trainer.progress) if topo.is_main else None
    summary = _first_summary(run_dir, data, model_sizes(model, critic), allocator)
    rollout_backend = functools.cache(  # model.lm is the engine's module's lm
        lambda: build_backend(cfg.rollout, model.lm, tokenizer, model.share_prompts, topo.device)
    )
    feature = feature_of(cfg)
    if feature is not None and resume_from is None:
        args = (model, tokenizer, task.train_stream, log, hooks, training_sampling(cfg))
        summary.update(feature.warm_up(*args, rollout_backend))
    engine, critic_engine = _engines(cfg, model, critic, topo)
    generator = torch.Generator().manual_seed(cfg.seed)
    state, rank_state = TrainerState(summary=summary), RankState()
    if resume_from is not None:
        state, rank_state = checkpoint.load(engine, resume_from, topo, critic_engine)
        _say_resumed(resume_from, state, topo)
    backend = rollout_backend()
    state.summary.update(tf32=tf32, rollout_engine=backend.settings())
    _note_machine(state, topo)
    prompts = open_prompts(cfg, task.train_stream, topo, state, rank_state)
    if rank_state.rng:
        restore_rng(rank_state.rng, generator)
    run = Run(
        cfg,
        run_dir,
        topo,
        tokenizer,
        task,
        reward,
        sampler,
        Models(engine, critic_engine, reference),
        backend,
        prompts,
        generator,
        state,
        log,
    )
    run.hooks, run.feature = hooks, feature  # hooks: the kill tests' TEPO_FAULT points, or none
    run.trackers = start_trackers(cfg, run_dir, topo, state)
    return run


def _first_summary(
    run_dir: Path, data: dict[str, Any], sizes: dict[str, int], allocator: str
) -> dict[str, Any]:
    """summary.json as a new run starts it (a resumed run's comes from its checkpoint)."""
    return {"run_dir": str(run_dir), "steps": 0, "data": data, **sizes, "host_allocator": allocator}


def _task_and_sampler(
    cfg: TrainConfig, topo: Topology, allocator: str
) -> tuple[Task, dict[str, Any], Sampler]:
    """The benchmark's task (its training split checked), what the run trains on, and the sampler
    (answers or episodes), announced on rank 0 with the host allocator."""
    task = build_task(cfg.benchmark)
    if isinstance(task, DatasetTask):
        task.check_training()
    data = describe_data(cfg, task)
    _check_held_out(cfg, data)
    sampler = build_sampler(cfg.env, cfg.benchmark, cfg.turn_tokens)  # answers or episodes
    if topo.is_main:
        _say_data(data)
        _say_allocator(cfg, topo, allocator)
        line = sampler.start_line(cfg.trainer, task)  # an environment's turns, held-out cost
        if line is not None:
            print(f"tepo train: {line}", file=sys.stderr)
    return task, data, sampler


def _check_held_out(cfg: TrainConfig, data: dict[str, Any]) -> None:
    """A run that evaluates needs a held-out problem the run does not train on: a split whose every
    problem is also a training one (one file given for both) leaves none, and an accuracy of nan."""
    trainer = cfg.trainer
    if data.get("eval_problems") == 0 and (
        trainer.eval_before or trainer.eval_after or trainer.eval_every
    ):
        raise ConfigError(
            f"benchmark={data['benchmark']}: every problem of the held-out split "
            f"'{data['eval_split']}' ({data['eval_from']}) is also in the training split "
            f"'{data['train_split']}', so none is left to evaluate on. Give the splits separate "
            "files (benchmark.path=<a directory with train.* and test.* files>), or train "
            "without held-out evaluations: trainer.eval_before=false trainer.eval_after=false "
            "trainer.eval_every=0. Nothing was run."
        )


def _engines(cfg: TrainConfig, model: Policy, critic: Any, topo: Topology) -> tuple[Any, Any]:
    """The policy's DeepSpeed engine, and the critic's (its own learning rate) where there is one."""
    accumulation = accumulation_steps(cfg)
    engine = build_engine(model, cfg, accumulation, topo.world_size)
    if critic is None:
        return engine, None
    lr = cfg.advantage.critic_lr
    return engine, build_engine(critic, cfg, accumulation, topo.world_size, lr=lr)


def _load_lm(
    cfg: TrainConfig, tokenizer: Any, topo: Topology, zero3: dict[str, Any] | None
) -> tuple[Any, bool]:
    """The policy's language model on this rank's device (partitioned under `zero3`), with the
    kernel's settings applied: TF32 (whether it is on) and the lean layers."""
    lm = load_model(cfg.model, tokenizer, topo.device, zero3)
    tf32 = set_tf32(cfg.kernel.tf32, next(lm.parameters()).dtype, topo.device)
    if cfg.kernel.tf32 is True and not tf32 and topo.is_main:
        _warn("kernel.tf32=true has no effect on the CPU: TF32 is a CUDA matmul mode")
    if cfg.kernel.lean_layers:
        make_lean(lm)
    return lm, tf32


def partitioned_load_config(cfg: TrainConfig, topo: Topology) -> dict[str, Any] | None:
    """Under ZeRO-3, the DeepSpeed config the policy (and the KL reference) load partitioned
    with; None where the model is loaded whole: other stages, and runs that read the policy's
    whole weights before its engine exists (MPO's modules copy its last layer and warm up on its
    hidden states; the critic starts as a copy of its decoder), and LoRA runs (their reference is
    the policy itself; peft injects into whole layers)."""
    if cfg.deepspeed.stage != 3 or feature_of(cfg) or cfg.model.lora.enabled:
        return None
    if cfg.advantage.needs_critic and cfg.advantage.critic_path is None:
        return None
    dtype = resolve_dtype(cfg.model.dtype, topo.device)
    trainer = cfg.trainer
    return deepspeed_config(
        cfg.deepspeed,
        trainer.micro_batch_size,
        accumulation_steps(cfg),
        topo.world_size,
        trainer.grad_clip,
        dtype,
    )


def _reference_lm(
    cfg: TrainConfig, tokenizer: Any, topo: Topology, zero3: dict[str, Any] | None
) -> Any | None:
    """The KL reference's own LM, loaded partitioned as the policy was (None: the reference is a
    copy of the policy's, which is whole). The policy has not been trained yet, so the weights
    are the same."""
    if zero3 is None:
        return None
    lm = load_model(cfg.model, tokenizer, topo.device, zero3)
    if cfg.kernel.lean_layers:
        make_lean(lm)
    return lm


def start_trackers(
    cfg: TrainConfig, run_dir: Path, topo: Topology, state: TrainerState
) -> Trackers:
    """Rank 0's experiment trackers (`logger=[...]`), continuing their runs when resumed (after
    the checkpoint's step; 0 when no checkpoint was usable)."""
    names = cfg.logger if topo.is_main else []
    resume = state.step if cfg.resume else None
    return open_trackers(names, run_dir, cfg.model_dump(mode="json"), resume)


def describe_data(cfg: TrainConfig, task: Any) -> dict[str, Any]:
    """The task's own account of its training and evaluation data (a plugin task without
    `describe_data` is reported as generating its own)."""
    describe = getattr(task, "describe_data", None)
    if describe is not None:
        return describe()
    return {"benchmark": cfg.benchmark.name, "train_from": "the benchmark's own task"}


def _say_allocator(cfg: TrainConfig, topo: Topology, in_use: str) -> None:
    """Said at start, after the data line: which allocator serves the run changes a CPU step's
    speed and peak."""
    wanted = host_allocator.for_device(cfg.trainer.host_allocator, topo.device.type)
    print(_allocator_line(wanted, in_use), file=sys.stderr)


def _allocator_line(wanted: str, in_use: str) -> str:
    line = f"tepo train: host memory allocator {in_use}"
    resolved = host_allocator.resolve(wanted)
    if resolved.name == in_use:
        return line + (f" ({resolved.note})" if resolved.note else "")
    if resolved.library is None:
        return (
            line + f" (preloaded by this process's environment, LD_PRELOAD; {wanted} was asked for)"
        )
    return line + f" ({resolved.name} is installed: `tepo train` run as a command preloads it)"


def _say_data(data: dict[str, Any]) -> None:
    count = data.get("train_problems")
    size = f"{count:,} problems; " if isinstance(count, int) else ""
    line = (
        f"tepo train: training on {data['benchmark']} '{data.get('train_split', 'task')}' "
        f"({size}{data['train_from']})"
    )
    if "eval_split" in data:
        line += f", evaluating on '{data['eval_split']}' ({data['eval_from']})"
        if data.get("eval_trained_on_left_out"):
            line += (
                f" without the {data['eval_trained_on_left_out']:,} problems it also holds that "
                f"the run trains on ({data['eval_problems']:,} held out)"
            )
    print(line, file=sys.stderr)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_policy(cfg: TrainConfig, lm: Any) -> Policy:
    """The trained module: the LM, its log-prob head and the modules a feature attaches (MPO's)."""
    feature = feature_of(cfg)
    return Policy(
        lm,
        cfg.kernel,
        share_prompts=cfg.model.share_prompts,
        packing=cfg.model.packing,
        attach=feature.attach(lm) if feature is not None else None,
        truncation=sampler_truncation(cfg),
    )


def sampler_truncation(cfg: TrainConfig) -> Truncation | None:
    """The sampler's top-k/top-p when the trainer scores under it (docs/objectives.md §0.9)."""
    if cfg.rollout.truncated_sampling != "renormalise":
        return None
    return Truncation(top_k=cfg.rollout.top_k, top_p=cfg.rollout.top_p)


def model_sizes(policy: Policy, critic: Critic | None = None) -> dict[str, int]:
    """Parameter counts (before ZeRO-3 partitions them): the policy's own (with LoRA adapters),
    those the optimizer updates (adapters and attached modules only, with LoRA), the attached
    modules' (`<prefix>_parameters`: MPO's), and the critic's with advantage=gae."""
    sizes = {
        "policy_parameters": sum(full_numel(p) for p in policy.lm.parameters()),
        # What this rank holds at start-up: 1/world of them when loaded partitioned (ZeRO-3).
        "policy_parameters_on_rank": sum(_held(p) for p in policy.lm.parameters()),
        "trainable_parameters": trainable_parameters(policy),
    }
    if policy.attached is not None:
        sizes[f"{policy.attached.state_prefix}_parameters"] = policy.attached.parameter_count()
    if critic is not None:
        sizes["critic_parameters"] = sum(full_numel(p) for p in critic.parameters())
    return sizes


def _held(param: torch.nn.Parameter) -> int:
    shard = getattr(param, "ds_tensor", None)
    return param.numel() if shard is None else shard.numel()


def choose_checkpoint(cfg: TrainConfig, run_dir: Path, topo: Topology) -> Path | None:
    """With `resume`, the newest good checkpoint (all ranks the same one), the logs cut back to
    it; None to start at step 0."""
    if not cfg.resume:
        return None
    if topo.is_main:
        for leftover in checkpoint.remove_staging(run_dir):
            _warn(f"removed {leftover}, a checkpoint the run was killed while writing")
    found = checkpoint.latest_good(run_dir, _warn, topo)  # collective: each rank checks its files
    if found is None:
        if topo.is_main:
            metrics = run_dir / METRICS
            started = metrics.is_file() and metrics.stat().st_size > 0
            truncate_logs(run_dir, {})
            if started:  # a fresh directory (a sweep's new job under resume=true) is no news
                _warn(f"{run_dir} has no usable checkpoint: the run starts over from step 0")
        return None
    if topo.is_main:
        truncate_logs(run_dir, checkpoint.read_trainer_state(found).logs)
    return found


def _note_machine(state: TrainerState, topo: Topology) -> None:
    """summary.json's `machines`; a warning when a resumed run continues on another machine."""
    machine = describe(topo.device)
    previous = note_machine(state.summary, machine, state.step)
    if previous is not None and topo.is_main:
        _warn(moved_warning(previous, machine, state.step))


def _say_resumed(found: Path, state: TrainerState, topo: Topology) -> None:
    """On the console, and in summary.json's `resumed_after` (each resume in the lineage of the
    run's records), so a report names the resumed runs (eval/report/resumes.py)."""
    state.summary.setdefault("resumed_after", []).append(state.step)
    if topo.is_main:
        print(
            f"tepo train: resuming {found.parent.parent} after step {state.step} ({found.name})",
            file=sys.stderr,
        )


def _warn(message: str) -> None:
    print(f"tepo train: warning: {message}", file=sys.stderr)
