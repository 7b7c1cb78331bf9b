"""Verifiable rewards: pure functions of (completion, problem) -> RewardResult."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tepo_cli.config.schema import RewardConfig
from tepo_cli.data.arith import Problem
from tepo_cli.rewards import arith
from tepo_cli.rewards.custom import load_user_function


@dataclass(frozen=True)
class RewardResult:
    reward: float
    correct: bool
    extracted: str | None


RewardFn = Callable[[str, Problem], RewardResult]


def build_reward(cfg: RewardConfig) -> RewardFn:
    if cfg.name == "arith":

        def score_arith(completion: str, problem: Problem) -> RewardResult:
            correct, extracted = arith.is_correct(completion, problem.answer)
            return RewardResult(cfg.correct if correct else cfg.incorrect, correct, extracted)

        return score_arith
    assert cfg.path and cfg.function  # guaranteed by RewardConfig validation
    user_function = load_user_function(cfg.path, cfg.function)

    def score_custom(completion: str, problem: Problem) -> RewardResult:
        value = user_function(completion, problem)
        if isinstance(value, bool):
            return RewardResult(cfg.correct if value else cfg.incorrect, value, None)
        reward = float(value)
        return RewardResult(reward, reward == cfg.correct, None)

    return score_custom
