"""Model FLOPs utilisation of the update: the FLOPs the update needs over what the devices could
have done in its seconds (PaLM's MFU, Chowdhery et al. 2022, appendix B, with attention).

Needed FLOPs of one pass over the step's tokens, forward and backward:
    6 · N · tokens + 12 · L · d_attn · Σ context
N: the parameters a token multiplies by (every weight, less an input embedding that is not also
the output head: a lookup is no matmul); L layers; d_attn = heads × head dim; a token's context is
the number of keys it attends to (causal: its position + 1), summed exactly rather than PaLM's
full-length bound. Modules attached to the policy (MPO's) that run every position again add
p · (N_a · tokens + 2 · L_a · d_attn · Σ context): their matmul weights N_a and decoder layers
L_a, with p = 6 when they train, 4 when they are frozen but pass the gradient to the backbone
(no weight gradient), 2 when nothing flows back through them; the modules say their own
(`work`). Each optimizer step counts its own rows: a
prompt once per distinct prompt of the step (as its prompt pass computes them, under that step's
weights), an answer once per row;
the rows the update leaves out (an advantage of exactly 0, train/zero_advantage.py) and the steps
it skips count nothing. Recomputation (gradient checkpointing) is not needed work, so it is not
counted: that is MFU, not hardware utilisation.

The peak: on CUDA, the device's dense (no sparsity) tensor-core rate for the update's dtype from
NVIDIA's datasheets (`PEAKS`; an unknown GPU gets no MFU, said once); on the CPU, the machine's
matmul peak in the model's dtype, measured over several trials at a fixed shape and cached per
machine and dtype (train/cpu_peak.py). An update faster than that peak (measured while the
machine was busier) raises it (`cpu_peak.raise_peak`): MFU is never recorded above 1.

Where the figure is made: this module's functions give each optimizer step's FLOPs, which
train/update.py adds up as the update runs (`_Tally.count_work`, the rows that step trained);
train/step_records.py divides them by the update's seconds and the peak (`_throughput`), into the
record's `update_mfu`.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch

from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.train.cpu_peak import cpu_peak

# Dense peak FLOP/s by GPU name fragment (first match wins: the specific names first), per dtype.
# NVIDIA datasheets: H100 SXM5 / H200 (989 bf16, 495 tf32, 67 fp32 TFLOPS), H100 PCIe (756, 378,
# 51), A100 (312, 156, 19.5), L40S (362, 183, 91.6), RTX 4090 (165, 82.6, 82.6).
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    ("H200", {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("RTX 4090", {"bf16": 165e12, "tf32": 82.6e12, "fp32": 82.6e12}),
)


@dataclass(frozen=True)
class ModelShape:
    matmul_params: int
    layers: int
    attention_width: int
    hidden: int
    intermediate: int
    attached_params: int = 0  # the attached modules' matmul weights a position multiplies by
    attached_layers: int = 0  # their decoder layers
    attached_passes: float = 0.0  # FLOPs per weight and position: 6, 4 or 2 (module docstring)


def policy_shape(policy: Any) -> ModelShape:
    """The backbone's shape (`model_shape`) and, when the policy has attached modules, theirs."""
    shape = model_shape(policy.lm)
    attached = getattr(policy, "attached", None)
    if attached is None:
        return shape
    params, layers, passes = attached.work(policy.lm)
    return replace(shape, attached_params=params, attached_layers=layers, attached_passes=passes)


def model_shape(lm: torch.nn.Module) -> ModelShape:
    config = lm.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    total = sum(_numel(p) for p in lm.parameters())
    embedding = lm.get_input_embeddings().weight
    head = lm.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    params = total if tied else total - _numel(embedding)
    intermediate = getattr(config, "intermediate_size", None) or 4 * config.hidden_size
    return ModelShape(
        params, config.num_hidden_layers, heads * head_dim, config.hidden_size, intermediate
    )


def _numel(param: torch.nn.Parameter) -> int:
    return int(getattr(param, "ds_numel", param.numel()))  # ZeRO-3 keeps a shard only


def update_work(shape: ModelShape, batch: SequenceBatch, rows: torch.Tensor) -> tuple[float, float]:
    """(needed FLOPs, trained tokens) of one optimizer step's forward and backward over `rows`
    (host indices into `batch`, this rank's): the update counts every step it runs
    (train/update.py), so rows it leaves out (no gradient) and steps it skips count nothing."""
    width = batch.prompt_width
    mask = batch.attention_mask[rows].cpu()
    prompt_mask = mask[:, :width]
    prompts = prompt_mask.sum(dim=1).double()
    answers = batch.completion_mask[rows].sum(dim=1).double().cpu()
    first = batch.distinct_prompts(rows)[0].cpu()
    return needed_flops(shape, prompts[first], answers, prompts)


def needed_flops(
    shape: ModelShape,
    distinct_prompts: torch.Tensor,
    answers: torch.Tensor,
    answer_prompts: torch.Tensor,
) -> tuple[float, float]:
    """(FLOPs, tokens) of one forward and backward: each distinct prompt's tokens once
    (`distinct_prompts`: their lengths), every answer (`answers`: lengths) after its prompt
    (`answer_prompts`: that prompt's length, row by row). The benchmarks count another trainer's
    step with the same formula (scripts/benchstep)."""
    distinct, answers = distinct_prompts.double(), answers.double()
    prompts = answer_prompts.double()
    tokens = float(distinct.sum() + answers.sum())
    context = float(
        (distinct * (distinct + 1) / 2).sum()
        + (answers * prompts + answers * (answers + 1) / 2).sum()
    )
    flops = (
        6.0 * shape.matmul_params * tokens + 12.0 * shape.layers * shape.attention_width * context
    )
    flops += shape.attached_passes * (
        shape.attached_params * tokens
        + 2.0 * shape.attached_layers * shape.attention_width * context
    )
    return flops, tokens


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """FLOP/s this device could do at best in `dtype` (the model's: its parameters' dtype);
    None for a GPU not in PEAKS. On the CPU, the machine's cached probe (train/cpu_peak.py)."""
    if device.type == "cuda":
        return _gpu_peak(torch.cuda.get_device_name(device), _kind(dtype))
    return cpu_peak(dtype)


def _kind(dtype: torch.dtype) -> str:
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


@functools.cache
def _gpu_peak(name: str, kind: str) -> float | None:
    for fragment, peaks in PEAKS:
        if fragment in name:
            return peaks[kind]
    print(
        f"tepo train: no peak FLOP/s known for GPU {name!r} (train/flops.py lists "
        f"{', '.join(f for f, _ in PEAKS)}): the step records carry no update_mfu.",
        file=sys.stderr,
    )
    return None
