"""Shared fixtures: composed configs and the tiny in-process model (SmolLM2's tokenizer)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def compose_config() -> Callable[..., DictConfig]:
    """compose_config("train", ["model=tiny", ...]) -> the DictConfig Hydra would build."""

    def _compose(name: str = "train", overrides: list[str] | None = None) -> DictConfig:
        with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
            return compose(config_name=name, overrides=overrides or [])

    return _compose


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tepo_cli.models.loading import load_tokenizer

    return load_tokenizer(_tiny_model_config())


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    from tepo_cli.models.loading import load_model

    return load_model(_tiny_model_config(), tiny_tokenizer, torch.device("cpu"))


def _tiny_model_config():
    from tepo_cli.config.schema import ModelConfig

    return ModelConfig(name="tiny", source="tiny", tokenizer="smollm2_135m", dtype="float32")
