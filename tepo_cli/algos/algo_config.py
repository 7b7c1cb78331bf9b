"""Typed knobs of an objective (docs/objectives.md §0.7): one model for every preset in conf/algo/.

The YAML files in conf/algo/ document each knob (a comment per key); this model holds only types,
ranges and the rules that tie knobs together, each with a message that says what to change.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

COV_OBJECTIVES = ("kl_cov", "clip_cov")
"""The objectives that select tokens by covariance (algos/covariance.py, §1.6)."""
TOKEN_ONLY = (*COV_OBJECTIVES, "gmpo")
"""The objectives that read single tokens' ratios whatever `unit` says: they refuse another."""

Unit = Literal["token", "block", "sequence"]
LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]

_NUMBER = r"\d+(\.\d*)?([eE][-+]?\d+)?"
_BLOCK_WEIGHTS = re.compile(
    rf"^(uniform|decay:{_NUMBER},{_NUMBER}|future:(0(\.\d+)?|1(\.0+)?)|geometric:{_NUMBER})$"
)
MaskCriterion = Literal["covariance", "entropy_drop", "advantage_only", "first_order"]


def decay_first_weight(beta2: float, decay: float, k: int) -> float:
    """β_1 of MPO's `decay:β₂,λ` weights (Eq. 10): 1 − Σ_{n=2..K} β₂·λ^(n−2)."""
    return 1.0 - sum(beta2 * decay**j for j in range(k - 1))


