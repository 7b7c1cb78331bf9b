"""The tepo side: `tepo train OVERRIDES` in this process, with timing probes around the update.

    python -m benchstep.tepo_side TIMINGS.jsonl OVERRIDE...

tepo's metrics.jsonl already has step, rollout, reward, score and update seconds per step. The
probes add the split of the update into forward (loss forward), backward and optimizer, one
JSON line per step in TIMINGS.jsonl; they only wrap calls (a perf_counter each), the loop is
tepo's own. A metric that tepo itself writes (`forward_seconds`, `backward_seconds`,
`optimizer_seconds`) is preferred by the report over the probe's value.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Probe:
    """Seconds spent in wrapped calls during the current step's update."""

    def __init__(self, sink: Path) -> None:
        self.sink = sink
        self.sums: dict[str, float] = {}
        self.engine_wrapped = False

    def add(self, key: str, seconds: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + seconds

    def wrap(self, function: Callable[..., Any], key: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(key, time.perf_counter() - start)

        return timed

    def write_step(self, update_seconds: float) -> None:
        record = {"probe_update_seconds": update_seconds, **self.sums}
        with self.sink.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        self.sums = {}


def install(probe: Probe) -> list[str]:
    """Wrap tepo's update (one call per step), its micro-batch forward+backward, and the engine's
    backward and step. Returns what could not be wrapped (a renamed function: no split then)."""
    from tepo_cli.train import recipe
    from tepo_cli.train import update as update_module

    missing = []
    if hasattr(update_module, "_forward_backward"):
        update_module._forward_backward = probe.wrap(
            update_module._forward_backward, "fwd_bwd_seconds"
        )
    else:
        missing.append("tepo_cli.train.update._forward_backward")
    original_update = recipe.update

    @functools.wraps(original_update)
    def timed_update(cfg: Any, engine: Any, *args: Any, **kwargs: Any) -> Any:
        if not probe.engine_wrapped:
            engine.backward = probe.wrap(engine.backward, "backward_seconds")
            engine.step = probe.wrap(engine.step, "engine_step_seconds")
            probe.engine_wrapped = True
        start = time.perf_counter()
        result = original_update(cfg, engine, *args, **kwargs)
        probe.write_step(time.perf_counter() - start)
        return result

    recipe.update = timed_update
    return missing


def main(argv: list[str]) -> None:
    from benchstep.procs import record_cuda_memory_at_exit

    sink, overrides = Path(argv[0]), argv[1:]
    sink.write_text("")
    record_cuda_memory_at_exit()
    missing = install(Probe(sink))
    for name in missing:
        print(f"bench_step: {name} not found; no forward/optimizer split for tepo", file=sys.stderr)
    from tepo_cli.cli import main as tepo_main

    tepo_main(["train", *overrides])


if __name__ == "__main__":
    main(sys.argv[1:])
