"""Typed knobs of an objective (ALGORITHMS.md §0.7): one model for every preset in conf/algo/."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Unit = Literal["token", "block", "sequence"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

_BLOCK_WEIGHTS = re.compile(r"^(uniform|future:(0(\.\d+)?|1(\.0+)?)|geometric:\d+(\.\d+)?)$")


class AlgoConfig(BaseModel):
    """The objective: which units form an action, how ratios are clipped and aggregated, the KL."""

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

    @field_validator("block_weights")
    @classmethod
    def _check_block_weights(cls, value: str) -> str:
        if not _BLOCK_WEIGHTS.match(value):
            raise ValueError("must be 'uniform', 'future:p' with 0 <= p <= 1, or 'geometric:g' with g >= 0")
        return value

    @model_validator(mode="after")
    def _check_units(self) -> AlgoConfig:
        if self.unit == "block" and self.k is None:
            raise ValueError("unit=block needs a block size: set k (e.g. k=4)")
        return self

    @property
    def block_size(self) -> int | None:
        """Tokens per action unit: 1 for token units, K for blocks, None (whole response) for sequences."""
        if self.unit == "token":
            return 1
        if self.unit == "block":
            return self.k
        return None

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is loaded only when a KL term targets it."""
        return self.beta > 0 and self.kl_target == "ref"
