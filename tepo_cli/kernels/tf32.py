"""`kernel.tf32`: TensorFloat-32 for the float32 matmuls of a policy on CUDA.

Tensor cores multiply float32 matrices several times faster in TF32 (10 mantissa bits in the
products, float32 accumulation) than in IEEE float32 (NVIDIA's figures: docs/guides/performance.md). The setting is the process's, set once per rank at
set-up: it covers every float32 matmul of the trainer (the backbone and the kernel path's
lm-head chunks) and of the vLLM engine beside it. The cost is rounding: each product keeps 10
mantissa bits (relative error up to 2^-11), so the trainer's float32 log-probs differ more from
vLLM's than in IEEE float32
(`mismatch_abs_*` in metrics.jsonl; the mismatch correction, docs/objectives.md §0.8, masks or
reweights what differs too much). bfloat16 policies are unaffected (auto leaves them alone);
on the CPU, TF32 does not exist and the setting changes nothing.

It is set with `torch.set_float32_matmul_precision`, not torch 2.13's newer
`torch.backends.cuda.matmul.fp32_precision`: the older call keeps both views of the setting
consistent, while the newer one, once set, makes the older getters raise — and vLLM's GPU worker
and torch.compile (which vLLM uses for CUDA graphs) call them in this same process.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch


def tf32_wanted(setting: Literal["auto"] | bool, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether float32 matmuls run in TF32: auto = a float32 policy on CUDA; never on the CPU."""
    if device.type != "cuda":
        return False
    return dtype == torch.float32 if setting == "auto" else bool(setting)


def matmul_precision(tf32: bool) -> str:
    """The `torch.set_float32_matmul_precision` value: "high" allows TF32, "highest" is IEEE."""
    return "high" if tf32 else "highest"


def set_tf32(setting: Literal["auto"] | bool, dtype: torch.dtype, device: torch.device) -> bool:
    """Set this process's float32 matmul precision for the policy; returns whether TF32 is on."""
    enabled = tf32_wanted(setting, dtype, device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision(matmul_precision(enabled))
    return enabled


@contextmanager
def tf32_for_half_inputs(inputs: torch.Tensor) -> Iterator[None]:
    """TF32 for the chunked path's float32 matmuls while it scores half-precision inputs on CUDA.

    The path multiplies bf16/fp16 hidden states and head weights in float32 (its compute dtype),
    which on tensor cores is the slow IEEE rate (docs/results/gpu/index.md). The operands' values
    come from 8- or 11-bit mantissas, so TF32's rounding (10 bits kept: 2^-11 relative) costs
    them no more than the naive path's bfloat16 logits (2^-8) do, and the matmuls run at the TF32
    rate. The process's setting is restored afterwards; elsewhere this changes nothing.
    """
    half = inputs.is_cuda and inputs.dtype in (torch.bfloat16, torch.float16)
    before = torch.get_float32_matmul_precision()
    if half:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        if half:
            torch.set_float32_matmul_precision(before)
