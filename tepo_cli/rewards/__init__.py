"""Verifiable rewards: (completion, problem) -> RewardResult, one grader per module.

Graders are found, not listed: every module of this package that defines `GRADER` (a `Grader`)
is one, and a plugin file (`plugins=[...]`) may add more with `register_grader`. `reward=<name>`
picks one; `reward=auto` the benchmark's own (tepo_cli.benchmarks). `make_reward(cfg, name)`
returns a `Reward`: call it on one completion, or `score_many` on a step's or an evaluation's
completions (code runs concurrently in the sandbox).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.discovery import Registry
from tepo_cli.core.records import Problem, RewardResult

if TYPE_CHECKING:
    from tepo_cli.rewards.terms import RewardTerm

__all__ = ["Grader", "Reward", "RewardResult", "graders", "make_reward", "register_grader"]

ScoreMany = Callable[[Sequence[str], Sequence[Problem]], list[RewardResult]]


@dataclass(frozen=True)
class Grader:
    """A grader: `build(cfg)` makes its batch scorer from the reward group's settings;
    `same_answer` compares two extracted answers for majority voting (None: nothing to vote on,
    e.g. code); a grader whose comparison depends on its settings (gsm8k's `reward.mode`) gives
    `same_answer_for(cfg)` instead."""

    name: str
    build: Callable[[RewardConfig], ScoreMany]
    same_answer: Callable[[str, str], bool] | None = None
    same_answer_for: Callable[[RewardConfig], Callable[[str, str], bool]] | None = None

    def answer_matcher(self, cfg: RewardConfig) -> Callable[[str, str], bool] | None:
        """How two extracted answers compare under `cfg`'s settings (None: no answers)."""
        if self.same_answer_for is not None:
            return self.same_answer_for(cfg)
        return self.same_answer


class Reward:
    """A grader with its settings; `score_many` grades a batch (in input order). `terms`: the
    reward terms training adds to its reward (rewards/terms.py; evaluations ignore them)."""

    def __init__(
        self,
        name: str,
        score_many: ScoreMany,
        cfg: RewardConfig,
        terms: tuple[RewardTerm, ...] = (),
    ) -> None:
        self.name = name
        self.score_many = score_many
        self.cfg = cfg
        self.terms = terms

    def __call__(self, completion: str, problem: Problem) -> RewardResult:
        return self.score_many([completion], [problem])[0]


def one_by_one(score: Callable[[str, Problem], RewardResult]) -> ScoreMany:
    """A batch scorer from a scorer of one completion."""

    def score_many(completions: Sequence[str], problems: Sequence[Problem]) -> list[RewardResult]:
        return [score(c, p) for c, p in zip(completions, problems, strict=True)]

    return score_many


def _defined(module: ModuleType) -> list[Grader]:
    grader = getattr(module, "GRADER", None)
    return [grader] if isinstance(grader, Grader) else []


_GRADERS = Registry(
    __name__,
    _defined,
    lambda grader: grader.name,
    "reward={name} is not a grader; the graders are: auto (the benchmark's own), {known}. A grader "
    "is a module of tepo_cli/rewards/ defining GRADER, or register_grader(...) in a file listed in "
    "plugins=[...].",
)
register_grader = _GRADERS.register  # add one from a plugin file
graders = _GRADERS.all  # every grader by name: this package's GRADERs, then the registered
get_grader = _GRADERS.get


def make_reward(cfg: RewardConfig, name: str) -> Reward:
    """The named grader (not `auto`: tepo_cli.benchmarks resolves that) with `cfg`'s settings."""
    from tepo_cli.rewards.terms import load_terms

    return Reward(name, get_grader(name).build(cfg), cfg, load_terms(cfg))
