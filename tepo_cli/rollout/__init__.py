"""Rollout back-ends by name. `rollout.backend` (conf/rollout/<name>.yaml) picks one; train and
eval call only the `RolloutBackend` interface (rollout/backend.py).

A back-end is one module in this package (or a plugin file that calls `register_backend`) plus
its YAML in conf/rollout/: the module names itself (`NAME`, the value of `rollout.backend`), says
what it needs beyond tepo's own requirements (`REQUIRES`, a package, and `INSTALL`, how to get it;
None for nothing), and has a class that implements the interface and a `build` function with the
signature of `build_backend` below. Nothing else lists the back-ends.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tepo_cli.config.schema import RolloutConfig
from tepo_cli.core.discovery import ModuleRegistry
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.rollout.backend import OnPolicyDevice, RolloutBackend, Sampling
from tepo_cli.rollout.stop_rule import stop_rule

__all__ = [
    "Rollout",
    "RolloutBackend",
    "Sampling",
    "backends",
    "build_backend",
    "check_backend",
    "register_backend",
    "stop_rule",
]


_BACKENDS = ModuleRegistry(
    __name__,
    "a rollout back-end",
    "rollout.backend='{name}' is not a rollout back-end; known: {known} (each is a module in "
    "tepo_cli/rollout/ with that NAME, or a plugin module passed to register_backend).",
)
backends = _BACKENDS.all  # every back-end module by its NAME: this package's, then the registered
register_backend = _BACKENDS.register  # add one from a plugin file (`plugins=[...]`)


def check_backend(cfg: RolloutConfig) -> None:
    """Refuse an unknown back-end, or one whose package is absent, before any model loads."""
    module = _BACKENDS.get(cfg.backend)
    package = getattr(module, "REQUIRES", None)
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"rollout={cfg.backend} needs the {package} package, which is not installed in this "
            f"environment ({sys.executable}). Install it with {module.INSTALL}, or generate with "
            f"rollout=hf, which needs nothing more."
        )


def build_backend(
    cfg: RolloutConfig,
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    share_prompts: bool,
    device: torch.device,
) -> RolloutBackend:
    """The back-end `cfg.backend`, generating with `lm`'s weights (in its own engine, or with
    `lm` itself), its rollouts on `device`: the policy's compute device (named, not read off
    `lm`'s parameters, which ZeRO-3 may partition or offload to the host)."""
    check_backend(cfg)
    backend = backends()[cfg.backend].build(cfg, lm, tokenizer, share_prompts)
    return OnPolicyDevice(backend, device)
