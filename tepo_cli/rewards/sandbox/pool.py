"""Running many programs concurrently.

Each worker thread only starts a subprocess and waits on its pipes, so threads are enough (the
GIL is released while waiting) and nothing is forked from a multi-threaded parent with Python
code running in between (``subprocess`` without ``preexec_fn`` does the fork/exec in C).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tepo_cli.rewards.sandbox.result import SandboxResult
from tepo_cli.rewards.sandbox.runner import run_program
from tepo_cli.rewards.sandbox.sandbox_config import SandboxConfig


@dataclass(frozen=True)
class Program:
    """One program to run: its source, its stdin, and an optional success marker."""

    source: str
    stdin: str | bytes = b""
    success_marker: str | None = None


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def run_many(
    programs: Iterable[Program | str],
    *,
    max_workers: int | None = None,
    config: SandboxConfig | None = None,
) -> list[SandboxResult]:
    """Run `programs` concurrently; results are in the same order as `programs`."""
    items = [p if isinstance(p, Program) else Program(p) for p in programs]
    if not items:
        return []
    config = config or SandboxConfig()
    workers = max(1, min(max_workers or default_workers(), len(items)))

    def one(program: Program) -> SandboxResult:
        return run_program(
            program.source,
            program.stdin,
            config=config,
            success_marker=program.success_marker,
        )

    if workers == 1:
        return [one(p) for p in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tepo-sandbox") as pool:
        return list(pool.map(one, items))
