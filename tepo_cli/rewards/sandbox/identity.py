"""Who the sandboxed program runs as, and which interpreter that user can run.

When the parent is root, every run gets a fresh, otherwise unused user id drawn from
``SandboxConfig.uid_range``:

- the program cannot write, delete or read anything that is not world-accessible: root-owned
  files and directories (the repository, checkpoints, ``~/.ssh``, the tests' ``tmp_path``) are
  out of reach even under the fallback, where there is no read-only mount;
- RLIMIT_NPROC counts processes per user, so a private uid means a fork bomb in one run cannot
  starve another run, or a system daemon that happens to run as ``nobody``;
- runs cannot signal or ptrace each other.

Within one process no uid is handed out twice at the same time; two separate trainer processes
draw independently from 16M values, and a collision would at worst let those two runs kill
each other's processes (both graded as failures), never reach anything else.

When the parent is not root the program keeps the parent's uid (no switch is possible); the
strong level still isolates it through user/mount namespaces, the fallback does not.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import sysconfig
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tepo_cli.rewards.sandbox.unavailable import SandboxUnavailableError

_FALLBACK_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")

_lock = threading.Lock()
_in_use: set[int] = set()


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    switch: bool  # True: the parent is root and the program runs as uid/gid


@contextmanager
def run_identity(uid_range: tuple[int, int]) -> Iterator[Identity]:
    """A fresh uid for one run (parent root), or the parent's own ids."""
    if os.geteuid() != 0:
        yield Identity(os.getuid(), os.getgid(), switch=False)
        return
    lo, hi = uid_range
    with _lock:
        while True:
            uid = lo + secrets.randbelow(hi - lo)
            if uid not in _in_use:
                _in_use.add(uid)
                break
    try:
        yield Identity(uid, uid, switch=True)
    finally:
        with _lock:
            _in_use.discard(uid)


def _world_can(path: str, bits: int) -> bool:
    """Whether every directory on the way to `path` is world-searchable and `path` itself has
    the given world permission bits (a user with no relation to the owner can use it)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
        parent = os.path.dirname(real)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)
    except OSError:
        return False
    return st.st_mode & bits == bits


def resolve_python(configured: str | None, site_packages: bool, switch: bool) -> str:
    """The interpreter for sandboxed programs.

    An explicit ``configured`` path wins. Otherwise the running interpreter, if the sandbox
    user can execute it and read its standard library (an interpreter under root's 0700 home,
    e.g. pyenv's, is not usable by an unprivileged uid), else the system ``python3``.
    With ``site_packages`` the virtual environment's own launcher path is kept so its
    packages are visible.
    """
    if configured:
        return configured
    current = sys.executable if site_packages else os.path.realpath(sys.executable)
    stdlib = sysconfig.get_paths()["stdlib"]
    x, rx = stat.S_IXOTH, stat.S_IROTH | stat.S_IXOTH
    if not switch or (_world_can(current, x) and _world_can(stdlib, rx)):
        return current
    for candidate in _FALLBACK_PYTHONS:
        if os.path.exists(candidate) and _world_can(candidate, x):
            return candidate
    raise SandboxUnavailableError(
        f"no Python interpreter the sandbox user can run: {current} (or its standard library "
        f"{stdlib}) is not world-accessible and none of {', '.join(_FALLBACK_PYTHONS)} exists; "
        "set the sandbox `python` option or install Debian's python3"
    )
