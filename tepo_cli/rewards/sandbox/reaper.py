"""Last line of process containment: kill every process of a run's private uid.

When the parent is root, each run has a uid no other process on the machine uses
(``identity.py``), so "every process whose real, effective, saved or file-system uid is U" is
exactly "every process this run created", wherever it went: another session, another process
group, re-parented to init. After the run, the runner kills them all and waits until none is
left, so when ``run_program`` returns no process of that run is alive, at either level.

``signal_children`` serves the strong level's timeout: it signals the namespace's PID 1 (the
launcher's supervisor, child of bubblewrap) rather than bubblewrap itself, so the supervisor
kills and reaps its namespace, bubblewrap reaps it, and no zombie is left to the host's init.

Signals go through pidfds (``pidfd_open`` + ``pidfd_send_signal``): the uid is checked after the
pidfd is opened, so a pid recycled by an unrelated process between the scan and the kill can
never be signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _uids(pid: str) -> set[int]:
    """The user ids of a live process; empty for a zombie (it is dead and waits only for its
    parent, possibly a slow init, to collect its status; it can run nothing)."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                return set()
            if line.startswith("Uid:"):
                return {int(v) for v in line.split()[1:]}
    return set()


def processes_of(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes with `uid` as any of their user ids."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if uid in _uids(name):
                    found.append(int(name))
    return found


def _kill(pid: int, uid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if uid in _uids(str(pid)):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def signal_children(parent: int, sig: int) -> int:
    """Send `sig` to the direct children of `parent` (through pidfds, re-checking the parent
    after opening each); returns how many were signalled."""
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if _ppid(int(name)) != parent:
                continue
            fd = os.pidfd_open(int(name))
        except (OSError, ValueError):
            continue
        try:
            if _ppid(int(name)) == parent:
                signal.pidfd_send_signal(fd, sig)
                killed += 1
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)
    return killed


def kill_uid(uid: int, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process of `uid` until none is left (or `timeout_s` passes); returns the
    pids that were still alive when this was called (empty for a run that cleaned up)."""
    first = processes_of(uid)
    pids = first
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        for pid in pids:
            _kill(pid, uid)
        time.sleep(0.005)
        pids = processes_of(uid)
    return first
