"""No launcher or rank outlives the `tepo train` that started it, whatever ends that process.

`trainer.nproc=N` runs `tepo train` (the parent) → the deepspeed runner → DeepSpeed's `launch`
→ N ranks. The runner gets a session of its own (runtime/distributed.py) so that the first Ctrl-C
reaches the ranks alone and they checkpoint before they stop; the price is that a SIGKILL of the
parent's process group (a scheduler's, a lost node's `kill -KILL -- -PGID`) or of the parent alone
does not reach them, and they went on training into the run directory. The kernel now ends them:

- the runner gets `PR_SET_PDEATHSIG`=SIGKILL in a `preexec_fn`, so it dies with the parent;
- each rank follows the parent itself (`follow_train_process`): its PID comes in `TEPO_TRAIN_PID`
  and a daemon thread waits on a pidfd of it (woken by the kernel the moment it exits, no
  polling), then SIGKILLs the rank. A parent-death signal alone cannot do this: it is cleared by
  `fork`, so DeepSpeed's `launch` (the runner's child, started by code tepo does not own) and the
  ranks (its children) would not inherit it, and the ranks' own parent is `launch`, not
  `tepo train`. Each rank sets one too, for `launch` itself killed.
- the first rank to see it also SIGKILLs `launch`, its parent (only while it still is its parent,
  so never a process that inherited its PID or adopted the rank); `launch` would otherwise end
  only at its next poll of its ranks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import signal
import threading

PARENT_ENV = "TEPO_TRAIN_PID"  # the `tepo train` process whose ranks these are
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def die_with_parent() -> None:
    """`preexec_fn` of the launcher: SIGKILL this process when its parent thread exits. Runs in
    the forked child before exec; the setting survives exec (not a set-user-ID program)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def follow_train_process(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """In a rank started by `tepo train trainer.nproc=N`: end this rank the moment that process
    ends. Returns the watching thread (None where there is no parent to follow: a single rank, or
    ranks a user's own `deepspeed --hostfile ...` command started)."""
    value = (os.environ if environ is None else environ).get(PARENT_ENV)
    if not value or not value.isdigit():
        return None
    parent = int(value)
    parent_of_this = os.getppid()
    die_with_parent()
    if os.getppid() != parent_of_this:  # `launch` died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        handle = os.pidfd_open(parent)
    except ProcessLookupError:  # `tepo train` already gone
        os.kill(os.getpid(), signal.SIGKILL)
        raise  # not reached
    thread = threading.Thread(
        target=_end_with, args=(handle, parent_of_this), name="tepo-parent", daemon=True
    )
    thread.start()
    return thread


def _end_with(handle: int, launcher: int) -> None:
    poller = select.poll()
    poller.register(handle, select.POLLIN)  # a pidfd is readable once its process has exited
    while not poller.poll():
        pass
    if os.getppid() == launcher:  # still our parent: DeepSpeed's `launch`, alive
        os.kill(launcher, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
