"""Rollout back-ends by name. `rollout.backend` (conf/rollout/<name>.yaml) picks one; train and
eval call only the `RolloutBackend` interface (rollout/base.py).

A back-end is one module with a class that implements the interface and a `build` function with
the signature of `build_backend` below, plus its YAML in conf/rollout/ and its name in
`RolloutConfig.backend`.
"""

from __future__ import annotations

import importlib

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tepo_cli.config.schema import RolloutConfig
from tepo_cli.rollout.base import Rollout, RolloutBackend, Sampling

BACKENDS: dict[str, str] = {"hf": "tepo_cli.rollout.hf"}

__all__ = ["BACKENDS", "Rollout", "RolloutBackend", "Sampling", "build_backend"]


def build_backend(
    cfg: RolloutConfig, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, share_prompts: bool
) -> RolloutBackend:
    """The back-end `cfg.backend`, generating with `lm`'s weights (in its own engine, or with
    `lm` itself)."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"unknown rollout back-end {cfg.backend!r}; known: {', '.join(BACKENDS)}")
    module = importlib.import_module(BACKENDS[cfg.backend])
    return module.build(cfg, lm, tokenizer, share_prompts)
