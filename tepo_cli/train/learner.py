"""The models an update steps, as one kind: the policy, and with `advantage=gae` the critic (its
own DeepSpeed engine, stepped at the policy's accumulation boundaries). The update runs each
learner's micro-batch in turn and steps each at the boundary (train/update.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tepo_cli.models.prompt_pass import MinibatchPrompts
from tepo_cli.runtime.weight_rounding import round_weights


@dataclass
class Learner:
    """A model the update steps: the policy, or GAE's critic (its own engine, stepped at the
    policy's accumulation boundaries). `micro_batch(prompts, index)` runs the loss and backward
    of micro-batch `index`, reading `prompts` (this learner's prompt pass of the minibatch)."""

    engine: Any
    micro_batch: Callable[[MinibatchPrompts, int], dict[str, float]]
    norms: list[float]  # the gradient norm of each optimizer step
    rounding_seed: int | None = None  # stochastic rounding of bf16 weights: the run's seed
    prompts: MinibatchPrompts | None = None
    own_norm: float | None = None  # ZeRO-0 keeps none: measured at the boundary

    def step(self, boundary: bool) -> None:
        """DeepSpeed steps the optimizer at the accumulation boundary only; then bf16 weights
        are rounded stochastically from their masters where asked (runtime/weight_rounding.py)."""
        if boundary and self.engine.zero_optimization_stage() == 0:
            self.own_norm = grad_norm(self.engine.module)
        self.engine.step()
        if boundary and self.rounding_seed is not None and self.engine.bfloat16_enabled():
            round_weights(self.engine, self.rounding_seed)

    def keep_norm(self) -> None:
        """DeepSpeed's gradient norm of the optimizer step, or ours where it keeps none."""
        reported = self.engine.get_global_grad_norm()
        norm = self.own_norm if reported is None else reported
        if norm is not None:
            self.norms.append(float(norm))


def grad_norm(model: torch.nn.Module) -> float:
    """The L2 norm of every gradient the model holds, in float32."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0
