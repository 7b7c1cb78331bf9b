"""Truncated sampling in training is refused unless accepted knowingly (docs/objectives.md §0.9):
the trainer's log-probs are the full softmax's, so the ratio would ignore the truncation."""

from __future__ import annotations

import pytest

from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError


@pytest.mark.parametrize("sampler", [["rollout.top_p=0.9"], ["rollout.top_k=20"]])
def test_a_truncated_sampler_is_refused_by_default(compose_config, sampler):
    with pytest.raises(ConfigError) as caught:
        load_train_config(compose_config("train", ["model=tiny", *sampler]))
    message = str(caught.value)
    assert "sample from a truncated distribution" in message
    assert "rollout.truncated_sampling=biased" in message and "§0.9" in message


@pytest.mark.parametrize("rollout", ["hf", "vllm"])
def test_accepted_knowingly_it_trains(compose_config, rollout):
    overrides = ["model=tiny", f"rollout={rollout}", "rollout.top_p=0.9", "rollout.top_k=20"]
    config = load_train_config(
        compose_config("train", [*overrides, "rollout.truncated_sampling=biased"])
    )
    assert (config.rollout.top_p, config.rollout.top_k) == (0.9, 20)


def test_the_full_distribution_passes(compose_config):
    config = load_train_config(compose_config("train", ["model=tiny"]))
    assert (config.rollout.top_p, config.rollout.top_k) == (1.0, 0)
