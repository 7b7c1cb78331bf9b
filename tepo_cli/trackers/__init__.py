"""Experiment trackers by name: `logger=[tensorboard,mlflow,wandb,trackio]` (console output and
metrics.jsonl are always on). Each is fed, on rank 0, every number of each step's metrics record
and each held-out accuracy, and writes under the run directory by default.

A tracker is one module in this package (or a plugin file that calls `register_tracker`): it
names itself (`NAME`, the value in `logger`), says which package it needs (`REQUIRES`, an
optional extra of tepo with the same name as the tracker), and has a `build()` that returns a
`Tracker` (trackers/tracker.py). Nothing else lists the trackers.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tepo_cli.core.discovery import ModuleRegistry
from tepo_cli.core.errors import ConfigError, RunError
from tepo_cli.trackers.group import Trackers
from tepo_cli.trackers.params import hyperparameters
from tepo_cli.trackers.tracker import HELD_OUT_ACCURACY, Outcome, Tracker, numeric

__all__ = [
    "HELD_OUT_ACCURACY",
    "Outcome",
    "Tracker",
    "Trackers",
    "check_trackers",
    "numeric",
    "open_trackers",
    "register_tracker",
    "trackers",
]


_TRACKERS = ModuleRegistry(
    __name__,
    "an experiment tracker",
    "logger={name}: {name} is not an experiment tracker; the trackers are: {known} (console "
    "output and metrics.jsonl are always written). A tracker is a module of tepo_cli/trackers/ "
    "with that NAME, or a plugin module passed to register_tracker.",
)
trackers = _TRACKERS.all  # every tracker module by its NAME: this package's, then the registered
register_tracker = _TRACKERS.register  # add one from a plugin file (`plugins=[...]`)


def check_trackers(names: Sequence[str]) -> None:
    """Refuse an unknown tracker, or one whose library is not installed, before any model loads."""
    known = {name: _TRACKERS.get(name) for name in names}
    missing = [n for n in names if importlib.util.find_spec(known[n].REQUIRES) is None]
    if missing:
        packages = ", ".join(known[n].REQUIRES for n in missing)
        extras = ",".join(missing)
        raise ConfigError(
            f"logger=[{','.join(names)}] needs {packages}, not installed in this environment "
            f"({sys.executable}). Install the trackers with `make install-trackers` (all of them), "
            f"or `pip install -c constraints.txt -e '.[{extras}]'` in tepo's checkout; or drop "
            f"{', '.join(missing)} from logger. Nothing was run."
        )


def open_trackers(
    names: Sequence[str], run_dir: Path, config: dict[str, Any], resume: int | None
) -> Trackers:
    """The named trackers, started for `run_dir` (`resume`: the step a resumed run continues
    after, None for a fresh run); `config` is the resolved config, recorded once."""
    check_trackers(names)
    known, started = trackers(), Trackers()
    params = hyperparameters(config) if names else {}
    for name in names:
        tracker = known[name].build()
        try:
            tracker.start(run_dir, params, resume)
        except Exception as error:
            started.close("failed")
            raise RunError(
                f"logger={name} could not start ({type(error).__name__}: {error}); drop it from "
                f"logger to train without it."
            ) from error
        started.add(name, tracker)
    return started
