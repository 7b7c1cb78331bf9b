"""`tepo train --dry-run` / `tepo eval --dry-run`: the configuration validated, with its
shorthands applied (`k=4` as algo.unit=block, algo.k=4; null thread counts resolved), printed as
the run would use it; nothing is loaded, trained or written.

Hydra's `--cfg job` prints the composition before any of that: `algo=mpo k=4` shows algo.k: 5
there, and `trainer.lr=abc` exits 0.
"""

from __future__ import annotations

import os

import yaml
from pydantic import BaseModel

ENV = "TEPO_DRY_RUN"


def dry_run(config: BaseModel, command: str) -> bool:
    """Print `config` and say so when this is a dry run; False otherwise."""
    if os.environ.get(ENV) != "1":
        return False
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, width=100)
    print(f"# tepo {command} --dry-run: the configuration is valid; the run would use:")
    print(text, end="")
    return True
