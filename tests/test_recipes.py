"""Recipes (`tepo train recipe=NAME`): each composes, validates, and yields to the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tepo_cli.config.overrides import check_override_keys, config_groups
from tepo_cli.config.validate import load_train_config

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))


def test_recipes_are_the_recipe_config_group():
    assert {"cpu_compare", "dapo_math", "gspo_math", "tepo_math", "mpo_math"} <= set(RECIPES)
    # conf/recipe is a link to the top-level recipes/, so Hydra finds them as a config group.
    assert (ROOT / "conf" / "recipe").resolve() == (ROOT / "recipes").resolve()
    assert "recipe" in config_groups()
    check_override_keys("train", ["recipe=dapo_math"])  # a group, not a schema key


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_validates(compose_config, name):
    text = (ROOT / "recipes" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    assert "[ours]" in text or "our choice" in text  # says which numbers are not the paper's
    config = load_train_config(compose_config("train", [f"recipe={name}"]))
    assert config.trainer.max_steps > 0


def test_recipe_values_and_command_line_precedence(compose_config):
    config = load_train_config(compose_config("train", ["recipe=dapo_math"]))
    assert (config.algo.name, config.algo.eps_high, config.rollout.n) == ("dapo", 0.28, 16)
    assert (config.trainer.lr, config.trainer.minibatches) == (1e-6, 16)
    assert config.model.path == "Qwen/Qwen2.5-32B" and config.algo.overlong_cache_len == 4096

    overridden = load_train_config(
        compose_config(
            "train",
            ["recipe=dapo_math", "algo=grpo", "model=tiny", "trainer.lr=3e-6", "rollout.n=4"],
        )
    )
    assert (overridden.algo.name, overridden.model.name) == ("grpo", "tiny")
    assert (overridden.trainer.lr, overridden.rollout.n) == (3e-6, 4)
    assert overridden.trainer.prompts_per_step == 512  # what the command line left alone stays


def test_recipe_k_on_the_command_line(compose_config):
    config = load_train_config(compose_config("train", ["recipe=mpo_math", "k=8"]))
    assert (config.algo.name, config.algo.unit, config.algo.k) == ("mpo", "block", 8)


def test_cpu_compare_is_the_default_task(compose_config):
    default = load_train_config(compose_config("train", []))
    recipe = load_train_config(compose_config("train", ["recipe=cpu_compare", "algo=tepo"]))
    assert recipe.algo.name == "tepo"
    assert recipe.model == default.model and recipe.benchmark == default.benchmark
    assert recipe.rollout == default.rollout
    assert (recipe.trainer.max_steps, recipe.trainer.lr) == (30, 1e-5)
