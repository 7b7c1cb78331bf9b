"""<run dir>/status.json: whether a run is running, finished, failed or interrupted.

A run killed outright cannot update it, so "running" with a pid that no longer exists on the
recording host means crashed; `tepo report` and `resume=true` read it that way.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tepo_cli.core.atomic_write import write_text
from tepo_cli.core.run_dir import STATUS


def write_status(run_dir: Path, state: str, **details: Any) -> None:
    record = {
        "state": state,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **details,
    }
    write_text(run_dir / STATUS, json.dumps(record, indent=1))


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / STATUS).read_text())
    except (OSError, ValueError):
        return None


def effective_state(run_dir: Path) -> str:
    """finished, failed, interrupted, running, crashed, or unknown (no status file)."""
    status = read_status(run_dir)
    if status is None:
        return "unknown"
    state = str(status.get("state", "unknown"))
    same_host = status.get("hostname") == socket.gethostname()
    if state == "running" and same_host and not _alive(int(status.get("pid", -1))):
        return "crashed"
    return state


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
