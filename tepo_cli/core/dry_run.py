"""`tepo train --dry-run` / `tepo eval --dry-run`: the configuration validated, with its
shorthands applied (`k=4` as algo.unit=block, algo.k=4; null thread counts resolved), printed as
the run would use it; nothing is loaded, trained or written.

Hydra's `--cfg job` prints the composition before any of that: `algo=mpo k=4` shows algo.k: 5
there, and `trainer.lr=abc` exits 0.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from pydantic import BaseModel

ENV = "TEPO_DRY_RUN"

# The shape of the random model `model=tiny` builds: read by nothing else, so left out of the
# printout of another preset (SmolLM2-135M is not a 64-wide model).
TINY_ONLY = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "init_seed",
)


def shown(config: BaseModel) -> dict[str, Any]:
    """The config as the run would use it, without the keys its model preset does not read."""
    values = config.model_dump(mode="json")
    model = values.get("model")
    if isinstance(model, dict) and model.get("source") != "tiny":
        values["model"] = {key: value for key, value in model.items() if key not in TINY_ONLY}
    return values


def dry_run(config: BaseModel, command: str) -> bool:
    """Print `config` and say so when this is a dry run; False otherwise."""
    if os.environ.get(ENV) != "1":
        return False
    text = yaml.safe_dump(shown(config), sort_keys=False, width=100)
    print(f"# tepo {command} --dry-run: the configuration is valid; the run would use:")
    print(text, end="")
    return True
