"""What machine a run computes on, in one place: the processor's name (the key of tepo's per-machine
caches: the bf16 probe, the matmul peak), its bf16 matrix instructions, and the description a run
records in `summary.json` (`machines`) and a protocol's journal in each event (`cpu`).

A run's numbers depend on the processor: bf16 matmuls run on AMX tiles on one CPU and on AVX-512
BF16 dot products on another, and round differently, so a run resumed on another machine continues
on other arithmetic. `summary.json` lists each machine the run trained on and the step it
started from there, so such a run says so itself.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo's first `model name`; platform's answer where
    there is no such file)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def bf16_instructions() -> list[str]:
    """The processor's bf16 matrix instructions torch can use (empty: none)."""
    import torch  # here, not above: `tepo report` and the protocol's journal ask only cpu_model

    found = []
    if torch.cpu._is_amx_tile_supported():
        found.append("AMX")
    if torch.cpu._is_avx512_bf16_supported():
        found.append("AVX-512 BF16")
    return found


def describe(device: torch.device) -> dict[str, Any]:
    """The machine one rank computes on: processor, its cores, bf16 instructions, the accelerator
    (None on CPU ranks) and torch's version."""
    import torch

    accelerator = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),  # the machine's, not this rank's share: ranks bind to subsets
        "bf16_instructions": bf16_instructions(),
        "accelerator": accelerator,
        "torch": torch.__version__,
    }


def note_machine(
    summary: dict[str, Any], machine: dict[str, Any], step: int
) -> dict[str, Any] | None:
    """Add `machine` to `summary["machines"]` with the step its training starts after (0: the
    run's start), unless the run's last machine is the same one (a resume where it stopped).
    Returns that last machine when the run now continues on another (None otherwise)."""
    machines = summary.setdefault("machines", [])
    last = {k: v for k, v in machines[-1].items() if k != "from_step"} if machines else None
    if last == machine:
        return None
    machines.append({**machine, "from_step": step})
    return last


def moved_warning(previous: dict[str, Any], machine: dict[str, Any], step: int) -> str:
    """What a run resumed on another machine tells its user: the arithmetic changed at `step`."""
    where = [
        f"{key} {previous.get(key)} -> {machine.get(key)}"
        for key in machine
        if previous.get(key) != machine.get(key)
    ]
    return (
        f"this run continues after step {step} on another machine or torch than it trained on ("
        + "; ".join(where)
        + "): from here its numbers come from that machine's arithmetic (bf16, for one, rounds "
        "differently on AMX than on AVX-512 BF16), so it equals an uninterrupted run only up to "
        f"step {step}. summary.json's `machines` records the change."
    )
