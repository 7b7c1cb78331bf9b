"""`TEPO_CHECK_DEVICES=1`: record every torch tensor factory that tepo's own code calls without
naming its device, and fail the process at its end with the list.

No GPU is at hand to catch a tensor left on the CPU while the step's tensors are on CUDA (the first
`torch.stack` of the two fails there, not here), so the rule is structural (docs/design.md, "Devices and
precision"): every factory call in `tepo_cli` says `device=...` — `device="cpu"` where a host
tensor is meant. This check proves the rule on a CPU run. It is a torch function mode: torch hands
it every call, it looks at the factories only, and at the frame that called them — calls from
torch, transformers, DeepSpeed or vLLM are theirs, not checked. `*_like` and `Tensor.new_*`
inherit their source's device and are not factories here.

The calls are recorded, not raised: a raise on one rank only would leave the others waiting in a
collective, and one run lists every site. `tepo` (cli.py) installs the check at start when the
variable is `1`, so every subprocess and every rank of `trainer.nproc=N` checks itself, and exits
non-zero at the end when anything was recorded. Off (the default), nothing is installed: no cost.
The mode is torch's per-thread mode stack: code on other threads (none of tepo's) is not seen.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

ENV = "TEPO_CHECK_DEVICES"  # "1": install the check for the whole process (cli.main)
EXIT_CODE = 3  # the process's exit status when calls were recorded and it would have exited 0
PACKAGE = "tepo_cli"

# Factories that create a tensor from nothing (or from Python data) on the default device when no
# device is named. `from_numpy` has no device argument (always the host) and is not listed.
FACTORIES = frozenset(
    {
        torch.tensor,
        torch.as_tensor,
        torch.scalar_tensor,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.empty,
        torch.empty_strided,
        torch.arange,
        torch.eye,
        torch.linspace,
        torch.logspace,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.tril_indices,
        torch.triu_indices,
    }
)
_NOT_CALLERS = ("torch/overrides.py",)  # torch's own dispatch frames between a caller and the mode


@dataclass(frozen=True)
class Violation:
    """One call site: where (`file:line`, path from the package) and which factory."""

    where: str
    factory: str

    def __str__(self) -> str:
        return f"{self.where}: torch.{self.factory}(...) without device="


class DeviceCheck(TorchFunctionMode):
    """Records tepo_cli's factory calls without `device=` (also `device=None`) in `violations`."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: set[Violation] = set()

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            frame = _caller(sys._getframe(1))
            if frame is not None and _is_ours(frame):
                self.violations.add(Violation(_where(frame), func.__name__))
        return func(*args, **kwargs)


def _caller(frame: FrameType | None) -> FrameType | None:
    while frame is not None and frame.f_code.co_filename.endswith(_NOT_CALLERS):
        frame = frame.f_back
    return frame


def _is_ours(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _where(frame: FrameType) -> str:
    path = frame.f_code.co_filename.replace(os.sep, "/")
    marker = f"/{PACKAGE}/"
    shown = PACKAGE + "/" + path.rsplit(marker, 1)[1] if marker in path else path
    return f"{shown}:{frame.f_lineno}"


_INSTALLED: list[DeviceCheck] = []


def install_from_env() -> DeviceCheck | None:
    """Enter the check for the rest of the process when `TEPO_CHECK_DEVICES=1` (once)."""
    if os.environ.get(ENV) != "1":
        return None
    if not _INSTALLED:
        check = DeviceCheck()
        check.__enter__()
        _INSTALLED.append(check)
    return _INSTALLED[0]


def _order(violation: Violation) -> tuple[str, int]:
    path, _, line = violation.where.rpartition(":")
    return path, int(line)


def report(stream: Any = None) -> int:
    """Print the recorded calls (one line each) and return how many there were; 0 when the check
    is off or found nothing."""
    found = sorted(_INSTALLED[0].violations, key=_order) if _INSTALLED else []
    if found:
        out = stream or sys.stderr
        print(
            f"tepo: {ENV}=1 found {len(found)} tensor factory call(s) in tepo_cli that name no "
            f"device; each must say device=... (device='cpu' for a host tensor):",
            file=out,
        )
        for violation in found:
            print(f"  {violation}", file=out)
        out.flush()
    return len(found)
