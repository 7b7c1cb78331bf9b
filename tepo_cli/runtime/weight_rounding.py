"""bf16 weights rounded stochastically from their float32 master copy after each optimizer step.

In bf16, DeepSpeed keeps float32 master weights and AdamW moments, and after each optimizer
step writes the weights the model computes with as the master rounded to the nearest bf16
value. bf16 keeps 8 significant bits: a weight of 0.03 has neighbours 1.2e-4 apart, while AdamW
at lr 1e-5 moves it about 1e-5 a step. Rounded to nearest, most weights the model computes with
do not change for tens of steps, and the policy that samples and is scored barely moves although
its master does: on word_math, bf16's KL to the reference stayed at its first step's 0.005 for 20
steps where float32's grew to 0.04 (docs/results/precision/). Rounding each weight up with the
probability of its distance to the lower neighbour makes the bf16 weight equal to the master in
expectation, so the computed policy follows the float32 one (Gupta et al. 2015, "Deep Learning
with Limited Numerical Precision"; Zamirai et al. 2020, "Revisiting BFloat16 Training").

The draw is seeded by the run's seed, the optimizer step and the rank, so a resumed run rounds
exactly as the uninterrupted one would. `model.weight_rounding=nearest` keeps DeepSpeed's own.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

CHUNK = 1 << 22  # elements rounded at a time: bounds the int32 noise buffer to 16 MiB
_HIGH_HALF = 1 if sys.byteorder == "little" else 0  # the int16 half of a float32 bf16 keeps


def round_stochastically(master: torch.Tensor, out: torch.Tensor, seed: int) -> None:
    """`out` (bf16) = `master` (float32) rounded to one of its two bf16 neighbours, the upper
    with probability (master - lower) / (upper - lower): 16 uniform random bits added to the low
    half of the float32 pattern, whose high half is then the bf16 value. Sign-magnitude floats
    make this round the magnitude, so it is unbiased for either sign; inf stays inf and NaN NaN.

    The bits come from numpy's PCG64DXSM seeded by `seed`, four elements per 64-bit draw, in
    element order: on a 2-core CPU torch.randint's one 32-bit Mersenne-twister draw per element
    and the masking and float-to-bf16 passes took twice as long
    (scripts/bench_weight_rounding.py)."""
    flat_master = master.reshape(-1).view(torch.int32)
    flat_out = out.view(-1).view(torch.int16)
    draws = np.random.PCG64DXSM(seed)
    noise_buffer = torch.empty(
        min(CHUNK, flat_master.numel()), dtype=torch.int32, device=out.device
    )
    for start in range(0, flat_master.numel(), CHUNK):
        pattern = flat_master[start : start + CHUNK]
        count = pattern.numel()
        bits = draws.random_raw(-(-count // 4)).view(np.uint16)[:count]
        noise = noise_buffer[:count]
        noise.copy_(torch.from_numpy(bits)).add_(pattern)
        flat_out[start : start + count].copy_(noise.view(torch.int16)[_HIGH_HALF::2])


def _pairs(optimizer: Any) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Any] | None:
    """(this rank's (bf16 partition, float32 master partition) pairs, the all-gather that
    spreads the bf16 partitions to every rank, or None) for DeepSpeed's bf16 optimizers; None for
    an optimizer without a bf16 copy (float32 training) or one whose layout this does not know."""
    from deepspeed import comm as dist

    if hasattr(optimizer, "bf16_partitioned_groups"):  # BF16_Optimizer (tepo's ZeRO-0 and 1)
        lp, hp, flat = "bf16_partitioned_groups", "fp32_groups_flat_partition", "bf16_groups_flat"
    elif hasattr(optimizer, "parallel_partitioned_bit16_groups"):  # ZeRO-1/2
        lp, hp, flat = (
            "parallel_partitioned_bit16_groups",
            "single_partition_of_fp32_groups",
            "bit16_groups_flat",
        )
    elif hasattr(optimizer, "fp16_partitioned_groups_flat"):  # ZeRO-3: no gather, each rank owns
        low_high = (optimizer.fp16_partitioned_groups_flat, optimizer.fp32_partitioned_groups_flat)
        groups = zip(*low_high, strict=True)
        pairs = [(low, high) for low, high in groups if low is not None and low is not high]
        return pairs, None
    else:
        return None
    pairs = []
    groups = zip(getattr(optimizer, lp), getattr(optimizer, hp), strict=True)
    for index, (partitions, master) in enumerate(groups):
        rank = dist.get_rank(group=optimizer.real_dp_process_group[index])
        pairs.append((partitions[rank], master))

    def gather() -> None:
        from deepspeed.runtime.utils import all_gather_dp_groups

        all_gather_dp_groups(
            groups_flat=getattr(optimizer, flat),
            partitioned_param_groups=getattr(optimizer, lp),
            dp_process_group=optimizer.real_dp_process_group,
            start_alignment_factor=optimizer.nccl_start_alignment_factor,
            allgather_bucket_size=optimizer.allgather_bucket_size,
        )

    return pairs, gather


@torch.no_grad()
def round_weights(engine: Any, seed: int) -> None:
    """Rewrite the bf16 weights of `engine` from their float32 masters by stochastic rounding,
    after an optimizer step it took (a step DeepSpeed skipped for a non-finite gradient left the
    masters as they were, and the weights too). `seed`: the run's seed."""
    if getattr(engine.optimizer, "overflow", False):
        return
    found = _pairs(engine.optimizer)
    if found is None:
        return
    pairs, gather = found
    from deepspeed import comm as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    for index, (low, high) in enumerate(pairs):
        draw = _draw_seed(seed, int(engine.global_steps), rank, index)
        round_stochastically(high.data, low.data, draw)
    if gather is not None:
        gather()


def _draw_seed(seed: int, step: int, rank: int, group: int) -> int:
    """One seed per (run seed, optimizer step, rank, parameter group), the same on a resume."""
    mixed = 0
    for part in (seed, step, rank, group):
        mixed = (mixed * 1_000_003 + part) % (2**61 - 1)
    return mixed
