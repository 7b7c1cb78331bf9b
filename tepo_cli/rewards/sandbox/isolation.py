"""Isolation levels: what confines the program besides its rlimits and unprivileged uid.

**strong** — bubblewrap (Debian package ``bubblewrap``), started as the run's unprivileged uid:

- new user, PID, network, IPC, UTS and cgroup namespaces; further user namespaces disabled;
  no capabilities;
- network: only a loopback interface of its own; nothing on the host (or beyond) is reachable;
- processes: the launcher's supervisor is PID 1 of a fresh PID namespace (``--as-pid-1``), so
  the program cannot signal it, and orphans (double-forked daemons) re-parent to it. When it
  exits or is killed the kernel kills every process in the namespace. On a timeout the parent
  signals that PID 1, which kills and reaps everything (bubblewrap then reaps it and exits; no
  zombie is left to the host's init), and if the parent itself dies, ``--die-with-parent``
  takes the sandbox with it;
- file system: a minimal root, read-only: only the system directories (``/usr``, ``/etc``,
  the ``/bin``, ``/lib*`` links) and the interpreter's own prefix are visible; home directories,
  the repository, datasets, checkpoints, ``/var``, ``/opt`` do not exist inside. ``/tmp`` (the
  scratch directory and cwd) and ``/dev/shm`` are private size-capped tmpfs mounts, ``/dev`` is
  a minimal device set, ``/proc`` shows only the sandbox's processes, and ``/`` itself is
  remounted read-only. Even within the visible directories, files readable only by root stay
  unreadable because the uid is unprivileged.

**fallback** — used when bubblewrap is missing or cannot create namespaces (e.g. a container
whose seccomp profile forbids ``unshare``):

- the rlimits and, when the parent is root, a fresh unprivileged uid (so root-owned files are
  neither writable nor deletable) — the real boundary;
- a supervisor subreaper that kills every leftover descendant (see ``_launcher.py``);
- a CPython audit hook that refuses sockets, exec/spawn, ctypes, signals and similar. It is a
  tripwire against accidents and naive attacks, *not* a security boundary: there is no network
  isolation a determined program cannot get around, world-writable directories (``/tmp``,
  ``/dev/shm``) stay writable during the run (what the run's uid left at their top level is
  deleted afterwards, ``cleanup.py``), and without root there is no uid switch at all. Use
  ``isolation="strong"`` wherever untrusted code must not reach the network.

Why bubblewrap rather than util-linux ``unshare``: both can create the namespaces (as root, or
unprivileged where user namespaces are allowed), but bubblewrap also builds the read-only
minimal root, the private tmpfs mounts and the ``--die-with-parent`` link in one unprivileged
command, so none of that needs root or hand-written mount code here.

The level is chosen once per configuration by running a tiny probe program through the real
strong path; ``auto`` falls back (with one warning) if the probe fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable

from tepo_cli.rewards.sandbox.unavailable import SandboxUnavailableError

STRONG = "strong"
FALLBACK = "fallback"
SCRATCH_IN_SANDBOX = "/tmp"
SHM_BYTES = 16 << 20
# The only parts of the host's file system a program sees (read-only): what an interpreter and
# the C library need. Home directories, /root, /var, /opt, /srv, /mnt, the repository, datasets
# and checkpoints are simply absent.
SYSTEM_DIRS: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
)

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_probe_cache: dict[tuple[object, ...], str | None] = {}  # key -> None (works) or why not


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path="/usr/bin:/usr/local/bin:/bin")


def interpreter_roots(python: str, site_packages: bool) -> list[str]:
    """Directories the interpreter needs besides the system ones: its installation prefix
    (and the virtual environment when third-party packages are allowed)."""
    real = os.path.realpath(python)
    roots = [os.path.dirname(os.path.dirname(real))]  # <prefix>/bin/pythonX.Y -> <prefix>
    if real == os.path.realpath(sys.executable):
        roots.append(sys.base_prefix)
        if site_packages:
            roots.append(sys.prefix)
    return roots


def _filesystem(extra_ro: list[str]) -> list[str]:
    """Read-only system directories (symbolic links such as merged-/usr ``/bin`` recreated as
    links), plus `extra_ro` unless already inside a bound directory."""
    args: list[str] = []
    bound: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for path in extra_ro:
        real = os.path.realpath(path)
        inside = any(real == b or real.startswith(b.rstrip("/") + "/") for b in bound)
        if real != "/" and not inside and os.path.isdir(real):
            args += ["--ro-bind", real, real]
            bound.append(real)
    return args


def bwrap_argv(
    bwrap: str, host_main: str, scratch_bytes: int, command: list[str], extra_ro: list[str]
) -> list[str]:
    """The bubblewrap command line around `command` (see the module docstring)."""
    return [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--hostname",
        "tepo-sandbox",
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        *_filesystem(extra_ro),
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--size",
        str(scratch_bytes),
        "--tmpfs",
        SCRATCH_IN_SANDBOX,
        "--size",
        str(SHM_BYTES),
        "--tmpfs",
        "/dev/shm",
        "--ro-bind",
        host_main,
        f"{SCRATCH_IN_SANDBOX}/main.py",
        "--remount-ro",
        "/",
        "--chdir",
        SCRATCH_IN_SANDBOX,
        "--",
        *command,
    ]


def choose_level(
    requested: str, key: tuple[object, ...], probe_strong: Callable[[], str | None]
) -> str:
    """The level to use for `requested` ("auto" | "strong" | "fallback").

    `probe_strong` runs a trivial program under the strong level and returns None on success
    or a description of the failure; its answer is cached under `key`.
    """
    if requested == FALLBACK:
        return FALLBACK
    with _lock:
        if key not in _probe_cache:
            _probe_cache[key] = (
                "bubblewrap (bwrap) is not installed; on Debian: apt-get install bubblewrap"
                if bwrap_path() is None
                else probe_strong()
            )
            failure = _probe_cache[key]
            if failure is not None and requested == "auto":
                _log.warning(
                    "code sandbox: strong isolation unavailable (%s); using the fallback "
                    "(rlimits, unprivileged uid, audit guard; no network namespace)",
                    failure,
                )
        failure = _probe_cache[key]
    if failure is None:
        return STRONG
    if requested == STRONG:
        raise SandboxUnavailableError(
            f"sandbox isolation 'strong' was required but is unavailable: {failure}"
        )
    return FALLBACK


def clear_probe_cache() -> None:
    """Forget probe results (for tests, or after installing bubblewrap)."""
    with _lock:
        _probe_cache.clear()
