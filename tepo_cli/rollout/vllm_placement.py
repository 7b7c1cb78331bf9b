"""Where each rank's colocated vLLM engine runs: the trainer's rank and local device
(`Placement`), the launcher variables vLLM's `external_launcher` reads while the engine starts,
and the check that the engine landed on the rank's own GPU (vllm_engine.py starts it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tepo_cli.core.errors import RunError


@dataclass(frozen=True)
class Placement:
    """Where a rank's engine runs: the trainer's rank in its process group and the local device
    index the engine must use (the rank's current CUDA device, which runtime/distributed.py set to
    the policy's; the launcher's LOCAL_RANK on CPU)."""

    rank: int
    local_rank: int


def trainer_placement() -> Placement | None:
    """This process's place in the trainer's process group; None outside one (`tepo eval`, or a
    model loaded by hand), where vLLM's own single-process executor is the right one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if torch.cuda.is_available():
        local_rank = torch.cuda.current_device()
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return Placement(dist.get_rank(), local_rank)


@contextlib.contextmanager
def rank_environment(placement: Placement | None) -> Iterator[None]:
    """RANK and LOCAL_RANK as the external launcher reads them, the trainer's own for the time
    the engine starts: a launcher that gives each rank one visible GPU, or a one-process run
    whose variables were already forgotten (a sweep's second job), would otherwise point vLLM at
    another rank or device."""
    if placement is None:
        yield
        return
    wanted = {"RANK": str(placement.rank), "LOCAL_RANK": str(placement.local_rank)}
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_device(engine: Any, device: torch.device) -> None:
    """Refuse an engine that landed on another GPU than its rank's (its weights would sit on
    another rank's device): one paragraph now instead of device errors or an out-of-memory in
    the first step."""
    worker = getattr(getattr(engine.llm_engine, "model_executor", None), "driver_worker", None)
    engine_device = getattr(getattr(worker, "worker", None), "device", None)
    if engine_device is not None and torch.device(engine_device) != device:
        raise RunError(
            f"rollout=vllm: this rank's vLLM engine started on {engine_device}, but the rank "
            f"trains on {device}. Every rank's engine must use the rank's own GPU; check that "
            f"CUDA_VISIBLE_DEVICES is the same for every rank of a node and that the launcher "
            f"sets LOCAL_RANK."
        )
