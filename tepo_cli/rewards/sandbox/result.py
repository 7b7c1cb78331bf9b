"""The record of one sandboxed execution and how its outcome is classified.

``reason`` is one word for what ended the run, checked in this order:

==================  ===========================================================================
``timeout``         the wall-clock limit ran out; the sandbox was killed
``output-limit``    stdout or stderr exceeded the cap; the sandbox was killed
``sandbox-error``   the sandbox itself failed (bubblewrap/launcher error, set-up failure)
``cpu-limit``       killed by SIGXCPU (RLIMIT_CPU)
``file-size``       killed by SIGXFSZ (RLIMIT_FSIZE)
``killed``          killed by SIGKILL (e.g. the hard CPU limit)
``signal``          killed by any other signal (segfault, abort, ...)
``memory``          an uncaught MemoryError (RLIMIT_AS)
``exit-code``       exited with a non-zero status
``marker-missing``  exited 0, but the success marker was not printed (the program stopped
                    before its checks completed, e.g. ``sys.exit(0)`` or ``os._exit(0)``)
``ok``              exited 0 (and printed the marker when one was required)
==================  ===========================================================================

``passed`` is ``reason == "ok"``. Without a success marker that only means "exit status 0",
which hostile code can always achieve; graders must use a marker (see ``rewards/code.py``).
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

MEMORY_EXIT_CODE = 121  # must match _launcher.MEMORY_EXIT_CODE (a test checks it)
SETUP_EXIT_CODE = 122  # must match _launcher.SETUP_EXIT_CODE

REASONS: tuple[str, ...] = (
    "timeout",
    "output-limit",
    "sandbox-error",
    "cpu-limit",
    "file-size",
    "killed",
    "signal",
    "memory",
    "exit-code",
    "marker-missing",
    "ok",
)


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one program.

    ``exit_code``/``signal``: the program's own status as its supervisor saw it (one of them is
    None; both are None when the sandbox was killed before the program ended).
    ``stdout``/``stderr``: decoded as UTF-8 (invalid bytes replaced), at most
    ``limits.output_bytes`` bytes each; ``*_truncated`` says whether more was written.
    ``wall_time_s``: seconds from start to the end of the sandbox. ``cpu_time_s``: user+system
    seconds of the sandbox's processes that were reaped (approximate after a kill).
    ``isolation``: ``"strong"`` (bubblewrap namespaces) or ``"fallback"``.
    """

    passed: bool
    reason: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_time_s: float
    cpu_time_s: float
    isolation: str


def classify(
    *,
    timed_out: bool,
    output_limit: bool,
    status: dict[str, object] | None,
    stdout: str,
    success_marker: str | None,
) -> str:
    """The ``reason`` for one run (see the module docstring for the order)."""
    if timed_out:
        return "timeout"
    if output_limit:
        return "output-limit"
    if status is None or "terminated" in status or "error" in status:
        return "sandbox-error"
    sig = status.get("signal")
    if isinstance(sig, int):
        return {
            _signal.SIGXCPU: "cpu-limit",
            _signal.SIGXFSZ: "file-size",
            _signal.SIGKILL: "killed",
        }.get(sig, "signal")
    code = status.get("exit")
    if code == MEMORY_EXIT_CODE:
        return "memory"
    if code == SETUP_EXIT_CODE:
        return "sandbox-error"
    if code != 0:
        return "exit-code"
    if success_marker is not None and success_marker not in stdout.splitlines():
        return "marker-missing"
    return "ok"
