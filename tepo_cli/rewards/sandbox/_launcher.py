"""In-sandbox launcher: supervisor plus program process.

This file is never imported by tepo. Its *source text* is handed to the sandbox interpreter as
``python -s -S -B -c <source> <spec-json>``, so it needs no readable file, no package on
``sys.path`` and nothing but the standard library. Under the strong level it already runs inside
bubblewrap's namespaces; under the fallback it runs as the parent's user.

Two processes:

- **supervisor** (the process the parent started): makes itself a *child subreaper*, forks the
  program process, waits for it and writes its exact wait status as one JSON line to the status
  descriptor. Then it kills every process left behind: anything that double-forked and called
  ``setsid`` to become a daemon is re-parented to the nearest subreaper (this process), so
  repeatedly SIGKILLing our children until none is left reaps the whole tree. On SIGTERM (the
  parent's timeout or output cap, or under the fallback the parent's death, delivered through
  PR_SET_PDEATHSIG) it does the same at once. The final sweep starts with one atomic
  ``kill(-1)`` where that is provably confined (see ``_kill_all_at_once``), so a fork bomb
  cannot outrun it. Under the strong level it is PID 1 of the sandbox's PID namespace, which the
  program cannot signal; under the fallback as root the program runs as another uid, so it
  can neither signal nor trace its supervisor.
- **program process**: closes inherited descriptors (the status pipe among them), applies the
  rlimits, drops to the sandbox uid (fallback as root), optionally installs the audit guard,
  changes into the scratch directory and runs ``main.py`` as ``__main__``.

Exit codes reserved by the launcher: 121 for an uncaught MemoryError (so the parent can report
``memory``) and 122 when the sandbox could not be set up.
"""

import contextlib
import json
import os
import resource
import signal
import sys
import time

MEMORY_EXIT_CODE = 121
SETUP_EXIT_CODE = 122
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36

_RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "nproc": resource.RLIMIT_NPROC,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}


class _Terminated(Exception):
    """Raised by the SIGTERM handler to break the supervisor out of waitpid."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated


def _prepare(parent_pid):
    """Become a non-dumpable child subreaper; under the fallback also die with the parent
    (SIGTERM, so the tree is still swept). Returns whether the subreaper is in place."""
    import ctypes  # imported after the fork, so the program process never has it loaded

    libc = ctypes.CDLL(None, use_errno=True)
    subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    # Not dumpable: a program with the same uid (strong level) can neither ptrace us nor open
    # our /proc entries (e.g. the status descriptor). The program was forked before this.
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    if parent_pid:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the line above
            raise _Terminated
    return subreaper


def _children(parent):
    """Pids whose parent is `parent`, from /proc (the field after the command name)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(name))
    return found


def _kill_all_at_once(drop_to):
    """One atomic ``kill(-1, SIGKILL)`` where it is provably confined to the sandbox, so a fork
    bomb cannot outrun the sweep: as PID 1 of the sandbox's own PID namespace (only its
    processes are visible; init itself is exempt), or from a helper that has become the run's
    private uid (fallback as root). Never as root, never as a shared uid."""
    if os.getpid() == 1:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)
        return
    if not drop_to:
        return
    uid, gid = drop_to
    if uid == 0 or os.fork() != 0:
        return
    try:  # helper process
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() == (uid, uid, uid):
            os.kill(-1, signal.SIGKILL)  # also kills this helper
    finally:
        os._exit(0)


