"""Verifiable rewards: (completion, problem) -> RewardResult, one per grader.

`build_reward(reward_cfg, benchmark_cfg)` returns a `Reward`: call it on one completion, or
`score_many` on a step's or an evaluation's completions (code runs concurrently in the sandbox).
`reward=auto` picks the benchmark's own grader (arith, gsm8k strict, math-verify, sandboxed tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.core.records import Problem, RewardResult

if TYPE_CHECKING:
    from tepo_cli.rewards.code import CodeGrade


RewardFn = Callable[[str, Problem], RewardResult]


class Reward:
    """A grader with its settings; `score_many` grades a batch (in input order)."""

    def __init__(self, name: str, score_one: RewardFn, cfg: RewardConfig) -> None:
        self.name = name
        self._score_one = score_one
        self.cfg = cfg

    def __call__(self, completion: str, problem: Problem) -> RewardResult:
        return self.score_many([completion], [problem])[0]

    def score_many(
        self, completions: Sequence[str], problems: Sequence[Problem]
    ) -> list[RewardResult]:
        if self.name == "code":
            return _score_code(completions, problems, self.cfg)
        return [self._score_one(c, p) for c, p in zip(completions, problems, strict=True)]


def build_reward(cfg: RewardConfig, benchmark: BenchmarkConfig) -> Reward:
    name = benchmark.grader if cfg.name == "auto" else cfg.name
    return Reward(name, _scorer(name, cfg), cfg)


def _scorer(name: str, cfg: RewardConfig) -> RewardFn:
    correct, incorrect = cfg.correct, cfg.incorrect
    if name == "arith":
        from tepo_cli.rewards.arith import is_correct

        def score_arith(completion: str, problem: Problem) -> RewardResult:
            ok, extracted = is_correct(completion, problem.answer)
            return RewardResult(correct if ok else incorrect, ok, extracted)

        return score_arith
    if name == "gsm8k":
        from tepo_cli.rewards.gsm8k import score_gsm8k

        return lambda c, p: score_gsm8k(c, p, mode=cfg.mode, correct=correct, incorrect=incorrect)
    if name == "math":
        from tepo_cli.rewards.math import score_math

        timeout = max(1, round(cfg.timeout_s))
        return lambda c, p: score_math(
            c, p, timeout_s=timeout, correct=correct, incorrect=incorrect
        )
    if name == "code":
        return lambda c, p: _score_code([c], [p], cfg)[0]
    assert cfg.path and cfg.function  # RewardConfig validation: custom needs both
    from tepo_cli.rewards.custom import load_user_function

    user_function = load_user_function(cfg.path, cfg.function)

    def score_custom(completion: str, problem: Problem) -> RewardResult:
        value = user_function(completion, problem)
        if isinstance(value, bool):
            return RewardResult(correct if value else incorrect, value, None)
        reward = float(value)
        return RewardResult(reward, reward == correct, None)

    return score_custom


def _score_code(
    completions: Sequence[str], problems: Sequence[Problem], cfg: RewardConfig
) -> list[RewardResult]:
    from tepo_cli.rewards.code import CodeProblem, grade_many
    from tepo_cli.rewards.sandbox import SandboxConfig, SandboxLimits

    sandbox = SandboxConfig(limits=SandboxLimits(wall_time_s=cfg.timeout_s))
    grades: list[CodeGrade] = grade_many(
        [(c, CodeProblem.from_record(p.extra)) for c, p in zip(completions, problems, strict=True)],
        config=sandbox,
        correct=cfg.correct,
        incorrect=cfg.incorrect,
    )
    return [RewardResult(g.reward, g.correct, g.extracted) for g in grades]
