"""What a tracker records once per run as hyper-parameters: the resolved config, flattened
(`trainer.lr`, `algo.name`, ...), and the git commit of the code that trained."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tepo_cli.core.flatten import flatten

# tepo's own package directory: in a git checkout (`pip install -e .`) its commit names the code.
_SOURCE = Path(__file__).resolve().parents[1]


def hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as one level of dotted keys, plus `git_commit`."""
    return {**flatten(config), "git_commit": git_commit(_SOURCE)}


def git_commit(directory: Path) -> str:
    """HEAD of the git checkout that tracks `directory`, with `-dirty` when tracked files differ
    from it; `unknown` outside a checkout (a wheel install, even in a .venv inside some repository)
    or without git."""
    head = _git(directory, "rev-parse", "HEAD")
    if head is None or _git(directory, "ls-files", "--error-unmatch", "__init__.py") is None:
        return "unknown"
    changes = _git(directory, "status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changes else "")


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
