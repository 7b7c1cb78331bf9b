"""Run one program in the sandbox: scratch directory, launch, I/O, kill, clean up.

Lifecycle of a run:

1. a fresh scratch directory is created (owned by the run's uid, mode 0700) and the program is
   written to ``main.py`` in it;
2. the launcher starts in a new session (its own process group), either inside bubblewrap
   (strong) or directly (fallback), with a scrubbed environment (``environment.py``);
3. the parent feeds stdin and collects stdout/stderr under the wall-clock deadline and output
   caps (``streams.py``); when either is hit it stops the sandbox: SIGTERM to the launcher's
   supervisor (under the strong level the namespace's PID 1), which kills and reaps the whole
   tree (``_launcher.py``); if the pipes are still open ``kill_grace_s`` later, SIGKILL to the
   supervisor and the whole process group (under the strong level the kernel then kills
   everything in the PID namespace);
4. once the launcher has exited (or the grace has passed) its process group is SIGKILLed
   *before* the leader is reaped, so the group id cannot have been reused by an unrelated
   process; then the leader is reaped with ``wait4``;
5. when the parent is root, every process still running under the run's private uid is
   killed (``reaper.py``), so nothing the run started outlives ``run_program``;
6. the scratch directory is deleted; under the fallback, so is anything the run's uid left in
   world-writable directories (``cleanup.py``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tepo_cli.rewards.sandbox.cleanup import remove_owned, remove_tree
from tepo_cli.rewards.sandbox.environment import interpreter_argv, sandbox_env
from tepo_cli.rewards.sandbox.identity import Identity, resolve_python, run_identity
from tepo_cli.rewards.sandbox.isolation import (
    SCRATCH_IN_SANDBOX,
    STRONG,
    bwrap_argv,
    bwrap_path,
    choose_level,
    interpreter_roots,
)
from tepo_cli.rewards.sandbox.reaper import kill_uid, signal_children
from tepo_cli.rewards.sandbox.result import SandboxResult, classify
from tepo_cli.rewards.sandbox.sandbox_config import SandboxConfig, SandboxLimits
from tepo_cli.rewards.sandbox.streams import PumpOutcome, pump

_log = logging.getLogger(__name__)
_PROBE_MARKER = "tepo-sandbox-probe-ok"


@functools.lru_cache(maxsize=1)
def launcher_source() -> str:
    return Path(__file__).with_name("_launcher.py").read_text(encoding="utf-8")


def run_program(
    source: str,
    stdin: str | bytes = b"",
    *,
    config: SandboxConfig | None = None,
    success_marker: str | None = None,
) -> SandboxResult:
    """Run the Python program `source` in the sandbox and report what happened.

    `stdin` is fed to the program. With `success_marker`, ``passed`` additionally requires the
    marker as a whole line of stdout (so an early ``sys.exit(0)`` does not pass).
    Raises :class:`SandboxUnavailableError` only when ``config.isolation == "strong"`` cannot
    be provided (or no usable interpreter exists); every failure of the *program* is a result.
    """
    config = config or SandboxConfig()
    with run_identity(config.uid_range) as ident:
        python = resolve_python(config.python, config.site_packages, ident.switch)
        key = (python, config.site_packages, ident.switch, config.scratch_root)
        level = choose_level(config.isolation, key, lambda: _probe(config, python))
        return _execute(source, stdin, config, level, ident, python, success_marker)


def _probe(config: SandboxConfig, python: str) -> str | None:
    """None if a trivial program runs under the strong level, else why not."""
    limits = SandboxLimits(wall_time_s=30.0, cpu_time_s=30)
    probe_config = SandboxConfig(
        limits=limits,
        python=python,
        site_packages=config.site_packages,
        scratch_root=config.scratch_root,
        uid_range=config.uid_range,
    )
    with run_identity(config.uid_range) as ident:
        result = _execute(
            f"print({_PROBE_MARKER!r})", b"", probe_config, STRONG, ident, python, _PROBE_MARKER
        )
    if result.passed:
        return None
    detail = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.exit_code}"]
    return f"bubblewrap probe failed ({result.reason}): {detail[0][:300]}"


def _rlimits(limits: SandboxLimits) -> dict[str, tuple[int, int]]:
    cpu = limits.cpu_seconds
    return {
        "cpu": (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        "as": (limits.memory_bytes, limits.memory_bytes),
        "fsize": (limits.file_size_bytes, limits.file_size_bytes),
        "nproc": (limits.max_processes, limits.max_processes),
        "nofile": (limits.max_open_files, limits.max_open_files),
        "core": (0, 0),
    }


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _launch(
    config: SandboxConfig, level: str, ident: Identity, python: str, scratch: str, status_fd: int
) -> subprocess.Popen[bytes]:
    """Start the launcher (inside bubblewrap for the strong level) in a new session."""
    strong = level == STRONG
    cwd = SCRATCH_IN_SANDBOX if strong else scratch
    spec = {
        "status_fd": status_fd,
        "rlimits": _rlimits(config.limits),
        "drop_to": [ident.uid, ident.gid] if ident.switch and not strong else None,
        "guard": not strong,
        "parent_pid": None if strong else os.getpid(),
        "cwd": cwd,
        "main": f"{cwd}/main.py",
    }
    command = interpreter_argv(python, launcher_source(), json.dumps(spec), config.site_packages)
    as_user: dict[str, object] = {}
    if strong:
        roots = interpreter_roots(python, config.site_packages)
        host_main = os.path.join(scratch, "main.py")
        bwrap = bwrap_path() or "bwrap"
        command = bwrap_argv(bwrap, host_main, config.limits.scratch_bytes, command, roots)
        if ident.switch:  # bubblewrap itself runs unprivileged, as the run's uid
            as_user = {"user": ident.uid, "group": ident.gid, "extra_groups": []}
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=sandbox_env(cwd, config.hash_seed),
        cwd=scratch,
        start_new_session=True,
        pass_fds=(status_fd,),
        **as_user,  # type: ignore[arg-type]
    )


def _execute(
    source: str,
    stdin: str | bytes,
    config: SandboxConfig,
    level: str,
    ident: Identity,
    python: str,
    success_marker: str | None,
) -> SandboxResult:
    strong = level == STRONG
    stdin_bytes = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    scratch = tempfile.mkdtemp(prefix="tepo-sandbox-", dir=config.scratch_root)
    try:
        _write_program(scratch, source, ident)
        status_read, status_write = os.pipe()
        start = time.monotonic()
        try:
            proc = _launch(config, level, ident, python, scratch, status_write)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        stop = _stopper(proc.pid, strong)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            outcome = pump(
                proc.stdin,
                proc.stdout,
                proc.stderr,
                status_read,
                stdin_bytes,
                deadline=start + config.limits.wall_time_s,
                output_bytes=config.limits.output_bytes,
                grace_s=config.kill_grace_s,
                stop=stop,
            )
        except BaseException:
            stop(1)
            raise
        finally:
            _await_exit(proc.pid, config.kill_grace_s)
            _killpg(proc.pid)  # leader not reaped yet: the group id is still ours
            _, wait_status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
            wall = time.monotonic() - start
            os.close(status_read)
            proc.stdout.close()
            proc.stderr.close()
        return _result(outcome, usage, wall, level, success_marker)
    finally:
        if ident.switch:
            leftovers = kill_uid(ident.uid)
            if leftovers:
                _log.debug("code sandbox: killed %d leftover process(es)", len(leftovers))
        remove_tree(scratch)
        if ident.switch and not strong:
            remove_owned(ident.uid)


def _write_program(scratch: str, source: str, ident: Identity) -> None:
    """The program as main.py in its scratch directory, readable by the sandbox's user."""
    host_main = os.path.join(scratch, "main.py")
    with open(host_main, "w", encoding="utf-8") as f:
        f.write(source)
    os.chmod(host_main, 0o644)
    if ident.switch:
        os.chown(scratch, ident.uid, ident.gid)


