"""`trainer.device`: which kind of device the ranks train on, decided once at start-up.

`auto` takes CUDA when torch can use it and says so, or says loudly why not: a CUDA torch on an
old driver would otherwise train silently on CPU ranks in float32. `cuda` refuses to start
without a usable GPU; `cpu` trains on the CPU even on a GPU machine.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Literal

import torch

from tepo_cli.core.errors import ConfigError

DeviceType = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class DeviceChoice:
    type: DeviceType
    reason: str  # one line: what was asked, what was found, what follows

    @property
    def uses_cuda(self) -> bool:
        return self.type == "cuda"


def cuda_problem() -> str | None:
    """Why torch cannot use a GPU here (with torch's own hint when it gives one), or None."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA"
    hints = [str(w.message).strip() for w in caught if "CUDA" in str(w.message)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    hint = f": {hints[0]}" if hints else " (no GPU visible, or the NVIDIA driver is missing)"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU{shown}{hint}"


def choose_device(requested: str) -> DeviceChoice:
    """Resolve `trainer.device`; ConfigError for `cuda` without a usable GPU."""
    problem = cuda_problem() if requested in ("auto", "cuda") else None
    if requested == "cuda":
        if problem is not None:
            raise ConfigError(
                f"trainer.device=cuda, but {problem}. Install a torch built for this machine's "
                f"CUDA driver (see `nvidia-smi` and pytorch.org's install selector), make the "
                f"GPUs visible, or train on the CPU with trainer.device=cpu (or auto)."
            )
        return DeviceChoice("cuda", f"trainer.device=cuda: {torch.cuda.device_count()} GPU(s)")
    if requested == "cpu":
        return DeviceChoice("cpu", "trainer.device=cpu: training on CPU ranks with gloo")
    if problem is None:
        return DeviceChoice(
            "cuda",
            f"trainer.device=auto: CUDA is usable ({torch.cuda.device_count()} GPU(s)); "
            f"training on GPU ranks with NCCL",
        )
    return DeviceChoice(
        "cpu",
        f"trainer.device=auto: no usable CUDA device ({problem}); training on CPU ranks with "
        f"gloo in the model's dtype (set trainer.device=cuda to refuse instead)",
    )


def apply_device_choice(choice: DeviceChoice) -> None:
    """Make DeepSpeed (here and in the ranks a launcher starts) use the same kind of device:
    without DS_ACCELERATOR it picks CUDA whenever torch sees a GPU, even for trainer.device=cpu."""
    if choice.type == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
