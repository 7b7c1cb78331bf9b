"""trainer.max_steps counts training steps (one rollout each) and trainer.warmup_steps optimizer
steps, ppo_epochs x minibatches of them per training step: the check between them uses one unit."""

from __future__ import annotations

import pytest

from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.minibatches=2", "trainer.warmup_steps=40", "trainer.max_steps=30"],  # 60 steps
        ["recipe=dapo_math", "trainer.max_steps=100"],  # warm-up 320 of 1,600 optimizer steps
        [
            "trainer.ppo_epochs=2",
            "trainer.minibatches=2",
            "trainer.warmup_steps=8",
            "trainer.max_steps=2",
        ],
    ],
)
def test_a_warm_up_within_the_runs_optimizer_steps_is_valid(compose_config, overrides):
    config = load_train_config(compose_config("train", ["model=tiny", *overrides]))
    assert config.trainer.warmup_steps <= (
        config.trainer.max_steps * config.trainer.ppo_epochs * config.trainer.minibatches
    )


def test_a_warm_up_longer_than_the_run_names_both_units(compose_config):
    overrides = [
        "model=tiny",
        "trainer.minibatches=2",
        "trainer.warmup_steps=61",
        "trainer.max_steps=30",
    ]
    with pytest.raises(ConfigError) as caught:
        load_train_config(compose_config("train", overrides))
    message = str(caught.value)
    assert (
        "trainer.warmup_steps=61 (optimizer steps) exceeds the run's 60 optimizer steps" in message
    )
    assert "trainer.max_steps=30 training steps x ppo_epochs=1 x minibatches=2" in message
