"""Sandbox for model-written Python code.

Threat model: the program is hostile. It may loop forever, allocate without bound, fork-bomb,
flood stdout, write or delete files, read secrets from the environment or the file system,
open network connections, leave daemons behind, or exit early to fake success. The sandbox must
contain all of that, leave the host as it was, and report what happened — the trainer only
ever sees a :class:`SandboxResult`.

Layers (each documented in its module):

- ``sandbox_config`` limits and the isolation policy, with why each limit exists;
- ``isolation``   the strong level (bubblewrap namespaces) and the fallback, and the probe that
                  picks one;
- ``identity``    a fresh unprivileged uid per run when the parent is root;
- ``environment`` the scrubbed environment and interpreter flags;
- ``_launcher``   the in-sandbox supervisor: rlimits, privilege drop, reaping of every
                  descendant, the fallback's audit guard;
- ``streams``     stdin/stdout/stderr under a deadline and output caps;
- ``reaper``      kill every process of a run's private uid (the last line of containment);
- ``cleanup``     delete the scratch directory (and the fallback's leftovers in /tmp & co.);
- ``result``      the result record and the ``reason`` vocabulary;
- ``runner``      one run end to end; ``pool`` many runs on a thread pool.

Not covered (residual risks): no seccomp filter (the kernel's system-call surface is reachable
from inside the namespaces); memory is bounded per process, not per run (see ``sandbox_config``); inode
exhaustion of the scratch tmpfs is bounded only by the wall-clock limit; the fallback's audit
guard is a tripwire, not a boundary (see ``isolation``).

Usage::

    from tepo_cli.rewards.sandbox import SandboxConfig, run_program
    result = run_program("print(input()[::-1])", stdin="abc\\n")
    result.stdout, result.reason, result.isolation
"""

from __future__ import annotations

from tepo_cli.rewards.sandbox.isolation import FALLBACK, STRONG, clear_probe_cache
from tepo_cli.rewards.sandbox.pool import Program, run_many
from tepo_cli.rewards.sandbox.result import REASONS, SandboxResult
from tepo_cli.rewards.sandbox.runner import run_program
from tepo_cli.rewards.sandbox.sandbox_config import SandboxConfig, SandboxLimits
from tepo_cli.rewards.sandbox.unavailable import SandboxUnavailableError

__all__ = [
    "FALLBACK",
    "REASONS",
    "STRONG",
    "Program",
    "SandboxConfig",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "clear_probe_cache",
    "run_many",
    "run_program",
]
