"""Sandbox knobs: resource limits and the isolation policy.

Every limit exists because model-written code is hostile input (see the package docstring):

- ``wall_time_s``: an infinite loop, a ``sleep`` or a blocked read must not stall training; the
  parent kills the whole sandbox when it runs out (reason ``timeout``).
- ``cpu_time_s`` (RLIMIT_CPU): a second, kernel-enforced clock per process, so a busy loop dies
  even if the parent is slow to act; SIGXCPU at the soft limit, SIGKILL one second later.
- ``memory_bytes`` (RLIMIT_AS): a memory bomb gets ``MemoryError`` instead of pushing the
  training job into the OOM killer.
- ``file_size_bytes`` (RLIMIT_FSIZE): no single file can fill the disk (SIGXFSZ).
- ``max_processes`` (RLIMIT_NPROC): a fork bomb stops at this many processes/threads. The
  count is per run (each run has its own uid as root, or its own user namespace); only under
  the fallback without root does it count all of the parent user's processes.
- ``max_open_files`` (RLIMIT_NOFILE): no descriptor exhaustion.
- ``output_bytes``: stdout and stderr are each captured up to this many bytes; a program that
  writes more is killed (reason ``output-limit``) so it cannot flood the trainer's memory or logs.
- ``scratch_bytes``: size of the private tmpfs that is the program's scratch directory and /tmp
  under the strong level, so many small files cannot fill memory or disk either.

RLIMIT_AS is per process, so a program that forks *and* allocates can reach
``max_processes * memory_bytes`` (8 GiB with the defaults), and a pool of W workers W times
that. A per-run memory cgroup would bound the sum; it is not used because cgroup delegation
differs between hosts (v1/v2, systemd, containers). Size ``max_processes``, ``memory_bytes``
and the pool's ``max_workers`` together for the machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Isolation = Literal["auto", "strong", "fallback"]
ISOLATION_CHOICES: tuple[str, ...] = ("auto", "strong", "fallback")

# Per-run user ids when the parent is root: unused by Debian, systemd's documented allocations
# (dynamic users, container ranges up to 0x6FFFFFFF) and the 16-bit "nobody" ids.
DEFAULT_UID_RANGE: tuple[int, int] = (0x71000000, 0x72000000)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one execution (each documented in the module docstring)."""

    wall_time_s: float = 10.0
    cpu_time_s: int | None = None  # None: ceil(wall_time_s) + 1
    memory_bytes: int = 512 << 20
    file_size_bytes: int = 16 << 20
    max_processes: int = 16
    max_open_files: int = 64
    output_bytes: int = 64 << 10
    scratch_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if not self.wall_time_s > 0:
            raise ValueError(f"sandbox wall_time_s must be > 0, got {self.wall_time_s!r}")
        positive = {
            "memory_bytes": self.memory_bytes,
            "file_size_bytes": self.file_size_bytes,
            "max_open_files": self.max_open_files,
            "output_bytes": self.output_bytes,
            "scratch_bytes": self.scratch_bytes,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"sandbox {name} must be > 0, got {value!r}")
        # The launcher itself needs a couple of processes (supervisor + program, and the
        # namespace's init under bwrap), and Python needs a handful of descriptors to start.
        if self.max_processes < 4:
            raise ValueError(f"sandbox max_processes must be >= 4, got {self.max_processes!r}")
        if self.max_open_files < 16:
            raise ValueError(f"sandbox max_open_files must be >= 16, got {self.max_open_files!r}")
        if self.cpu_time_s is not None and self.cpu_time_s <= 0:
            raise ValueError(f"sandbox cpu_time_s must be > 0 or None, got {self.cpu_time_s!r}")

    @property
    def cpu_seconds(self) -> int:
        """The RLIMIT_CPU soft limit actually applied."""
        if self.cpu_time_s is not None:
            return self.cpu_time_s
        return math.ceil(self.wall_time_s) + 1


@dataclass(frozen=True)
class SandboxConfig:
    """How programs are isolated.

    ``isolation``:
      - ``"auto"``: the strong level when it works on this machine, else the fallback (a warning
        is logged once);
      - ``"strong"``: require the strong level (bubblewrap namespaces); raise
        :class:`~tepo_cli.rewards.sandbox.isolation.SandboxUnavailableError` if it is unavailable;
      - ``"fallback"``: always use the fallback (rlimits, unprivileged uid, Python audit guard).
    ``python``: interpreter for the program; None picks the running one when the sandbox user
      can execute it, else ``/usr/bin/python3``.
    ``site_packages``: let programs import third-party packages (runs without ``-S``).
    ``hash_seed``: PYTHONHASHSEED for the program, so set iteration order (and so output) is
      reproducible between runs.
    ``scratch_root``: where per-run scratch directories are created (None: the system temp dir);
      it must be traversable by the sandbox user.
    ``uid_range``: [lo, hi) range from which a fresh user id is drawn per run when the parent
      is root, so runs cannot signal each other and share no RLIMIT_NPROC count.
    ``kill_grace_s``: after a timeout, how long the fallback supervisor gets to kill the
      program's process tree before the whole group is SIGKILLed.
    """

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: Isolation = "auto"
    python: str | None = None
    site_packages: bool = False
    hash_seed: int = 0
    scratch_root: str | None = None
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE
    kill_grace_s: float = 3.0

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_CHOICES:
            raise ValueError(
                f"sandbox isolation must be one of {', '.join(ISOLATION_CHOICES)}; "
                f"got {self.isolation!r}"
            )
        lo, hi = self.uid_range
        if not 0 < lo < hi <= 0xFFFFFFFE:
            raise ValueError(f"sandbox uid_range must satisfy 0 < lo < hi; got {self.uid_range!r}")
        if not 0 <= self.hash_seed <= 4294967295:
            raise ValueError(f"sandbox hash_seed must be in [0, 2**32 - 1]; got {self.hash_seed}")
        if self.kill_grace_s <= 0:
            raise ValueError(f"sandbox kill_grace_s must be > 0, got {self.kill_grace_s!r}")
