"""Numeric guards: an optimizer step whose gradients are not all finite does not happen.

The check sits in the innermost optimizer, so it holds for every ZeRO stage: DeepSpeed hands the
torch optimizer the (partitioned, clipped) fp32 gradients, and a NaN anywhere makes every rank's
partition NaN after clipping by the global norm — the ranks still agree through an all-reduce.
A skipped step leaves the weights, the AdamW moments and the learning-rate schedule untouched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR


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
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(finite, op=dist.ReduceOp.MIN)
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
    return int(getattr(torch_optimizer(engine), "skipped_steps", 0))
