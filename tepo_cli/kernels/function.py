"""The one autograd Function of the kernel path, shared by the torch and triton back-ends.

A back-end supplies two plain functions (`forward(hidden, weight, targets, temperature,
with_entropy, tiling) -> (logp, entropy | None, lse)` and the matching `backward(rows, weight,
temperature, tiling, (need_hidden, need_weight)) -> (grad_hidden | None, grad_weight | None)`); this
wrapper saves only hidden, weight, targets and the per-row statistics, never an [N, V] tensor, and
hands the backward only the rows whose upstream gradient is not zero (`ActiveRows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from tepo_cli.kernels.active_rows import active_rows
from tepo_cli.kernels.chunked import compute_dtype


@dataclass(frozen=True)
class Backend:
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]
    backward: Callable[..., tuple[torch.Tensor | None, torch.Tensor | None]]


class TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        tiling: Any,
        backend: Backend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent, lse = backend.forward(hidden, weight, targets, temperature, with_entropy, tiling)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature, ctx.tiling, ctx.backend = temperature, tiling, backend  # type: ignore[attr-defined]
        if ent is None:
            ent = logp.new_empty(0)
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        grad_logp: torch.Tensor,
        grad_ent: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse, ent = ctx.saved_tensors  # type: ignore[attr-defined]
        need_h, need_w = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        cd = compute_dtype(hidden.dtype, weight.dtype)
        rows = active_rows(hidden, targets, lse, ent, grad_logp, grad_ent, cd)
        if rows.count == 0:
            grad_hidden = torch.zeros_like(hidden) if need_h else None
            return grad_hidden, torch.zeros_like(weight) if need_w else None, *[None] * 5
        grad_hidden, grad_weight = ctx.backend.backward(  # type: ignore[attr-defined]
            rows,
            weight,
            ctx.temperature,  # type: ignore[attr-defined]
            ctx.tiling,  # type: ignore[attr-defined]
            (need_h, need_w),
        )
        return grad_hidden, grad_weight, None, None, None, None, None
