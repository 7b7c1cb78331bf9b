"""Wall-clock seconds per phase of a step, summed when a phase runs more than once (DAPO refills),
and the process's CPU seconds over the step: every thread's, vLLM's in-process engine's too. Other
jobs on the machine stretch both, the CPU seconds less (docs/guides/performance.md, "Throughput
and MFU in every step")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from tepo_cli.runtime import collective_timeout


class StepClock:
    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.cpu_began = time.process_time()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with collective_timeout.phase(phase):
                yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def elapsed(self) -> float:
        """Seconds since the step began."""
        return time.perf_counter() - self.began

    def cpu_elapsed(self) -> float:
        """CPU seconds of this process (all its threads) since the step began."""
        return time.process_time() - self.cpu_began
