"""DeepSpeed's CPU all-reduce buffers in /dev/shm, which DeepSpeed itself never removes.

Its shm op maps one buffer per rank (`deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`,
tens of MB each) and never unlinks it. The relaunching parent removes its own launch's buffers
when the ranks exit (however they exit); a launch killed with SIGKILL, parent and all, cannot, so
every multi-rank start also removes the buffers that no live process maps any more.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"
# A buffer younger than this may belong to a launch whose ranks are between creating and mapping
# it: never touched, whatever the maps say.
MIN_AGE_S = 60.0


def remove_shm_buffers(port: int, shm_dir: Path = SHM) -> list[Path]:
    """Remove the buffers of the ranks that used `port` (called once every rank has exited)."""
    removed = sorted(shm_dir.glob(f"{PREFIX}_{os.getuid()}_*_{port}_*"))
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def remove_stale_shm_buffers(
    shm_dir: Path = SHM, proc: Path = Path("/proc"), now: float | None = None
) -> list[Path]:
    """Remove this user's buffers that no process maps and that are older than MIN_AGE_S: those
    of launches killed outright. A live run's buffers are mapped by its ranks and stay."""
    now = time.time() if now is None else now
    candidates = [
        path
        for path in sorted(shm_dir.glob(f"{PREFIX}_{os.getuid()}_*"))
        if now - _mtime(path) >= MIN_AGE_S
    ]
    if not candidates:
        return []
    mapped = _mapped_names(proc)
    removed = [path for path in candidates if path.name not in mapped]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")  # gone already: never a candidate


def _mapped_names(proc: Path) -> set[str]:
    """The names of /dev/shm files any readable process maps (its /proc/<pid>/maps)."""
    names: set[str] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "maps").read_text(errors="replace")
        except OSError:
            continue  # ended meanwhile, or another user's: not ours to judge
        for line in text.splitlines():
            where = line.find("/dev/shm/")
            if where >= 0:
                names.add(line[where + len("/dev/shm/") :].split(" ")[0])
    return names
