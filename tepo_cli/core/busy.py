"""How many other threads are running on this machine right now: what a command starting beside
other work (runtime/thread_wait.py) and the bf16 probe (models/precision.py) ask before they
decide. Without torch, so that a command can ask before torch loads."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

LOADAVG = Path("/proc/loadavg")  # its 4th field: threads running now / all threads


def others_running(samples: int = 5, interval_s: float = 0.01) -> int | None:
    """How many other threads are running right now, where they hold at least half the machine's
    cores, else None (and None without /proc/loadavg). The median of `samples` reads of its count
    of running threads, less this process's one. Not the load average: that stays high for a
    minute after a job ends, and the next job of a queue would take itself for one beside another."""
    counts = []
    for index in range(samples):
        try:
            running = LOADAVG.read_text().split()[3].split("/")[0]
        except (OSError, IndexError):
            return None
        counts.append(int(running) - 1)
        if index + 1 < samples:
            time.sleep(interval_s)
    others = statistics.median_low(counts)
    return others if others >= max(1, machine_cores() / 2) else None


def machine_cores() -> int:
    return os.cpu_count() or 1
