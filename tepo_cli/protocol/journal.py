"""RESULTS_DIR/journal.jsonl: one line per run event of a pre-registered experiment.

The results page quotes it for what the records alone do not show: when each run started, that it
resumed after step N (and at which commit, on which processor: `cpu`), that it crashed with which
exit code, whether the machine was shared while it trained (the other processes' CPU use slows
a run several-fold on a small CPU, which shows up in its timings, not in its metrics) and how
long it was paused to give the machine to other work (which delays it and changes nothing else).
Append-only: an earlier line is never rewritten, so the journal is the experiment's history, interruptions
included.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import psutil

import tepo_cli
from tepo_cli.core.machine import cpu_model

JOURNAL = "journal.jsonl"
TRY_BEGINS = ("start", "resume")  # the events that begin a try of a run
EXPERIMENT = "*"  # the run name of a line about the whole experiment


@dataclass(frozen=True)
class Checkout:
    """The code that runs the experiment: its commit and whether tracked files differ from it."""

    commit: str | None  # None: not a git checkout (an installed wheel)
    dirty: bool


def code_checkout() -> Checkout:
    """`git rev-parse HEAD` of the checkout tepo_cli is imported from: the code that trains, which
    need not be the working directory's (a `git worktree` pinned at the protocol's commit)."""
    where = Path(tepo_cli.__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return Checkout(None, False)
    return Checkout(head, bool(changed))


def read_entries(path: Path) -> list[dict[str, Any]]:
    """The journal's lines, oldest first ([] where there is no journal)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tries_by_run(entries: list[dict[str, Any]]) -> Counter[str]:
    """How many times each run started or resumed, by the journal's lines."""
    return Counter(str(e.get("run")) for e in entries if e["event"] in TRY_BEGINS)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Journal:
    def __init__(self, results_dir: Path, checkout: Checkout, protocol_sha256: str) -> None:
        self.path = results_dir / JOURNAL
        self.checkout = checkout
        self.protocol_sha256 = protocol_sha256

    def entries(self) -> list[dict[str, Any]]:
        return read_entries(self.path)

    def write(self, run: str, event: str, **details: Any) -> dict[str, Any]:
        record = {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "run": run,
            "event": event,
            **details,
            "commit": self.checkout.commit,
            "dirty": self.checkout.dirty,
            "host": socket.gethostname(),
            "cpu": cpu_model(),
            "protocol_sha256": self.protocol_sha256,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        return record


class Sample(NamedTuple):
    wall: float  # time.monotonic()
    busy: float  # the machine's busy CPU seconds
    own: float  # this process's waited-for children's CPU seconds


def _sample() -> Sample:
    return Sample(time.monotonic(), _busy_seconds(), _children_seconds())


class CpuShare:
    """How many cores other processes kept busy while one run trained, and how long it was paused.

    The machine's busy CPU time (psutil) minus this process's children's (os.times(): the run's
    `tepo train` and every process it waited for), over the run's wall time. Measured, not
    inferred from the load average, which still carries the previous run's tail at a run's start.

    A run paused with SIGSTOP (its session stopped to give the machine to other work) is not
    sharing the machine: its steps compute nothing meanwhile. A thread samples the clocks every
    `tick` seconds; a gap over `pause_gap` between two samples means this process was stopped
    too, and that span's wall and busy time are counted as paused, not as sharing.
    """

    def __init__(self, tick: float = 1.0, pause_gap: float = 5.0) -> None:
        self.cpus = os.cpu_count() or 1
        self._start = self._last = _sample()
        self._paused = Sample(0.0, 0.0, 0.0)  # the wall, busy and own seconds inside pauses
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._gap = pause_gap
        watcher = threading.Thread(target=self._watch, args=(tick,), daemon=True)
        watcher.start()

    def _watch(self, tick: float) -> None:
        while not self._done.wait(tick):
            self._take(_sample())

    def _take(self, now: Sample) -> None:
        """Count the span since the last sample as paused when it is longer than the gap."""
        with self._lock:
            if now.wall - self._last.wall > self._gap:
                spent = [n - last for n, last in zip(now, self._last, strict=True)]
                self._paused = Sample(*(p + d for p, d in zip(self._paused, spent, strict=True)))
            self._last = now

    @property
    def paused(self) -> Sample:
        """The wall, machine-busy and own CPU seconds inside the pauses so far."""
        with self._lock:
            return self._paused

    @property
    def paused_seconds(self) -> float:
        return round(self.paused.wall, 1)

    def others(self) -> float:
        """Average cores used by other processes since the start, outside the pauses (0 when the
        run had the CPU). Ends the sampling."""
        self._done.set()
        now = _sample()
        self._take(now)
        with self._lock:
            left = [n - s - p for n, s, p in zip(now, self._start, self._paused, strict=True)]
        return others_cores(busy=left[1], own=left[2], wall=left[0])


def others_cores(busy: float, own: float, wall: float) -> float:
    """Cores busy with other processes: the machine's busy CPU seconds less the run's own, per
    second of wall time; never negative (the two clocks tick at slightly different moments)."""
    if wall <= 0:
        return 0.0
    return round(max(busy - own, 0.0) / wall, 2)


def _busy_seconds() -> float:
    times = psutil.cpu_times()  # guest time is already inside user time on Linux: not added
    fields = ("user", "nice", "system", "irq", "softirq", "steal")
    return sum(getattr(times, field, 0.0) for field in fields)


def _children_seconds() -> float:
    times = os.times()
    return times.children_user + times.children_system
