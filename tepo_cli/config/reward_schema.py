"""The `reward` group: the grader that says whether an answer is right, and the reward terms
added to its reward in training (`reward.terms`, tepo_cli/rewards/terms.py)."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tepo_cli.config.strict import Strict

_TERM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RewardTermConfig(Strict):
    """One term of `reward.terms`: `weight` times `function(completion, problem)` of `path`."""

    path: str = Field(min_length=1)
    function: str = Field(default="score", min_length=1)
    weight: float = 1.0

    @field_validator("weight")
    @classmethod
    def _finite(cls, weight: float) -> float:
        if not math.isfinite(weight):
            raise ValueError(f"a reward term's weight must be a finite number, got {weight}")
        return weight


class RewardConfig(Strict):
    name: str = Field(min_length=1)  # auto or a grader (tepo_cli.rewards, checked at start)
    correct: float = 1.0
    incorrect: float = 0.0
    mode: Literal["strict", "flexible", "numeric"] = "strict"  # gsm8k: lm-eval's two, or numeric
    timeout_s: float = Field(default=10.0, gt=0.0)
    path: str | None = None
    function: str | None = None
    terms: dict[str, RewardTermConfig] = Field(default_factory=dict)

    @field_validator("terms")
    @classmethod
    def _term_names(cls, terms: dict[str, RewardTermConfig]) -> dict[str, RewardTermConfig]:
        for name in terms:
            if not _TERM_NAME.match(name):
                raise ValueError(
                    f"reward.terms.{name}: a term's name is a metric's name "
                    f"(reward_term_{name}_mean): letters, digits and underscores, not first a digit"
                )
        return terms

    @model_validator(mode="after")
    def _check_custom(self) -> RewardConfig:
        if self.name == "custom" and not (self.path and self.function):
            raise ValueError("reward=custom needs reward.path (a .py file) and reward.function")
        if self.correct <= self.incorrect:
            raise ValueError(
                f"reward.correct ({self.correct}) must be larger than reward.incorrect "
                f"({self.incorrect})"
            )
        return self
