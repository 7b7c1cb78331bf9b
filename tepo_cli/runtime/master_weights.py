"""AdamW with float32 master weights, for the parameters MPO's warm-up trains outside DeepSpeed.

An AdamW step on bf16 weights rounds every update to 8 significant bits: an update smaller than
half a weight's bf16 spacing (lr 3e-4 against a weight near 1, spacing 2^-7) is lost, step after
step. Here AdamW steps float32 copies, and the weights are the copies rounded after each step,
as DeepSpeed's own bf16 optimizers do for the policy. float32 weights are stepped directly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MasterAdamW:
    """`zero_grad()`, backward on the model, then `step(max_norm)`: clips the float32 gradients
    by their global norm, steps the masters and copies them into the model's weights."""

    def __init__(self, params: list[nn.Parameter], **adamw: Any) -> None:
        self.params = params
        self.masters = [
            p if p.dtype == torch.float32 else nn.Parameter(p.detach().float().clone())
            for p in params
        ]
        self.optimizer = torch.optim.AdamW(self.masters, **adamw)

    def zero_grad(self) -> None:
        for param, master in zip(self.params, self.masters, strict=True):
            param.grad = None
            master.grad = None

    @torch.no_grad()
    def step(self, max_norm: float) -> None:
        pairs = list(zip(self.params, self.masters, strict=True))
        for param, master in pairs:
            if master is not param and param.grad is not None:
                master.grad = param.grad.float()
        torch.nn.utils.clip_grad_norm_(self.masters, max_norm)
        self.optimizer.step()
        for param, master in pairs:
            if master is not param:
                param.copy_(master)
