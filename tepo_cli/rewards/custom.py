"""Load a user's reward function from a Python file (`reward=custom`), in tepo's signature or
verl's. User code, trusted."""

from __future__ import annotations

import inspect
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


def as_scorer(function: Callable[..., Any]) -> Callable[[str, Problem], Any]:
    """`function` as `(completion, problem)`: tepo's own signature, or verl's
    `compute_score(data_source, solution_str, ground_truth, extra_info)` (recognised by its
    `solution_str` parameter) called by keyword as verl calls it: the completion, the problem's
    answer, and the record's `data_source` and `extra_info` fields where it has them
    (`benchmark=custom` keeps a record's fields), else None."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin or C function: tepo's signature
        return function
    if "solution_str" not in parameters:
        return function
    verl_names = ("data_source", "solution_str", "ground_truth", "extra_info")
    wanted = [name for name in verl_names if name in parameters]

    def verl_call(completion: str, problem: Problem) -> Any:
        fields = problem.extra.get("fields", {})
        given = {
            "data_source": fields.get("data_source"),
            "solution_str": completion,
            "ground_truth": problem.answer,
            "extra_info": fields.get("extra_info"),
        }
        return function(**{name: given[name] for name in wanted})

    return verl_call


def _build(cfg: RewardConfig) -> ScoreMany:
    """`reward.function` of `reward.path`: `(completion, problem)` (or verl's signature,
    `as_scorer`) -> bool (correct or not), a number (the reward; correct when it equals
    `reward.correct`), or verl's dict with the reward under "score" (and "acc", if there, says
    whether it is correct)."""
    assert cfg.path and cfg.function  # RewardConfig refuses reward=custom without them
    user_function = as_scorer(load_user_function(cfg.path, cfg.function))

    def score(completion: str, problem: Problem) -> RewardResult:
        value = user_function(completion, problem)
        if isinstance(value, bool):
            return RewardResult(cfg.correct if value else cfg.incorrect, value, None)
        if isinstance(value, dict) and "score" in value:
            reward = float(value["score"])
            correct = bool(value["acc"]) if "acc" in value else reward == cfg.correct
            return RewardResult(reward, correct, None)
        reward = float(value)
        return RewardResult(reward, reward == cfg.correct, None)

    return one_by_one(score)


GRADER = Grader("custom", _build)
