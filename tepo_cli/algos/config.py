"""Typed knobs of an objective (ALGORITHMS.md §0.7): one model for every preset in conf/algo/.

The YAML files in conf/algo/ document each knob (a comment per key); this model holds only types,
ranges and the rules that tie knobs together, each with a message that says what to change.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Unit = Literal["token", "block", "sequence"]
LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]

_BLOCK_WEIGHTS = re.compile(r"^(uniform|future:(0(\.\d+)?|1(\.0+)?)|geometric:\d+(\.\d+)?)$")


class AlgoConfig(BaseModel):
    """The objective: which units form an action, how ratios are clipped and aggregated, the KL.

    The DAPO knobs at the end (dynamic sampling, overlong punishment, ±1 correctness reward) are
    read by the training loop, not by `policy_loss`.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(min_length=1)
    unit: Unit = "token"
    k: int | None = Field(default=None, ge=1)
    layout: Literal["disjoint", "sliding"] = "disjoint"
    ratio_norm: Literal["sum", "mean"] = "sum"
    route: Literal["unit", "token"] = "unit"
    eps_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    eps_high: float = Field(default=0.2, ge=0.0)
    dual_clip: float | None = Field(default=None, gt=1.0)
    loss_agg: LossAgg = "token-mean"
    advantage_scale: Literal["std", "none"] = "std"
    beta: float = Field(default=0.0, ge=0.0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_target: Literal["ref", "old"] = "ref"
    kl_mask: Literal["none", "tepo"] = "none"
    mask_criterion: Literal["covariance", "entropy_drop"] = "covariance"
    block_weights: str = "uniform"
    # DAPO (ALGORITHMS.md §1.2), used by the training loop.
    dynamic_sampling: bool = False
    max_refill_rounds: int = Field(default=10, ge=1)
    overlong_penalty: bool = False
    overlong_max_len: int | None = Field(default=None, ge=1)
    overlong_cache_len: int | None = Field(default=None, ge=1)
    reward_correct: float | None = None
    reward_incorrect: float | None = None

    @field_validator("block_weights")
    @classmethod
    def _check_block_weights(cls, value: str) -> str:
        if not _BLOCK_WEIGHTS.match(value):
            raise ValueError(
                "must be 'uniform', 'future:p' with 0 <= p <= 1, or 'geometric:g' with g >= 0"
            )
        return value

    @model_validator(mode="after")
    def _check_units(self) -> AlgoConfig:
        if self.unit == "block" and self.k is None:
            raise ValueError("unit=block needs a block size: set k (e.g. k=4)")
        if self.unit != "block" and self.k is not None:
            raise ValueError(
                f"k={self.k} is a block size, but unit={self.unit}: set unit=block to use "
                "K-token actions (or leave k unset)"
            )
        if self.layout == "sliding" and self.unit != "block":
            raise ValueError(
                f"layout=sliding needs unit=block with a window size k (got unit={self.unit})"
            )
        if self.block_weights != "uniform" and self.layout != "sliding":
            raise ValueError(
                f"block_weights={self.block_weights} weights the sliding window: it needs "
                "layout=sliding (disjoint blocks always sum their tokens)"
            )
        if self.block_weights != "uniform" and self.ratio_norm == "mean":
            raise ValueError(
                f"block_weights={self.block_weights} already averages the window (its weights "
                "sum to 1): use ratio_norm=sum with it"
            )
        return self

    @model_validator(mode="after")
    def _check_dapo(self) -> AlgoConfig:
        max_len, cache_len = self.overlong_max_len, self.overlong_cache_len
        if max_len is not None and cache_len is not None and cache_len >= max_len:
            raise ValueError(
                f"overlong_cache_len ({cache_len}) must be smaller than overlong_max_len "
                f"({max_len}): the punishment ramps over the last cache_len tokens"
            )
        if (self.reward_correct is None) != (self.reward_incorrect is None):
            raise ValueError(
                "set both reward_correct and reward_incorrect (e.g. 1 and -1), or neither"
            )
        if self.reward_correct is not None and self.reward_correct <= self.reward_incorrect:
            raise ValueError(
                f"reward_correct ({self.reward_correct}) must be larger than reward_incorrect "
                f"({self.reward_incorrect})"
            )
        return self

    @property
    def block_size(self) -> int | None:
        """Tokens per action unit: 1 for tokens, K for blocks, None (the whole response)."""
        if self.unit == "token":
            return 1
        if self.unit == "block":
            return self.k
        return None

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is loaded only when a KL term targets it."""
        return self.beta > 0 and self.kl_target == "ref"

    @property
    def needs_old_entropy(self) -> bool:
        """TEPO's KL mask reads H_old (both criteria): score it in the rollout pass."""
        return self.beta > 0 and self.kl_mask == "tepo"

    @property
    def needs_entropy(self) -> bool:
        """The entropy_drop criterion also reads the current policy's entropy H."""
        return self.needs_old_entropy and self.mask_criterion == "entropy_drop"