def _sweep(drop_to):
    """SIGKILL all our children until none are left; orphans re-parent to us, so this kills
    every descendant, including daemons that left the process group or session."""
    _kill_all_at_once(drop_to)
    me = os.getpid()
    while True:
        for pid in _children(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reaped = False
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                reaped = True
        except ChildProcessError:
            return
        if not reaped:
            time.sleep(0.005)


def _report(fd, record):
    with contextlib.suppress(OSError):
        os.write(fd, (json.dumps(record) + "\n").encode())


def _supervise(spec):
    status_fd = spec["status_fd"]
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_write)
        # Wait until the supervisor is a subreaper, so no orphan can escape; if it died
        # instead (EOF), do not run the program unsupervised.
        if os.read(go_read, 1) != b"g":
            os._exit(SETUP_EXIT_CODE)
        os.close(go_read)
        _program(spec)
        raise SystemExit(0)  # the interpreter's normal exit: flush stdio, join threads
    os.close(go_read)
    subreaper = False
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        try:
            subreaper = _prepare(spec.get("parent_pid"))
        except _Terminated:
            raise
        except Exception:
            subreaper = False
        os.write(go_write, b"g")
        os.close(go_write)
        _, status, usage = os.wait4(pid, 0)
        record = {"subreaper": subreaper, "cpu": usage.ru_utime + usage.ru_stime}
        if os.WIFSIGNALED(status):
            record["signal"] = os.WTERMSIG(status)
        else:
            record["exit"] = os.waitstatus_to_exitcode(status)
        _report(status_fd, record)
    except _Terminated:
        _report(status_fd, {"terminated": True, "subreaper": subreaper})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _sweep(spec.get("drop_to"))
    os._exit(0)


# --- fallback guard -------------------------------------------------------------------------
# Best-effort only: CPython audit hooks are a tripwire, not a security boundary. They stop the
# obvious routes to the network and to other programs (sockets, exec/spawn, ctypes, signals to
# other processes, writing our own memory) when no network namespace is available.
_BLOCKED_EVENTS = frozenset(
    {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "subprocess.Popen",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "code.__new__",
    }
)
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"})
_PROTECTED_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})


def _guard(event, args, _events=_BLOCKED_EVENTS, _mods=_BLOCKED_MODULES, _attrs=_PROTECTED_ATTRS):
    # Only default arguments are used (their reassignment is itself an audited, blocked event);
    # a closure cell or a module global could be rewritten by the program.
    if event in _events:
        raise PermissionError(f"tepo sandbox: {event} is not allowed")
    if event == "import" and args[0].partition(".")[0] in _mods:
        raise PermissionError(f"tepo sandbox: importing {args[0]} is not allowed")
    if event == "object.__setattr__" and len(args) > 1 and args[1] in _attrs:
        raise PermissionError("tepo sandbox: rewriting function code is not allowed")
    if event == "open" and args and args[0] is not None and not isinstance(args[0], int):
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        if path.startswith("/proc/") and path.rsplit("/", 1)[-1] == "mem":
            raise PermissionError("tepo sandbox: opening process memory is not allowed")


def _install_guard():
    for name in list(sys.modules):
        if name.partition(".")[0] in _BLOCKED_MODULES:
            del sys.modules[name]
    sys.addaudithook(_guard)


# --- program process ------------------------------------------------------------------------
def _program(spec):
    import runpy  # before the guard and the privilege drop: the launcher's own needs

    try:
        os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(_RLIMITS[name], (soft, hard))
        if spec.get("drop_to"):
            uid, gid = spec["drop_to"]
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise OSError("privilege drop did not take effect")
        os.umask(0o077)
        os.chdir(spec["cwd"])
        if spec.get("guard"):
            _install_guard()
        sys.argv = [spec["main"]]
    except BaseException as exc:  # report and stop: never run the program half-confined
        os.write(2, f"tepo sandbox: setup failed: {exc!r}\n".encode())
        os._exit(SETUP_EXIT_CODE)
    try:
        runpy.run_path(spec["main"], run_name="__main__")
    except MemoryError:
        try:
            sys.stderr.write("MemoryError (tepo sandbox memory limit)\n")
            sys.stderr.flush()
        finally:
            os._exit(MEMORY_EXIT_CODE)
    # Normal completion, SystemExit and other exceptions: the interpreter's own exit path
    # (flush stdio, exit status 0 / the SystemExit code / 1 with a traceback).


if __name__ == "__main__":
    _supervise(json.loads(sys.argv[1]))
