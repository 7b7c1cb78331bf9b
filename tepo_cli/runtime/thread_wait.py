"""How long torch's idle CPU threads spin before they sleep: chosen once, before torch loads,
from how busy the machine is when a command starts.

torch runs an operation on its pool of threads (GNU OpenMP), and a thread that has finished its
part spins up to `GOMP_SPINCOUNT` times (300,000 by default) waiting for the others before it
sleeps. Alone on a machine that is the fastest wait. Beside another job it can be the slowest: the
spinning thread holds a core that a thread it waits for needs, so an operation lasts a scheduler
time slice instead of microseconds, and two jobs on one CPU each run many times slower than half
their speed (docs/guides/performance.md, "Two jobs on one CPU", has the figures).

So a command that starts while other threads hold at least half the cores sets 1,000 spins; on an
idle machine nothing changes. A `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY` the user set always wins.
Only how threads wait changes, never what they compute: a run's numbers are the same either way.
The choice travels in the environment, read by torch's OpenMP when it loads: to the process's
re-exec on its allocator, to its ranks and to vLLM's workers. `TEPO_BUSY_THREADS` carries what
decided it to the start line, which the job prints once its config is accepted (a refused
command says its paragraph only).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import MutableMapping
from pathlib import Path

BUSY_SPINCOUNT = "1000"
LOADAVG = Path("/proc/loadavg")  # its 4th field: threads running now / all threads
_BUSY = "TEPO_BUSY_THREADS"


def busy_threads(samples: int = 5, interval_s: float = 0.01) -> int | None:
    """How many other threads are running right now, where they hold at least half the machine's
    cores and this process may use more than one (a pool of one thread waits for no other), else
    None; None without /proc/loadavg too. The median of `samples` reads of its count of running
    threads, less this process's one. Not the load average: that stays high for a minute after a
    job ends, and the next job of a queue would take itself for one on a busy machine."""
    if _usable_cores() < 2:
        return None
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
    return others if others >= max(1, _machine_cores() / 2) else None


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else _machine_cores()


def _machine_cores() -> int:
    return os.cpu_count() or 1


def settle(environ: MutableMapping[str, str], busy: int | None, torch_loaded: bool) -> None:
    """Set `GOMP_SPINCOUNT` in `environ` for a busy machine (`busy` is `busy_threads()`'s
    answer), unless the user chose how threads wait or torch has loaded (its OpenMP read the
    variables already: a caller of `main` that imported torch first)."""
    chosen = "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ
    if busy is None or chosen or torch_loaded:
        return
    environ["GOMP_SPINCOUNT"] = BUSY_SPINCOUNT
    environ[_BUSY] = str(busy)


def start_line(environ: MutableMapping[str, str]) -> str | None:
    """The start line of a command whose threads spin less because the machine was busy."""
    busy = environ.get(_BUSY)
    if busy is None or environ.get("GOMP_SPINCOUNT") != BUSY_SPINCOUNT:
        return None
    return (
        f"the machine is busy ({busy} other threads running on its {_machine_cores()} cores): torch's "
        f"idle threads spin {int(BUSY_SPINCOUNT):,} times before they sleep, not OpenMP's "
        "300,000, so that they do not hold cores another job's threads wait for "
        "(GOMP_SPINCOUNT sets it; the numbers are the same either way)"
    )
