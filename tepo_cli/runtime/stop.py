"""Graceful stop: SIGINT or SIGTERM lets the current step finish, then the loop checkpoints and exits.

A second SIGINT aborts at once (KeyboardInterrupt), for a user who does not want to wait; a
second SIGTERM ends the process at once (a launcher's or a scheduler's "now").

Python runs a signal handler only between bytecodes of the main thread, so a rank blocked in a
collective (C++ waiting for a rank that never comes) would never even see the signal: the flag is
not set, the step never finishes, and the process ignores SIGTERM until the collective's timeout.
A watcher thread learns of every signal at once (the interpreter's wakeup file descriptor is
written from the C-level handler, whatever the main thread is doing); when the handler has not run
`STUCK_GRACE_S` seconds later, the main thread is stuck in native code, and the watcher ends the
process with 128 + the signal number.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Any

import torch

from tepo_cli.core import collective

STUCK_GRACE_S = 10.0  # how long a signal may wait for its handler before the process ends
_STOP = (signal.SIGINT, signal.SIGTERM)
TIME_UP = 1024  # above every signal number, so the agreement's maximum says which stop it was


class StopSignals:
    def __init__(self, stuck_grace_s: float = STUCK_GRACE_S) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}
        self._watcher: _Watcher | None = None
        self._grace = stuck_grace_s
        self.handled = 0  # stop signals whose handler ran

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP:
                self._previous[signum] = signal.signal(signum, self._handle)
            self._watcher = _Watcher(self, self._grace)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.handled += 1
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum and signum == signal.SIGTERM:
            _exit_now(signum, "a second one: stop now")
        self.signum = signum

    def requested(self, device: torch.device, time_up: bool = False) -> int:
        """The signal any rank received, TIME_UP where a rank's time limit would pass first
        (runtime/time_limit.py), else 0: all ranks stop after the same step."""
        flag = torch.tensor([TIME_UP if time_up else self.signum], dtype=torch.int64, device=device)
        return int(collective.all_max(flag).item())


class _Watcher:
    """The thread that ends the process when a stop signal's handler cannot run."""

    def __init__(self, signals: StopSignals, grace: float) -> None:
        self._signals = signals
        self._grace = grace
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="tepo-stop-watcher", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        arrived = 0
        while data := self._reader.recv(64):
            for signum in data:
                if signum not in _STOP:
                    continue
                arrived += 1
                deadline = time.monotonic() + self._grace
                while self._signals.handled < arrived and time.monotonic() < deadline:
                    time.sleep(0.05)
                if self._signals.handled < arrived:
                    _exit_now(
                        signum,
                        f"its handler could not run for {self._grace:g} s: the main thread is "
                        f"blocked, e.g. in a collective waiting for another rank",
                    )

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        self._writer.close()  # the thread's recv returns b"" and it ends
        self._thread.join(timeout=1.0)
        self._reader.close()


def _exit_now(signum: int, why: str) -> None:
    name = signal.Signals(signum).name
    rank = os.environ.get("RANK", "0")
    print(
        f"tepo train: rank {rank} ends at once on {name} ({why}); no checkpoint is written.",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(128 + signum)
