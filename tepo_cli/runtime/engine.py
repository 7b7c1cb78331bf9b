"""The DeepSpeed engine that owns the policy's parameters, optimizer and learning-rate schedule."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tepo_cli.config.schema import DeepSpeedConfig, TrainConfig
from tepo_cli.core.library_warnings import library_prints_to_log
from tepo_cli.runtime.guards import FiniteAdamW, GuardedLambdaLR


def deepspeed_config(
    cfg: DeepSpeedConfig,
    micro_batch: int,
    accumulation: int,
    world: int,
    grad_clip: float,
    dtype: torch.dtype,
) -> dict[str, Any]:
    bf16 = dtype == torch.bfloat16
    zero: dict[str, Any] = {"stage": ds_stage(cfg.stage, dtype), "overlap_comm": cfg.overlap_comm}
    if cfg.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": cfg.offload_optimizer}
    if cfg.offload_param != "none":
        zero["offload_param"] = {"device": cfg.offload_param}
    if cfg.stage == 3:
        # ZeRO-3 records the order its modules ran in during one step and, once it has it,
        # looks that far ahead before releasing each module's gathered parameters. A tepo step
        # also generates (every token a forward of the whole model), so the record holds every
        # token's modules, and each release of the next generation walks it: steps after the
        # second became 30 times slower (docs/guides/performance.md). Releasing at once costs a
        # re-gather of a parameter used twice in a forward (a tied embedding) instead.
        zero["stage3_max_reuse_distance"] = 0
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": micro_batch * accumulation * world,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16, "check_grad_overflow": True},
        "fp16": {"enabled": dtype == torch.float16},
        "zero_allow_untested_optimizer": True,
        # tepo passes a torch AdamW (no op compilation); with offload it runs on the host copy.
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16:
        config.update(BF16_PRECISION)
    return _merge(config, cfg.extra)


# bf16 weights train against float32 numbers everywhere else: DeepSpeed's optimizer keeps float32
# master weights and AdamW moments at every stage, and with these two keys it also accumulates
# the micro-batches' gradients in float32 and reduces them across ranks in float32 (bf16 keeps
# 8 significant bits: summed in bf16, small gradients vanish beside large ones).
BF16_PRECISION: dict[str, Any] = {
    "data_types": {"grad_accum_dtype": "fp32"},
    "communication_data_type": "fp32",
}


def ds_stage(stage: int, dtype: torch.dtype) -> int:
    """The ZeRO stage DeepSpeed is given for `deepspeed.stage`.

    bf16 without ZeRO would run DeepSpeed's plain mixed-precision wrapper, which accumulates and
    reduces gradients in bf16 (DeepSpeed 0.19 refuses float32 accumulation there). Stage 1 in
    bf16 is DeepSpeed's BF16_Optimizer instead: float32 master weights, moments and gradient
    accumulation, the optimizer state split over the ranks (one rank: no split at all).
    """
    return 1 if stage == 0 and dtype == torch.bfloat16 else stage


def build_engine(
    model: nn.Module, cfg: TrainConfig, accumulation: int, world: int, lr: float | None = None
) -> Any:
    """deepspeed.initialize with a guarded torch AdamW (no op compilation) and a LambdaLR schedule.

    `lr` (default trainer.lr) lets a second engine — the critic's — have its own learning rate.
    """
    from tepo_cli.core.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()

    trainer = cfg.trainer
    dtype = next(model.parameters()).dtype
    optimizer = FiniteAdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=trainer.lr if lr is None else lr,
        betas=trainer.adam_betas,
        eps=trainer.adam_eps,
        weight_decay=trainer.weight_decay,
        fused=True,  # one pass over each tensor: faster than foreach on CPU, no temporaries
    )
    scheduler = GuardedLambdaLR(optimizer, _lr_lambda(cfg))
    ds_config = deepspeed_config(
        cfg.deepspeed, trainer.micro_batch_size, accumulation, world, trainer.grad_clip, dtype
    )
    with library_prints_to_log():  # its bf16 optimizer prints its memory use
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
    if world == 1 and cfg.deepspeed.stage == 0:
        # One rank has nothing to reduce, yet ZeRO-0 would still flatten every gradient into a
        # bucket and copy it back after each backward: time for nothing.
        engine.enable_backward_allreduce = False
    return engine


def consolidated_state_dict(engine: Any) -> dict[str, torch.Tensor] | None:
    """Under ZeRO-3, the module's whole state dict on rank 0 and None on the others (a
    collective: every rank calls it). None under the other stages, whose modules hold their
    whole weights: read the module itself."""
    if engine.zero_optimization_stage() != 3:
        return None
    return engine._zero3_consolidated_16bit_state_dict()


def optimizer_steps_per_step(cfg: TrainConfig) -> int:
    return cfg.trainer.ppo_epochs * cfg.trainer.minibatches


def _lr_lambda(cfg: TrainConfig):
    trainer = cfg.trainer
    total = max(1, trainer.max_steps * optimizer_steps_per_step(cfg))
    warmup = trainer.warmup_steps

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if trainer.lr_schedule == "linear":
            return 1.0 - progress
        if trainer.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
