"""RMSNorm and SwiGLU that keep less for backward: the same forward values, less activation memory.

Autograd keeps every intermediate an op needs: for transformers' RMSNorm the normalised input
besides the input itself, for the SwiGLU MLP silu(gate) besides gate and up. These two functions
keep only the inputs (and RMSNorm's per-row scale) and recompute the rest in backward — cheap
elementwise work. On SmolLM2 that is 2 x 576 + 1,536 of the ~13,000 floats a token keeps per layer
(~100 MB of a GRPO step's activations on the CPU benchmark job).

`make_lean(model)` swaps the forward of the modules whose code is known to match (the Llama family:
Llama, Qwen2/3, Mistral, SmolLM); any other module keeps its own forward.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}
SWIGLU_MLPS = {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # At least float32, as transformers' RMSNorm (which casts float64 down; this does not).
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (wide * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        grad_weight = (grad * normed.to(x.dtype)).reshape(-1, x.shape[-1]).sum(0)
        grad_normed = (grad * weight).to(rstd.dtype)
        # y = w * x * r, r = mean(x^2)^-1/2:  dx = r * (g_n - n * mean(g_n * n))
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        sigmoid = torch.sigmoid(gate)
        grad_up = grad * (gate * sigmoid)
        grad_gate = grad * up * sigmoid * (1 + gate * (1 - sigmoid))
        return grad_gate, grad_up


def _lean_rms_norm(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, hidden_states)
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _lean_swiglu(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, x)
    return self.down_proj(_SiluMul.apply(self.gate_proj(x), self.up_proj(x)))


def make_lean(model: nn.Module) -> int:
    """Swap in the lean forwards where they apply; returns how many modules changed."""
    changed = 0
    for module in model.modules():
        name = type(module).__name__
        if name in RMS_NORMS and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_lean_rms_norm, module)
            changed += 1
        elif name in SWIGLU_MLPS and _is_silu(getattr(module, "act_fn", None)):
            module.forward = types.MethodType(_lean_swiglu, module)
            changed += 1
    return changed


def _is_silu(activation: Any) -> bool:
    return isinstance(activation, nn.SiLU) or type(activation).__name__ == "SiLUActivation"
