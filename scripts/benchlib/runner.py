"""One runner for the benchmarks: each measured thing in a child process of its own (its exit
code, wall time and peak RSS), a callable timed best-of-N after a warm-up, a child's JSON result,
a run directory's step records. One copy, so every benchmark measures the same way."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

SCRIPTS = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    wall_seconds: float
    peak_rss_bytes: int  # ru_maxrss of that child (Linux reports KiB)
    log: Path
    cpu_seconds: float = 0.0  # the child's user + system time (what it took from the machine)


def _start_logged(
    command: list[str], handle: IO[str], env: dict[str, str] | None, **popen: Any
) -> subprocess.Popen:
    """`command` started with its command line, then its stdout and stderr, in `handle`."""
    handle.write("$ " + " ".join(command) + "\n")
    handle.flush()
    return subprocess.Popen(
        command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, **popen
    )


def run_child(
    command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> ChildResult:
    """Run `command` with stdout and stderr in `log`; measure it with wait4 (that child only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        process = _start_logged(command, handle, env, cwd=cwd)
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
        cpu_seconds=usage.ru_utime + usage.ru_stime,
    )


def log_tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


CUDA_MEMORY_ENV = "BENCH_CUDA_MEMORY"


def child_env(threads: int, device: str, cuda_memory: Path | None = None) -> dict[str, str]:
    """A measured child's environment: scripts/ importable (its benchstep side modules), the same
    CPU thread count for every child (torch reads these at start-up), no GPU on a CPU job, and on
    a GPU where to write its peak CUDA memory (record_cuda_memory_at_exit)."""
    path = os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))
    value = str(threads)
    env = {"PYTHONPATH": path, "OMP_NUM_THREADS": value, "MKL_NUM_THREADS": value}
    env["TOKENIZERS_PARALLELISM"] = "false"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif cuda_memory is not None:
        env[CUDA_MEMORY_ENV] = str(cuda_memory)
    return env


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


@dataclass(frozen=True)
class WatchedResult:
    """A child run under a memory limit: `oom` when the watcher killed it at the limit."""

    returncode: int
    wall_seconds: float
    peak_rss_bytes: int  # the largest RSS of the child's process tree, summed, as sampled
    ru_maxrss_bytes: int  # wait4's ru_maxrss: the largest single process's peak
    oom: bool
    log: Path


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and all its descendants (vLLM's engine runs in a child process)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pages = int((entry / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        parents[int(entry.name)] = int(fields[1])
        rss[int(entry.name)] = pages * os.sysconf("SC_PAGE_SIZE")
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(rss.get(pid, 0) for pid in tree)


def run_watched(
    command: list[str],
    log: Path,
    env: dict[str, str] | None,
    limit_bytes: int,
    interval_s: float = 0.25,
) -> WatchedResult:
    """Run `command` in its own session; a watcher thread samples its process tree's RSS and kills
    the whole session (SIGKILL) once it passes `limit_bytes`, as an out-of-memory killer would, so
    one side cannot take the machine down. RLIMIT_AS is not used: torch and vLLM reserve far more
    address space than they touch."""
    import signal
    import threading

    log.parent.mkdir(parents=True, exist_ok=True)
    peak = [0]
    killed = threading.Event()
    done = threading.Event()
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        process = _start_logged(command, handle, env, start_new_session=True)

        def watch() -> None:
            while not done.wait(interval_s):
                rss = tree_rss_bytes(process.pid)
                peak[0] = max(peak[0], rss)
                if rss > limit_bytes and not killed.is_set():
                    killed.set()
                    os.killpg(process.pid, signal.SIGKILL)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:  # Ctrl-C, or SIGTERM (exit_on_sigterm): the child's session too
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        finally:
            done.set()
            watcher.join()
        _reap_session(process.pid)
        process.returncode = os.waitstatus_to_exitcode(status)
        if killed.is_set():
            handle.write(f"\nbench_step: killed at the memory limit ({limit_bytes / 1e9:.1f} GB)\n")
    return WatchedResult(
        returncode=process.returncode,
        wall_seconds=time.perf_counter() - start,
        peak_rss_bytes=max(peak[0], usage.ru_maxrss * 1024),
        ru_maxrss_bytes=usage.ru_maxrss * 1024,
        oom=killed.is_set(),
        log=log,
    )


def _reap_session(session: int) -> None:
    """Kill what the child left behind in its session (an engine process orphaned by a crash)."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(session, signal.SIGKILL)


def exit_on_sigterm() -> None:
    """SIGTERM (`timeout`, a scheduler) raises SystemExit, so a watched child's session is killed
    on the way out instead of living on in its own session."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def best_seconds(
    function: Callable[[], object],
    repeats: int,
    warmup: int = 0,
    sync: Callable[[], object] | None = None,
) -> float:
    """The fastest of `repeats` timed calls after `warmup` untimed ones: the best call is the one
    least disturbed by the rest of a shared machine. `sync` (torch.cuda.synchronize) waits for a
    device's queued work on both sides of each timed call."""
    for _ in range(warmup):
        function()
    best = float("inf")
    for _ in range(repeats):
        if sync:
            sync()
        start = time.perf_counter()
        function()
        if sync:
            sync()
        best = min(best, time.perf_counter() - start)
    return best


def child_json(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a measuring child (its own peak RSS, its own allocator) and read the JSON line it
    printed last; a failed child stops the benchmark with its output."""
    child = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        sys.exit(
            f"{Path(command[1]).name}: {' '.join(command[2:])} failed (exit {child.returncode}):"
            f"\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's records; none when the run wrote none."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parse_timed_steps(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`p`'s arguments with `--steps` (per run; the first, which holds the start-up, is left out
    of the timings, so at least 2) and `--smoke` (CI: 2 steps), both added here."""
    p.add_argument("--steps", type=int, default=4, help="steps per run (the first is left out)")
    p.add_argument("--smoke", action="store_true", help="model=tiny, rollout=hf, 2 steps (CI)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps = 2
    if args.steps < 2:
        p.error("--steps must be at least 2: the first step of each run is left out")
    return args


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """A tepo run's per-step records (metrics.jsonl rows with a step), in order."""
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "step" in r]


class CallTimes:
    """Seconds spent in wrapped calls, summed per key until the step's record takes them: how a
    trainer's own functions are timed from outside it (tepo's update, TRL's trainer methods)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + seconds

    def timed(self, function: Callable[..., Any], key: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(key, time.perf_counter() - start)
                self.ended(key)

        return timed

    def ended(self, key: str) -> None:
        """Called as each timed call returns (a subclass keeps when a step's part ended)."""
