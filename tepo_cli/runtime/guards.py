"""Numeric guards: an optimizer step whose gradients are not all finite does not happen.

The check sits in the innermost optimizer, so it holds for every ZeRO stage: DeepSpeed hands the
torch optimizer the (partitioned, clipped) fp32 gradients, and a NaN anywhere makes every rank's
partition NaN after clipping by the global norm — the ranks still agree through an all-reduce.
A skipped step leaves the weights, the AdamW moments and the learning-rate schedule untouched.

In bf16 DeepSpeed's own wrapper checks the gradients first and skips a non-finite step before this
optimizer is called; DeepSpeed then counts it in `engine.skipped_steps` and does not step the
schedule either. `skipped_optimizer_steps` counts both, so `trainer.max_bad_steps` sees every
skipped step in float32 and bf16 (one step is never skipped by both: the wrapper does not call
this optimizer for a step it skips). fp16's loss-scale overflows are left to DeepSpeed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from tepo_cli.core import collective


class FiniteAdamW(torch.optim.AdamW):
    """AdamW that skips (and counts) a step with any non-finite gradient."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped_steps = 0
        self.last_step_skipped = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        grads = [
            p.grad for group in self.param_groups for p in group["params"] if p.grad is not None
        ]
        if grads:
            finite = torch.isfinite(torch.nn.utils.get_total_norm(grads)).double().reshape(1)
            # The gradients may live elsewhere than the group's back-end wants its tensors (host
            # memory under ZeRO-Offload, NCCL on CUDA): the collective moves the flag.
            finite = collective.all_min(finite)
            self.last_step_skipped = not bool(finite.item())
        else:
            self.last_step_skipped = False
        if self.last_step_skipped:
            self.skipped_steps += 1
            return None
        return super().step(closure)


class GuardedLambdaLR(LambdaLR):
    """A LambdaLR that does not advance when its optimizer skipped the step."""

    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        if getattr(self.optimizer, "last_step_skipped", False):
            return
        super().step()


def torch_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The innermost (torch) optimizer, whatever DeepSpeed wrapped around it."""
    return engine.lr_scheduler.optimizer


def skipped_optimizer_steps(engine: Any) -> int:
    """Optimizer steps skipped so far: by the guard (FiniteAdamW) and by DeepSpeed's own
    overflow check (bf16/fp16 wrappers), which skips before the guard would run."""
    guarded = int(getattr(torch_optimizer(engine), "skipped_steps", 0))
    if engine.fp16_enabled():
        # fp16's dynamic loss scale overflows on purpose while it calibrates (each overflow
        # halves it); those skips are not bad steps, and DeepSpeed bounds them itself.
        return guarded
    return guarded + int(engine.skipped_steps)
