"""Every collective tepo enters, in one place: sums, maxima, minima, "did any / every rank",
objects from rank 0 or from all, and the barrier.

Each is a no-op on one rank (no process group, or a group of one), so callers never ask
`dist.is_initialized()` themselves, and each puts its tensor where the group's back-end wants it
(the current CUDA device under NCCL, the host under gloo). Every collective waits at most the
group's timeout, `trainer.collective_timeout_s` (runtime/collective_timeout.py turns a timeout into one
paragraph naming the rank and its phase). Every rank must enter each of them the same number of
times, in the same order: a collective behind a rank-dependent branch is a deadlock.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def world_size() -> int:
    """The ranks of the default group; 1 without one."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def multi_rank() -> bool:
    return world_size() > 1


def collective_device() -> torch.device:
    """The current CUDA device under NCCL (it refuses host tensors), the host otherwise (gloo,
    or no group at all)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce(values: torch.Tensor, op: Literal["sum", "max", "min"]) -> torch.Tensor:
    """`values` reduced element-wise over the ranks, on the group's device (`values` itself on
    one rank)."""
    if not multi_rank():
        return values
    result = values.to(collective_device())
    dist.all_reduce(result, op=_OPS[op])
    return result


def all_sum(values: torch.Tensor) -> torch.Tensor:
    return reduce(values, "sum")


def all_max(values: torch.Tensor) -> torch.Tensor:
    return reduce(values, "max")


def all_min(values: torch.Tensor) -> torch.Tensor:
    return reduce(values, "min")


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on any rank."""
    return bool(all_max(torch.tensor([int(flag)], dtype=torch.int64, device="cpu")).item())


def every_rank(flag: bool) -> bool:
    """Whether `flag` holds on every rank."""
    return bool(all_min(torch.tensor([int(flag)], dtype=torch.int64, device="cpu")).item())


def from_rank0(value: T) -> T:
    """Rank 0's `value` (any picklable object) on every rank."""
    if not multi_rank():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def from_every_rank(value: T) -> list[T]:
    """Each rank's `value`, in rank order, on every rank."""
    if not multi_rank():
        return [value]
    values: list[Any] = [None] * world_size()
    dist.all_gather_object(values, value)
    return values


def tensors_from_rank0(tensors: list[torch.Tensor]) -> None:
    """Overwrite each tensor, in place, with rank 0's (they live on the group's device)."""
    if not multi_rank():
        return
    for tensor in tensors:
        dist.broadcast(tensor, src=0)


def barrier() -> None:
    if multi_rank():
        dist.barrier()
