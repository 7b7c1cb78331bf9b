"""Each trainer runs in a child process of its own: its exit code, wall time and peak RSS."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    wall_seconds: float
    peak_rss_bytes: int  # ru_maxrss of that child (Linux reports KiB)
    log: Path


def run_child(command: list[str], log: Path, env: dict[str, str] | None = None) -> ChildResult:
    """Run `command` with stdout and stderr in `log`; measure it with wait4 (that child only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except KeyboardInterrupt:
            process.terminate()
            process.wait()
            raise
        process.returncode = os.waitstatus_to_exitcode(status)
    return ChildResult(
        returncode=process.returncode,
        wall_seconds=time.perf_counter() - start,
        peak_rss_bytes=usage.ru_maxrss * 1024,
        log=log,
    )


def log_tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


def thread_env(threads: int) -> dict[str, str]:
    """The same CPU thread count for every child (torch reads these at start-up)."""
    value = str(threads)
    return {"OMP_NUM_THREADS": value, "MKL_NUM_THREADS": value, "TOKENIZERS_PARALLELISM": "false"}


CUDA_MEMORY_ENV = "BENCH_CUDA_MEMORY"


def record_cuda_memory_at_exit() -> None:
    """In a trainer process on a GPU: write its peak CUDA memory to $BENCH_CUDA_MEMORY at exit
    (RSS says little about a GPU run)."""
    path = os.environ.get(CUDA_MEMORY_ENV)
    if not path:
        return

    def write() -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak = {
                "max_allocated_bytes": torch.cuda.max_memory_allocated(),
                "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            }
            Path(path).write_text(json.dumps(peak) + "\n")

    atexit.register(write)


def python_module(python: str, module: str, *args: str) -> list[str]:
    return [python or sys.executable, "-m", module, *args]
