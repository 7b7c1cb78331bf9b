"""Load a user's reward function from a Python file (`reward=custom`). User code, trusted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.core.user_code import import_user_code
from tepo_cli.rewards import Grader, ScoreMany, one_by_one


def load_user_function(path: str, name: str, key: str = "reward") -> Callable[..., Any]:
    """Function `name` of the file (or module) `path`; `key` prefixes the config keys named in
    errors (`reward.path`, `reward.terms.<name>.path`)."""
    module = import_user_code(path, f"{key}.path")
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(
            f"{key}.function='{name}' is not a function in {path}; the functions there are: "
            f"{', '.join(found) or 'none'}."
        )
    return function


def _build(cfg: RewardConfig) -> ScoreMany:
    """`reward.function` of `reward.path`: `(completion, problem)` -> bool (correct or not) or a
    number (the reward; correct when it equals `reward.correct`)."""
    assert cfg.path and cfg.function  # RewardConfig refuses reward=custom without them
    user_function = load_user_function(cfg.path, cfg.function)

    def score(completion: str, problem: Problem) -> RewardResult:
        value = user_function(completion, problem)
        if isinstance(value, bool):
            return RewardResult(cfg.correct if value else cfg.incorrect, value, None)
        reward = float(value)
        return RewardResult(reward, reward == cfg.correct, None)

    return one_by_one(score)


GRADER = Grader("custom", _build)
