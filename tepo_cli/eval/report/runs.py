"""Find the run directories under a run or multirun directory and read what each one left.

A run directory is recognised by what `tepo train` writes into it: `.hydra/` (written before the
job starts, so even a run that failed at validation has it), `config.yaml`, `metrics.jsonl` or
`status.json`. Hidden directories (`.hydra`, submitit's `.submitit`) are never runs.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tepo_cli.core.flatten import flatten
from tepo_cli.core.run_dir import CONFIG, EVALS, HYDRA, METRICS, STATUS, SUMMARY
from tepo_cli.core.run_status import effective_state, read_status

_MARKERS = (HYDRA, CONFIG, METRICS, STATUS)
_MAX_DEPTH = 6  # multirun dir / sub-dir pattern levels; deeper trees are not sweeps


@dataclass
class Run:
    path: Path
    name: str  # path relative to the report's root ("." for a single run)
    state: str  # finished, running, running on HOST, failed, interrupted, crashed, crashed/unknown
    config: dict[str, Any]  # flattened: {"algo.name": "grpo", "trainer.max_steps": 30, ...}
    overrides: list[str] | None  # the job's command-line overrides; None if not recorded
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    summary: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)  # what could not be read

    @property
    def seed(self) -> Any:
        return self.config.get("seed", 0)

    @property
    def finished(self) -> bool:
        return self.state == "finished"


def is_run_dir(path: Path) -> bool:
    return any((path / marker).exists() for marker in _MARKERS)


def find_runs(root: Path) -> list[Path]:
    """Every run directory at or under `root`, in job order (natural sort of their paths).
    Links to directories are followed (a folder of links gathers runs published in several
    places), each directory once however many links reach it."""
    if is_run_dir(root):
        return [root]
    found: list[Path] = []
    seen: set[str] = set()
    for directory, subdirs, _ in os.walk(root, followlinks=True):
        here = Path(directory)
        if (real := os.path.realpath(here)) in seen:
            subdirs.clear()
            continue
        seen.add(real)
        depth = len(here.relative_to(root).parts)
        if here != root and is_run_dir(here):
            found.append(here)
            subdirs.clear()  # a run's own sub-directories (final/, checkpoints/) are not runs
            continue
        subdirs[:] = (
            sorted(d for d in subdirs if not d.startswith(".")) if depth < _MAX_DEPTH else []
        )
    return sorted(found, key=lambda p: _natural_key(str(p.relative_to(root))))


def load_run(path: Path, root: Path) -> Run:
    notes: list[str] = []
    summary = _read_json(path / SUMMARY, notes)
    return Run(
        path=path,
        name=str(path.relative_to(root)) if path != root else path.name,
        state=_state(path, summary),
        config=flatten(_read_config(path, notes)),
        overrides=_read_overrides(path, notes),
        metrics=_read_jsonl(path / METRICS, notes),
        evals=_read_jsonl(path / EVALS, notes),
        summary=summary,
        notes=notes,
    )


def _state(path: Path, summary: dict[str, Any] | None) -> str:
    state = effective_state(path)
    if state == "unknown":  # no status.json: a run from before it existed, or one killed early
        return "finished" if summary is not None else "crashed/unknown"
    if state == "running":
        host = (read_status(path) or {}).get("hostname")
        if host and host != socket.gethostname():
            return f"running on {host}"  # its pid cannot be checked from here
    return state


def _read_config(path: Path, notes: list[str]) -> dict[str, Any]:
    """The validated config.yaml; else Hydra's composed .hydra/config.yaml (a run that failed early)."""
    for candidate in (path / CONFIG, path / HYDRA / CONFIG):
        if candidate.is_file():
            try:
                data = yaml.safe_load(candidate.read_text())
            except (OSError, yaml.YAMLError) as error:
                notes.append(f"{candidate.name} unreadable ({error.__class__.__name__})")
                continue
            if isinstance(data, dict):
                return data
    return {}


def _read_overrides(path: Path, notes: list[str]) -> list[str] | None:
    file = path / HYDRA / "overrides.yaml"
    if not file.is_file():
        return None
    try:
        data = yaml.safe_load(file.read_text()) or []
    except (OSError, yaml.YAMLError):
        notes.append(".hydra/overrides.yaml unreadable")
        return None
    return [str(item) for item in data] if isinstance(data, list) else None


def _read_json(file: Path, notes: list[str]) -> dict[str, Any] | None:
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        notes.append(f"{file.name} unreadable")
        return None
    return data if isinstance(data, dict) else None


def _read_jsonl(file: Path, notes: list[str]) -> list[dict[str, Any]]:
    """Every complete line; a torn last line (a run killed while writing) is skipped and noted."""
    if not file.is_file():
        return []
    records: list[dict[str, Any]] = []
    skipped = 0
    for line in file.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(record, dict):
            records.append(record)
    if skipped:
        notes.append(f"{file.name}: {skipped} unreadable line(s) skipped")
    return records


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]
