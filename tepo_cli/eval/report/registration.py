"""Whether a protocol was registered before its runs: its file's first commit against the first
run's start in the journal.

A pre-registration is only worth what its date is worth. The commit that adds `protocol.yaml`
dates it (git records when each commit entered the history), the journal dates each run's start,
and a commit that changes the file after the first run began is an edit the protocol forbids
(deviations belong in protocol.md beside it). The report states all three, so a reader does not
have to take the results page's word for them.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tepo_cli.protocol.journal import EXPERIMENT, file_digest

STARTS = ("start", "resume")


def registration(protocol_path: Path, journals: list[list[dict[str, Any]]]) -> str:
    """One sentence: when the protocol was first committed, when its first run started (by the
    journals whose lines carry this text of the file: not those of runs it reuses), and the
    commits that changed it after that (or why any of it is unknown)."""
    commits = _commits(protocol_path)
    digest = file_digest(protocol_path)  # its own journal's lines carry it (not a reused arm's)
    own = [
        entries for entries in journals if any(e.get("protocol_sha256") == digest for e in entries)
    ]
    first_run = _first_start(own)
    if commits is None:
        return f"Registration unknown: {protocol_path} is not in a git repository's history."
    if not commits:
        return f"Not registered: {protocol_path} has never been committed."
    (first_hash, committed), later = commits[-1], commits[:-1]
    said = f"Registered by commit {first_hash[:7]} ({_utc(committed)})"
    if first_run is None and journals and not own:
        return said + "; no journal beside its runs carries this text of the file (changed since?)."
    if first_run is None:
        return said + "; no run has started (the journal has no start)."
    if first_run < committed:
        return (
            f"NOT A PRE-REGISTRATION: the first run started {_utc(first_run)}, before the "
            f"protocol's first commit {first_hash[:7]} ({_utc(committed)})."
        )
    edits = [h[:7] for h, when in later if when > first_run]
    said += f", before its first run started ({_utc(first_run)})"
    if edits:
        return (
            f"{said}; changed after that by commit{'s' * (len(edits) > 1)} {', '.join(edits)} "
            "(each a deviation)."
        )
    return said + (f"; {_dirty(protocol_path)}." if _dirty(protocol_path) else "; unchanged since.")


def _commits(path: Path) -> list[tuple[str, datetime]] | None:
    """The commits that touched `path`, newest first (None: not in a git repository)."""
    log = _git(path, "log", "--follow", "--format=%H %cI", "--", path.name)
    if log is None:  # no repository, or one with no commit yet
        return None if _git(path, "rev-parse", "--git-dir") is None else []
    rows = [line.split(" ", 1) for line in log.splitlines() if line.strip()]
    return [(commit, datetime.fromisoformat(when)) for commit, when in rows]


def _git(path: Path, *args: str) -> str | None:
    """git's output run beside `path`; None where git fails or is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=path.parent.resolve(), capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _dirty(path: Path) -> str:
    changed = _git(path, "status", "--porcelain", "--", path.name)
    return "its file now differs from its last commit" if changed else ""


def _first_start(journals: list[list[dict[str, Any]]]) -> datetime | None:
    starts = [
        datetime.fromisoformat(entry["time"])
        for entries in journals
        for entry in entries
        if entry.get("run") != EXPERIMENT and entry.get("event") in STARTS and "time" in entry
    ]
    return min(starts, default=None)


def _utc(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
