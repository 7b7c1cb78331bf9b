"""One writer per run directory: a `tepo train` holds `<run dir>/.tepo.lock` for its whole life.

Two live runs on one directory (a `resume=true` started while a killed run's ranks still trained,
a resume typed twice) interleave steps in metrics.jsonl and overwrite each other's checkpoints.
An `fcntl.flock` is the lock: the kernel drops it when its holder exits however it exits (SIGKILL
included), so a killed run never leaves a stale lock to clear by hand, and the file, which holds
the holder's PID for the refusal's message, may stay in the directory.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tepo_cli.core.errors import ConfigError
from tepo_cli.runtime.lifetime import PARENT_ENV

LOCK_NAME = ".tepo.lock"


class RunDirInUse(ConfigError):
    """Refused: another live run holds the directory (whose files are that run's, not ours)."""


class RunLock:
    """The held lock of one run directory; `release()` (or the process's exit) frees it."""

    def __init__(self, handle: int) -> None:
        self._handle: int | None = handle

    def release(self) -> None:
        if self._handle is not None:
            os.close(self._handle)  # closing the last descriptor drops the flock
            self._handle = None


def hold_run_dir(run_dir: Path) -> RunLock:
    """Take the run directory's lock for this process, or raise RunDirInUse naming the live run
    that holds it (its PID)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(handle)
        raise _in_use(run_dir, holder) from None
    os.ftruncate(handle, 0)
    os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
    return RunLock(handle)


def takes_the_lock() -> bool:
    """Whether this process is the run directory's writer: `tepo train` itself, not the ranks it
    launches (runtime/lifetime.py's variable marks them, and their parent holds the lock); of ranks
    a user's own `deepspeed --hostfile ...` command started, rank 0."""
    return PARENT_ENV not in os.environ and os.environ.get("RANK", "0") == "0"


def check_run_dir_free(overrides: list[str]) -> None:
    """Before Hydra starts (tepo_cli/cli.py): refuse a single run whose `hydra.run.dir` a live
    run holds, so the refused command does not even rewrite that run's `.hydra/` record. A sweep,
    or a run whose directory Hydra has yet to pick, is checked by `hold_run_dir` in the job."""
    if not takes_the_lock() or any(arg in ("-m", "--multirun") for arg in overrides):
        return
    values = [a.split("=", 1)[1] for a in overrides if a.lstrip("+~").startswith("hydra.run.dir=")]
    if not values:
        return
    run_dir = Path(values[-1].strip("'\"")).expanduser()
    path = run_dir / LOCK_NAME
    if not path.is_file():
        return
    handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 64, 0).decode(errors="replace").strip() or "unknown"
        raise _in_use(run_dir, holder) from None
    finally:
        os.close(handle)  # a shared lock taken here is dropped with the descriptor


def _in_use(run_dir: Path, holder: str) -> RunDirInUse:
    return RunDirInUse(
        f"the run directory {run_dir} is in use by a live `tepo train` (PID {holder}, which "
        f"holds {run_dir / LOCK_NAME}); a run directory has one writer, so this run (a resume "
        f"included) would interleave its steps and checkpoints with that one's. Wait for it to "
        f"end or stop it (`kill {holder}`; `resume=true` then continues it), or train in another "
        f"directory. Nothing was run."
    )