def _stopper(pid: int, strong: bool) -> Callable[[int], None]:
    """How `pump` stops a program: first ask the supervisor (SIGTERM), which kills and reaps the
    program's whole tree, then exits — under the strong level it is the namespace's PID 1,
    bubblewrap's child. If the pipes are still open after the grace period: SIGKILL everything."""

    def stop(attempt: int) -> None:
        sig = signal.SIGTERM if attempt == 1 else signal.SIGKILL
        if strong:
            if signal_children(pid, sig) == 0 or attempt > 1:
                _killpg(pid)
        elif attempt == 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        else:
            _killpg(pid)

    return stop


def _result(
    outcome: PumpOutcome,
    usage: resource.struct_rusage,
    wall: float,
    level: str,
    success_marker: str | None,
) -> SandboxResult:
    status = _parse_status(outcome.status) or {}
    stdout = outcome.stdout.data.decode("utf-8", errors="replace")
    reason = classify(
        timed_out=outcome.timed_out,
        output_limit=outcome.output_limit,
        status=status or None,
        stdout=stdout,
        success_marker=success_marker,
    )
    exit_code, sig, cpu = status.get("exit"), status.get("signal"), status.get("cpu")
    if not isinstance(cpu, float):  # killed before reporting: what the reaped tree used
        cpu = usage.ru_utime + usage.ru_stime
    return SandboxResult(
        passed=reason == "ok",
        reason=reason,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=sig if isinstance(sig, int) else None,
        timed_out=outcome.timed_out,
        stdout=stdout,
        stderr=outcome.stderr.data.decode("utf-8", errors="replace"),
        stdout_truncated=outcome.stdout.truncated,
        stderr_truncated=outcome.stderr.truncated,
        wall_time_s=wall,
        cpu_time_s=cpu,
        isolation=level,
    )


def _await_exit(pid: int, timeout_s: float) -> None:
    """Wait (without reaping) until `pid` has exited, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0005
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _parse_status(raw: bytes) -> dict[str, object] | None:
    """The launcher's JSON status line, or None when it never reported."""
    lines = raw.decode("utf-8", errors="replace").strip().splitlines()
    if not lines:
        return None
    try:
        record = json.loads(lines[0])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
