"""Removing what a run left on the host.

``remove_tree`` deletes a scratch directory. ``remove_owned`` is the fallback's after-care:
without a private /tmp, a program running as its fresh per-run uid can still create entries in
world-writable directories. Because that uid belonged to nobody before the run and every one of
its processes is dead afterwards, anything it owns at the top of those directories was created by
this run and is deleted. Entries nested in *other* world-writable directories are not found
(documented limitation of the fallback; the strong level has none of this, as /tmp and /dev/shm
are private and everything else is read-only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterable

WORLD_WRITABLE_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")

_log = logging.getLogger(__name__)


def remove_tree(path: str) -> None:
    """Delete a directory tree, even one whose permissions the program changed.

    ``shutil.rmtree`` works on descriptors and never follows symbolic links, so links planted
    by the program cannot redirect the deletion outside the directory.
    """
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                with contextlib.suppress(OSError):
                    os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _log.warning("code sandbox: could not remove %s", path)


def remove_owned(uid: int, directories: Iterable[str] = WORLD_WRITABLE_DIRS) -> list[str]:
    """Delete the top-level entries of `directories` owned by `uid`; returns their paths."""
    removed: list[str] = []
    seen: set[str] = set()
    for directory in directories:
        real = os.path.realpath(directory)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        try:
            entries = list(os.scandir(real))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                _log.warning("code sandbox: could not remove %s: %s", entry.path, exc)
    return removed