class MtpWarmupConfig(BaseModel):
    """Warm-up of the MTP modules before the first RL step, the backbone frozen (§1.5)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # auto: sized by mtp/warmup_size.py (none on a random backbone, at most 30 and never
    # more sequences than the RL run samples); an integer always wins.
    steps: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    lr: float = Field(default=3e-4, gt=0.0)
    batch_size: int = Field(default=16, ge=1)
    alpha_decay: float = Field(default=0.8, gt=0.0, le=1.0)
    data: Literal["auto", "solutions", "samples"] = "auto"
    log_every: int = Field(default=5, ge=1)


class MtpConfig(BaseModel):
    """MPO's multi-token-prediction modules (`future=mtp`, docs/objectives.md §1.5)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    head: Literal["copy", "shared"] = "copy"
    trainable: bool = True
    backbone_grad: bool = True
    aux_coef: float = Field(default=0.0, ge=0.0)
    warmup: MtpWarmupConfig = Field(default_factory=MtpWarmupConfig)

    @model_validator(mode="after")
    def _check_aux(self) -> MtpConfig:
        if self.aux_coef > 0 and not self.trainable:
            raise ValueError(
                f"mtp.aux_coef={self.aux_coef} trains the MTP modules, but mtp.trainable=false "
                "freezes them: set mtp.trainable=true or mtp.aux_coef=0"
            )
        return self


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
    eps_low: float = Field(default=0.2, ge=0.0, le=1.0)
    eps_high: float = Field(default=0.2, ge=0.0)
    dual_clip: float | None = Field(default=None, gt=1.0)
    loss_agg: LossAgg = "token-mean"
    beta: float = Field(default=0.0, ge=0.0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_target: Literal["ref", "old"] = "ref"
    kl_mask: Literal["none", "tepo"] = "none"
    kl_bias_correction: bool = False
    # The KL in the reward (docs/objectives.md §0.14), for every estimator: 0 is off; with
    # kl_reward_target set, the coefficient adapts (the first step's is kl_reward_coef).
    kl_reward_coef: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    kl_reward_estimator: Literal["k1", "k2", "k3"] = "k1"
    kl_reward_target: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    kl_reward_horizon: int = Field(default=10000, ge=1)
    mask_criterion: MaskCriterion = "covariance"
    block_weights: str = "uniform"
    tail: Literal["drop", "renormalise"] = "drop"
    future: Literal["exact", "mtp"] = "exact"
    mtp: MtpConfig = Field(default_factory=MtpConfig)
    # KL-Cov and Clip-Cov (docs/objectives.md §1.6), read by those objectives only.
    cov_fraction: float = Field(default=2e-4, ge=0.0, le=1.0)
    cov_coef: float = Field(default=0.1, ge=0.0)
    cov_lb: float = 1.0
    cov_ub: float = 5.0
    # SAPO (docs/objectives.md §1.8), read by that objective only.
    tau_pos: float = Field(default=1.0, gt=0.0)
    tau_neg: float = Field(default=1.05, gt=0.0)
    # High-entropy tokens (docs/objectives.md §0.11), for every objective: 1 keeps every token,
    # 0 only the highest-entropy one (TRL's range).
    top_entropy_quantile: float = Field(default=1.0, ge=0.0, le=1.0)
    # The entropy bonus (§0.12), for every objective: −entropy_coef · agg(H) joins the loss.
    entropy_coef: float = Field(default=0.0, allow_inf_nan=False)
    # Off-policy sequence masking (§0.13), for every objective: null is off.
    off_policy_mask: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    # DAPO (docs/objectives.md §1.2), used by the training loop.
    dynamic_sampling: bool = False
    max_refill_rounds: int = Field(default=10, ge=1)
    overlong_penalty: bool = False
    overlong_max_len: int | None = Field(default=None, ge=1)
    overlong_cache_len: int | None = Field(default=None, ge=1)
    overlong_filter: bool = False

    @field_validator("block_weights")
    @classmethod
    def _check_block_weights(cls, value: str) -> str:
        if not _BLOCK_WEIGHTS.match(value):
            raise ValueError(
                "must be 'decay:b,l' (MPO's beta_2 and lambda, both >= 0), 'uniform', "
                "'future:p' with 0 <= p <= 1, or 'geometric:g' with g >= 0"
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
        if self.block_weights.startswith("decay:") and self.k is not None:
            beta2, decay = (float(x) for x in self.block_weights[len("decay:") :].split(","))
            first = decay_first_weight(beta2, decay, self.k)
            if first <= 0:
                raise ValueError(
                    f"block_weights={self.block_weights} with k={self.k} gives the future tokens "
                    f"a total weight of {1 - first:.4g}, so beta_1 = {first:.4g} <= 0: the "
                    "current token must keep a positive share. Lower beta_2, lambda or k (the "
                    "paper keeps the future share below 0.3; k=5 with decay:0.06,0.8 gives 0.177)"
                )
        if self.future == "mtp" and self.layout != "sliding":
            raise ValueError(
                "future=mtp reads the MTP modules at each window's anchor: it needs "
                f"layout=sliding (got layout={self.layout}, unit={self.unit}); use future=exact "
                "with disjoint blocks"
            )
        return self

    @model_validator(mode="after")
    def _check_cov(self) -> AlgoConfig:
        if self.cov_lb >= self.cov_ub:
            raise ValueError(
                f"cov_lb ({self.cov_lb}) must be smaller than cov_ub ({self.cov_ub}): Clip-Cov's "
                "candidates are the tokens with cov_lb < cov < cov_ub"
            )
        if self.name in TOKEN_ONLY and self.unit != "token":
            what = (
                "clips each token's ratio before their geometric mean"
                if self.name == "gmpo"
                else "selects single tokens by their covariance"
            )
            raise ValueError(
                f"{self.name} {what}: it needs unit=token (got unit={self.unit}); leave unit "
                "and k unset"
            )
        return self

    @model_validator(mode="after")
    def _check_no_surrogate(self) -> AlgoConfig:
        unclipped = {
            "cispo": "its clip bounds each token's detached weight to [1 - eps_low, 1 + eps_high]",
            "sapo": "a soft gate takes the clip's place",
        }
        if self.name in unclipped and self.dual_clip is not None:
            raise ValueError(
                f"dual_clip={self.dual_clip} bounds PPO's clipped surrogate where the advantage is "
                f"negative; {self.name} has no such surrogate ({unclipped[self.name]}): leave "
                "dual_clip unset"
            )
        return self

    @model_validator(mode="after")
    def _check_kl_reward(self) -> AlgoConfig:
        if self.kl_reward_target is not None and self.kl_reward_coef == 0:
            raise ValueError(
                f"kl_reward_target={self.kl_reward_target} adapts the KL-in-reward coefficient, "
                "which starts from kl_reward_coef: set kl_reward_coef > 0 (OpenRLHF's "
                "init_kl_coef; 0.01 is its default)"
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
        """A frozen reference model is loaded only when a KL term targets it: the loss's or the
        reward's."""
        return (self.beta > 0 and self.kl_target == "ref") or self.kl_reward_coef > 0

    @property
    def needs_old_entropy(self) -> bool:
        """TEPO's KL mask reads H_old (except advantage_only): score it in the rollout pass."""
        return self.beta > 0 and self.kl_mask == "tepo" and self.mask_criterion != "advantage_only"

    @property
    def needs_entropy(self) -> bool:
        """The entropy_drop criterion also reads the current policy's entropy H."""
        return self.needs_old_entropy and self.mask_criterion == "entropy_drop"

    @property
    def needs_old_entropy_term(self) -> bool:
        """The first_order criterion reads S_old = Σ_j p_j²(log p_j + H) (a vocabulary sum)."""
        return self.needs_old_entropy and self.mask_criterion == "first_order"

    @property
    def covariance_selection(self) -> bool:
        """KL-Cov and Clip-Cov pick tokens by covariance, once per optimizer step in training
        (train/cov_selection.py), which needs π_old's log-probs before the step's forwards."""
        return self.name in COV_OBJECTIVES

    @property
    def entropy_selection(self) -> bool:
        """Only the top `top_entropy_quantile` of tokens by π_old's entropy carry the policy
        term (algos/high_entropy.py), picked once per optimizer step in training."""
        return self.top_entropy_quantile < 1.0

    @property
    def auxiliary_loss(self) -> bool:
        """A loss term beside the objective that trains on every row, whatever its advantage:
        MPO's prediction loss (`mtp.aux_coef` > 0 with future=mtp), the entropy bonus."""
        return bool(self.mtp_depths and self.mtp.aux_coef > 0) or self.entropy_coef != 0

    @property
    def mtp_depths(self) -> int:
        """MTP modules the objective reads: K − 1 with future=mtp (0 otherwise)."""
        if self.future != "mtp" or self.k is None:
            return 0
        return self.k - 1
