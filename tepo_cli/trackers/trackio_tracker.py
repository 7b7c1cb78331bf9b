"""trackio: a local SQLite store (`tepo.db`, project `tepo`) in `<run dir>/trackio/`, or in
`<sweep dir>/trackio/` for a Hydra multirun (every job a run of one project), or in
`TRACKIO_DIR` when you set it; view with `TRACKIO_DIR=<that directory> trackio show --project
tepo`. Nothing is sent anywhere: no Space, no server (trackio's dashboard needs no gradio).

trackio reads `TRACKIO_DIR` once, when it is imported: the jobs of a multirun that run one after
another in one process (the basic launcher) could not each point it elsewhere, so they share the
sweep's store. A resumed run continues its run by name (`resume="allow"`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tepo_cli.trackers.tracker import Outcome, run_name

NAME = "trackio"
REQUIRES = "trackio"
PROJECT = "tepo"


class TrackioTracker:
    def __init__(self) -> None:
        self._run: Any = None

    def start(self, run_dir: Path, config: dict[str, Any], resume: int | None) -> None:
        store = store_dir(run_dir)
        trackio = _trackio_writing_to(store)
        self._run = trackio.init(
            project=PROJECT,
            name=run_name(run_dir),
            config=config,
            resume="never" if resume is None else "allow",
            embed=False,
        )
        print(
            f"tepo train: trackio logs to {store}; view it with TRACKIO_DIR={store} trackio show "
            f"--project {PROJECT}",
            file=sys.stderr,
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self, outcome: Outcome) -> None:
        self._run.finish()


def store_dir(run_dir: Path) -> Path:
    chosen = os.environ.get("TRACKIO_DIR")
    if chosen:
        return Path(chosen).resolve()
    return (_sweep_dir() or run_dir).resolve() / NAME


def _sweep_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    return Path(hydra.sweep.dir) if hydra.mode == RunMode.MULTIRUN else None


def _trackio_writing_to(store: Path) -> ModuleType:
    """trackio, imported with `TRACKIO_DIR` pointing at `store` (the variable is restored after:
    trackio read it)."""
    if "trackio" not in sys.modules:
        previous = os.environ.get("TRACKIO_DIR")
        os.environ["TRACKIO_DIR"] = str(store)
        try:
            import trackio
        finally:
            if previous is None:
                del os.environ["TRACKIO_DIR"]
            else:
                os.environ["TRACKIO_DIR"] = previous
    import trackio
    from trackio import utils

    if Path(utils.TRACKIO_DIR).resolve() != store:
        print(
            f"tepo train: warning: trackio was already imported in this process with its store "
            f"at {utils.TRACKIO_DIR}; this run's trackio records go there, not to {store}",
            file=sys.stderr,
        )
    return trackio


def build() -> TrackioTracker:
    return TrackioTracker()
