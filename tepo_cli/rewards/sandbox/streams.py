"""Moving bytes between the parent and a sandboxed process, under a deadline and output caps.

One thread per run multiplexes stdin (written without blocking), stdout, stderr and the
launcher's status pipe with ``selectors``. The loop never waits past the deadline: when it
passes, or when a stream exceeds its cap, ``stop`` is called (which kills the sandbox) and the
loop only keeps draining for a bounded grace period, calling ``stop`` again (escalation) once.
A cap turns a flood of output into a bounded copy, never into unbounded parent memory.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

_CHUNK = 65536
_STATUS_LIMIT = 4096  # the launcher writes one short JSON line


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes now; an empty view when done or the reader is gone."""
    try:
        return pending[os.write(fd, pending[:_CHUNK]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[len(pending) :]


@dataclass
class Capture:
    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> bool:
        """Keep what fits under the limit; True when the limit was exceeded."""
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.data += chunk[: max(room, 0)]
            self.truncated = True
            return True
        self.data += chunk
        return False


@dataclass
class PumpOutcome:
    stdout: Capture
    stderr: Capture
    status: bytes
    timed_out: bool
    output_limit: bool


def pump(
    stdin: IO[bytes] | None,
    stdout: IO[bytes],
    stderr: IO[bytes],
    status_fd: int,
    stdin_data: bytes,
    *,
    deadline: float,
    output_bytes: int,
    grace_s: float,
    stop: Callable[[int], None],
) -> PumpOutcome:
    """Run the exchange until every output stream is closed (or the grace after a stop ends).
    ``stop(n)`` is called with n = 1 when the run must end (timeout or output cap) and n = 2 if
    the streams are still open ``grace_s`` later."""
    out, err = Capture(output_bytes), Capture(output_bytes)
    status = bytearray()
    sinks = {stdout.fileno(): out, stderr.fileno(): err, status_fd: None}
    sel = selectors.DefaultSelector()
    for fd in sinks:
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin_data)
    stdin_fd = _register_stdin(sel, stdin, pending)
    timed_out = output_limit = False
    stops = 0
    next_action = deadline
    try:
        while sinks:
            now = time.monotonic()
            if now >= next_action:
                if stops == 0:
                    timed_out = not output_limit
                if stops >= 2:
                    break  # something still holds the pipes open: stop waiting for it
                stops += 1
                stop(stops)
                next_action = now + grace_s
            for key, _ in sel.select(max(0.0, next_action - time.monotonic())):
                fd = key.fd
                if fd == stdin_fd:
                    pending = _feed(fd, pending)
                    if not pending:
                        sel.unregister(fd)
                        stdin_fd = -1
                        stdin.close()
                    continue
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    sel.unregister(fd)
                    del sinks[fd]
                    continue
                if _keep(sinks[fd], chunk, status) and stops == 0 and not output_limit:
                    output_limit = True
                    next_action = time.monotonic()  # stop on the next iteration
    finally:
        sel.close()
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()
    return PumpOutcome(out, err, bytes(status), timed_out, output_limit)


def _register_stdin(
    sel: selectors.BaseSelector, stdin: IO[bytes] | None, pending: memoryview
) -> int:
    """The program's stdin, non-blocking and watched for writing while there is input to feed
    (its descriptor); closed at once when there is none (-1)."""
    if stdin is None:
        return -1
    if not pending:
        stdin.close()
        return -1
    fd = stdin.fileno()
    os.set_blocking(fd, False)
    sel.register(fd, selectors.EVENT_WRITE)
    return fd


def _keep(sink: Capture | None, chunk: bytes, status: bytearray) -> bool:
    """A chunk read from the program: into its stream's capture (True when that capture has just
    reached the output cap), or, from the status pipe (no capture), into `status`."""
    if sink is None:
        status += chunk[: max(0, _STATUS_LIMIT - len(status))]
        return False
    return bool(sink.add(chunk))
