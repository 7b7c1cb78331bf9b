"""Where a tensor must live to enter a collective of the default process group."""

from __future__ import annotations

import torch
import torch.distributed as dist


def collective_device() -> torch.device:
    """The current CUDA device under NCCL (it refuses host tensors), the host otherwise (gloo,
    or no group at all)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
