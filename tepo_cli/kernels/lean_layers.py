"""RMSNorm and SwiGLU that keep less for backward: the same forward values, less activation memory.

Autograd keeps every intermediate an op needs: for transformers' RMSNorm the normalised input
besides the input itself, for the SwiGLU MLP silu(gate) besides gate and up. These two functions
keep only the inputs (and RMSNorm's per-row scale) and recompute the rest in backward — cheap
elementwise work: for a Llama-shaped layer, 2 x hidden + intermediate of the floats a token
keeps per layer.

Their outputs are kept a second time by the layers that consume them: q/k/v (and gate/up) keep
the normalised input they multiply, down_proj keeps silu(gate) * up, and o_proj a copy of the
packed attention's output (models/packed_attention.py registers it). Inside the decoder stack's forward a
saved-tensor hook keeps those as recipes instead (`_SavedOutputs`): in backward the output is
recomputed from what is kept anyway (the norm's input, gate and up, the attention's segments),
once per layer and shared by its consumers: another 3 x hidden + intermediate floats per token
and layer (what it saves at the peak: docs/guides/performance.md), for one more norm and one more
silu-multiply per layer in backward. The recomputed values
are bitwise the forward's (the same operations on the same inputs; the norm's weight is copied
at forward time, so a ZeRO-3 partition released after the forward does not matter).

`make_lean(model)` swaps the forward of the modules whose code is known to match (the Llama family:
Llama, Qwen2/3, Mistral, SmolLM); any other module keeps its own forward.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}
SWIGLU_MLPS = {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}
DECODER_STACKS = {"LlamaModel", "Qwen2Model", "Qwen3Model", "MistralModel"}


class _Recipe:
    """How to recompute one lean output in backward; computed once, shared by its consumers."""

    __slots__ = ("dtype", "make", "storage", "value")

    def __init__(self, output: torch.Tensor, make: Callable[[], torch.Tensor]) -> None:
        # The storage, not the tensor: a consumer may keep only a view of the output (o_proj's
        # input is a reshape), and the storage lives exactly as long as any view of it.
        self.storage = weakref.ref(output.untyped_storage())
        self.dtype = output.dtype
        self.make = make
        self.value: torch.Tensor | None = None

    def get(self) -> torch.Tensor:
        if self.value is None:
            with torch.no_grad():
                self.value = self.make()
        return self.value


class _SavedOutputs:
    """Saved-tensor hooks: a tensor autograd saves that is (a view of) a registered lean output,
    alive in this forward, is kept as its recipe; anything else is kept as it is. `kept_bytes` and
    `recomputed_bytes` count what the hooks saw (tests)."""

    def __init__(self) -> None:
        self.recipes: dict[int, _Recipe] = {}  # storage address of a live output -> its recipe
        self.active = False
        self.kept_bytes = 0
        self.recomputed_bytes = 0

    def register(self, output: torch.Tensor, make: Callable[[], torch.Tensor]) -> None:
        if self.active:
            self.recipes[output.untyped_storage().data_ptr()] = _Recipe(output, make)

    def pack(self, tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        recipe = self.recipes.get(storage.data_ptr())
        if recipe is None or recipe.storage() is not storage or recipe.dtype != tensor.dtype:
            self.kept_bytes += tensor.numel() * tensor.element_size()
            return tensor
        self.recomputed_bytes += tensor.numel() * tensor.element_size()
        return (recipe, tensor.size(), tensor.stride(), tensor.storage_offset())

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        recipe, size, stride, offset = packed
        return recipe.get().as_strided(size, stride, offset)  # the output was contiguous


SAVED_OUTPUTS = _SavedOutputs()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    # At least float32, as transformers' RMSNorm (which casts float64 down; this does not).
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (wide * rstd).to(x.dtype), rstd


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        output, rstd = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return output

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
    output = _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)
    if SAVED_OUTPUTS.active:
        x, weight, eps = hidden_states.detach(), self.weight.detach().clone(), self.variance_epsilon
        SAVED_OUTPUTS.register(output, lambda: _rms_norm(x, weight, eps)[0])
    return output


def _lean_swiglu(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, x)
    gate, up = self.gate_proj(x), self.up_proj(x)
    hidden = _SiluMul.apply(gate, up)
    if SAVED_OUTPUTS.active:
        gate_value, up_value = gate.detach(), up.detach()
        SAVED_OUTPUTS.register(hidden, lambda: F.silu(gate_value) * up_value)
    return self.down_proj(hidden)


def _stack_keeping_recipes(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The decoder stack's forward with `SAVED_OUTPUTS` on: the lean outputs its layers' inputs
    are made of are kept as recipes (module docstring). Off again at the end, and the table of
    live outputs emptied: the recipes that autograd kept stay reachable from the graph only."""
    if not torch.is_grad_enabled() or SAVED_OUTPUTS.active:
        return type(self).forward(self, *args, **kwargs)
    SAVED_OUTPUTS.active = True
    try:
        with torch.autograd.graph.saved_tensors_hooks(SAVED_OUTPUTS.pack, SAVED_OUTPUTS.unpack):
            return type(self).forward(self, *args, **kwargs)
    finally:
        SAVED_OUTPUTS.active = False
        SAVED_OUTPUTS.recipes.clear()


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
        elif name in DECODER_STACKS:
            module.forward = types.MethodType(_stack_keeping_recipes, module)
            changed += 1
    return changed


def _is_silu(activation: Any) -> bool:
    return isinstance(activation, nn.SiLU) or type(activation).__name__ == "SiLUActivation"
