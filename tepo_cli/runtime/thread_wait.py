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

from collections.abc import MutableMapping

from tepo_cli.config.launcher import available_cores
from tepo_cli.core import busy

BUSY_SPINCOUNT = "1000"
_BUSY = "TEPO_BUSY_THREADS"


def busy_threads() -> int | None:
    """`core/busy.py`'s `others_running()` where this process may use more than one core (a pool of one thread
    waits for no other), else None."""
    return busy.others_running() if available_cores() > 1 else None


def settle(environ: MutableMapping[str, str], others: int | None, torch_loaded: bool) -> None:
    """Set `GOMP_SPINCOUNT` in `environ` for a busy machine (`others` is `busy_threads()`'s
    answer), unless the user chose how threads wait or torch has loaded (its OpenMP read the
    variables already: a caller of `main` that imported torch first)."""
    chosen = "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ
    if others is None or chosen or torch_loaded:
        return
    environ["GOMP_SPINCOUNT"] = BUSY_SPINCOUNT
    environ[_BUSY] = str(others)


def start_line(environ: MutableMapping[str, str]) -> str | None:
    """The start line of a command whose threads spin less because the machine was busy."""
    others = environ.get(_BUSY)
    if others is None or environ.get("GOMP_SPINCOUNT") != BUSY_SPINCOUNT:
        return None
    return (
        f"the machine is busy ({others} other threads running on its {busy.machine_cores()} "
        f"cores): torch's idle threads spin {int(BUSY_SPINCOUNT):,} times before they sleep, not "
        "OpenMP's 300,000, so that they do not hold cores another job's threads wait for "
        "(GOMP_SPINCOUNT sets it; the numbers are the same either way)"
    )
