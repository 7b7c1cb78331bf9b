"""The policy objectives (docs/objectives.md): loss plugins built from small shared parts.

`policy_loss` is the public entry point; `register_policy_loss` adds an objective.

The names below are loaded on first access (PEP 562), so that `tepo_cli.algos.algo_config` (the typed
config the CLI validates at start-up) can be imported without importing torch. Any access also
registers the shipped objectives first, so a user's plugin never races them for a name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AlgoConfig": "tepo_cli.algos.algo_config",
    "PolicyBatch": "tepo_cli.algos.batch",
    "get_policy_loss": "tepo_cli.algos.registry",
    "estimate_advantages": "tepo_cli.algos.advantage",
    "group_advantages": "tepo_cli.algos.advantage",
    "reinforce_pp_advantages": "tepo_cli.algos.advantage",
    "rloo_advantages": "tepo_cli.algos.advantage",
    "informative_groups": "tepo_cli.algos.filtering",
    "load_preset": "tepo_cli.algos.presets",
    "objective_reads": "tepo_cli.algos.registry",
    "checked_batch": "tepo_cli.algos.batch",
    "overlong_penalty": "tepo_cli.algos.overlong",
    "policy_loss": "tepo_cli.algos.api",
    "preset_names": "tepo_cli.algos.presets",
    "register_policy_loss": "tepo_cli.algos.registry",
    "registered_policy_losses": "tepo_cli.algos.registry",
    "resolve_algo": "tepo_cli.algos.presets",
    "resolve_overlong_lengths": "tepo_cli.algos.overlong",
}

__all__ = [
    "AlgoConfig",
    "PolicyBatch",
    "checked_batch",
    "estimate_advantages",
    "get_policy_loss",
    "group_advantages",
    "informative_groups",
    "load_preset",
    "objective_reads",
    "overlong_penalty",
    "policy_loss",
    "preset_names",
    "register_policy_loss",
    "registered_policy_losses",
    "reinforce_pp_advantages",
    "resolve_algo",
    "resolve_overlong_lengths",
    "rloo_advantages",
]

if TYPE_CHECKING:
    from tepo_cli.algos.advantage import (
        estimate_advantages,
        group_advantages,
        reinforce_pp_advantages,
        rloo_advantages,
    )
    from tepo_cli.algos.algo_config import AlgoConfig
    from tepo_cli.algos.api import policy_loss
    from tepo_cli.algos.batch import PolicyBatch, checked_batch
    from tepo_cli.algos.filtering import informative_groups
    from tepo_cli.algos.overlong import overlong_penalty, resolve_overlong_lengths
    from tepo_cli.algos.presets import load_preset, preset_names, resolve_algo
    from tepo_cli.algos.registry import (
        get_policy_loss,
        objective_reads,
        register_policy_loss,
        registered_policy_losses,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tepo_cli.algos' has no attribute {name!r}")
    importlib.import_module("tepo_cli.algos.objectives")
    importlib.import_module("tepo_cli.algos.cov_objectives")
    importlib.import_module("tepo_cli.algos.cispo")
    importlib.import_module("tepo_cli.algos.sapo")
    importlib.import_module("tepo_cli.algos.gmpo")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
