"""Weights & Biases: offline unless you are logged in (`WANDB_API_KEY`, or `wandb login`'s entry
in ~/.netrc); `WANDB_MODE` overrides. Offline, the run's records go to
`<run dir>/wandb/offline-run-*/run-<id>.wandb`; upload them later with
`wandb sync <run dir>/wandb/offline-run-*`. Project: `WANDB_PROJECT`, default `tepo`.

The run's W&B id is kept in `<run dir>/wandb/run_id`: a resumed run logs to the same id (online
with `resume="allow"`; offline each process writes its own offline-run directory of that id, and
`wandb sync` uploads them into one run)."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tepo_cli.trackers.tracker import Outcome, read_id, run_name, save_id

NAME = "wandb"
REQUIRES = "wandb"


class WandbTracker:
    def __init__(self) -> None:
        self._run: Any = None

    def start(self, run_dir: Path, config: dict[str, Any], resume: int | None) -> None:
        import wandb

        id_file = run_dir / NAME / "run_id"
        run_id = read_id(id_file)  # None: W&B makes one, saved below
        mode = os.environ.get("WANDB_MODE") or ("online" if logged_in() else "offline")
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "tepo",
            name=run_name(run_dir),
            id=run_id,
            dir=str(run_dir),
            config=config,
            allow_val_change=True,  # a resume may change trainer.max_steps and the like
            mode=mode,
            # Offline there is no server to resume from (W&B warns and ignores it).
            resume="allow" if mode == "online" else None,
        )
        if run_id is None:
            save_id(id_file, self._run.id)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self, outcome: Outcome) -> None:
        self._run.finish(exit_code=0 if outcome == "finished" else 1)


def logged_in() -> bool:
    """An API key in the environment, or a ~/.netrc (`NETRC`) entry for the W&B host, as
    `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def build() -> WandbTracker:
    return WandbTracker()
