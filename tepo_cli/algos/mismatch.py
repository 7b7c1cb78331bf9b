"""Rollout–training mismatch correction (docs/objectives.md §0.8).

An engine that is not the trainer (vLLM) samples with its own kernels: its log-probs ℓ^roll of
the sampled tokens differ from the trainer's ℓ^old for the same weights. The trainer keeps its own
ℓ^old as the ratio's denominator and reweights each token by w = exp(ℓ^old − ℓ^roll), or each
response by its product W = exp(Σ_t log w_t):

- `token_tis`: each token's policy-gradient term times sg[min(w_t, C)] (truncated IS; TRL's
  `token_truncate`);
- `token_mis`: times w_t, or 0 where w_t > C (masked IS; TRL's `token_mask`);
- `seq_tis`: every token of a response times min(W, C) (TRL's `sequence_truncate`);
- `seq_mis`: every token times W, or 0 for a response with W > C (TRL's `sequence_mask`);
- `seq_mask`: a response whose geometric-mean weight exp(mean_t log w_t) lies outside [1/C, C]
  is left out of the loss (weight 0), the others keep weight 1 (verl's geometric rejection);
- `none`: weight 1.

A floor F (`rollout.correction_floor`, TRL's `clip_min`, verl's lower threshold) bounds the
weight from below too: `*_tis` raise it to F, `*_mis` zero it below F, `seq_mask`'s band becomes
[F, C]. Unset, the TRL modes have no lower bound and `seq_mask`'s is 1/C, as each peer's default.

A response left out still counts in the normalisers. The weights go to `policy_loss(...,
token_weights=...)`, which multiplies each token's policy term by its weight (for a sequence or
block unit: the unit's surrogate, carried by each of its tokens, times that token's weight); the
KL penalty is not reweighted [our reading].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tepo_cli.algos.kl import kl_estimate

MODES = ("none", "token_tis", "token_mis", "seq_tis", "seq_mis", "seq_mask")
TOKEN_MODES = ("token_tis", "token_mis")  # a weight per token
PRODUCT_MODES = ("seq_tis", "seq_mis")  # one weight per response, the product of its tokens'


def correction_weights(
    old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    mode: str,
    cap: float,
    floor: float | None = None,
) -> Tensor:
    """[B, T] detached weights: 1 where nothing is corrected, 0 on padding."""
    if mode not in MODES:
        raise ValueError(
            f"mismatch correction mode must be one of {', '.join(MODES)}; got {mode!r}"
        )
    if not cap > 1.0:
        raise ValueError(f"the mismatch cap C must be > 1, got {cap}")
    if floor is not None and not 0.0 < floor < 1.0:
        raise ValueError(f"the mismatch floor F must lie in (0, 1), got {floor}")
    valid = mask.to(old_logp.dtype)
    log_weight = (old_logp.detach() - rollout_logp.to(old_logp.dtype)) * valid
    if mode == "none":
        return valid
    if mode == "seq_mask":
        mean_log = log_weight.sum(dim=1) / valid.sum(dim=1).clamp(min=1)
        if floor is None:
            keep = mean_log.abs() <= math.log(cap)
        else:
            keep = (mean_log >= math.log(floor)) & (mean_log <= math.log(cap))
        return keep.to(valid.dtype).unsqueeze(1) * valid
    if mode in PRODUCT_MODES:  # W may overflow to inf: truncated to C, or masked, either way
        log_weight = log_weight.sum(dim=1, keepdim=True)
    weight = torch.exp(log_weight)
    if mode in ("token_tis", "seq_tis"):
        return weight.clamp(min=floor, max=cap) * valid
    outside = weight > cap if floor is None else (weight > cap) | (weight < floor)
    return torch.where(outside, torch.zeros_like(weight), weight) * valid


@dataclass
class MismatchTally:
    """What the step's metrics say about the mismatch, summed over the rows seen once each."""

    abs_sum: float = 0.0
    abs_max: float = 0.0
    tokens: float = 0.0
    truncated_tokens: float = 0.0  # token_tis, token_mis: w_t outside [F, C]
    sequences: float = 0.0
    masked_sequences: float = 0.0  # seq_mask: left out; seq_tis, seq_mis: W outside [F, C]
    kl_sum: float = 0.0  # Σ of k3(ℓ^roll → ℓ^old) over the tokens: KL(π_roll ‖ π_old)
    weight_sum: float = 0.0  # Σ and Σ² of the weights as applied, over the tokens
    weight_square_sum: float = 0.0

    def add(
        self,
        old_logp: Tensor,
        rollout_logp: Tensor,
        mask: Tensor,
        weights: Tensor,
        mode: str,
        cap: float,
        floor: float | None = None,
    ) -> None:
        valid = mask.bool()
        gaps = torch.where(valid, old_logp.detach() - rollout_logp.to(old_logp.dtype), 0.0)
        gap = gaps[valid]
        self.abs_sum += float(gap.abs().sum())
        self.abs_max = max(self.abs_max, float(gap.abs().max()) if gap.numel() else 0.0)
        self.tokens += float(valid.sum())
        sampled = rollout_logp.to(old_logp.dtype)[valid].double()
        self.kl_sum += float(kl_estimate(sampled, old_logp.detach()[valid].double(), "k3").sum())
        applied = weights.detach()[valid].double()
        self.weight_sum += float(applied.sum())
        self.weight_square_sum += float(applied.square().sum())
        if mode in TOKEN_MODES:
            self.truncated_tokens += float(_outside(gap, cap, floor).sum())
        has_tokens = valid.any(dim=1)
        self.sequences += float(has_tokens.sum())
        if mode == "seq_mask":
            self.masked_sequences += float((has_tokens & ~(weights > 0).any(dim=1)).sum())
        if mode in PRODUCT_MODES:
            self.masked_sequences += float(
                (has_tokens & _outside(gaps.sum(dim=1), cap, floor)).sum()
            )

    def as_tensor(self) -> Tensor:
        return torch.tensor(
            [
                self.abs_sum,
                self.tokens,
                self.truncated_tokens,
                self.sequences,
                self.masked_sequences,
                self.kl_sum,
                self.weight_sum,
                self.weight_square_sum,
            ],
            dtype=torch.float64,
            device="cpu",
        )

    @staticmethod
    def metrics(sums: Tensor, abs_max: float) -> dict[str, float]:
        """The logged metrics from (possibly all-reduced) `as_tensor` sums and the max. The
        effective sample size (Σw)²/(N·Σw²) is verl's `rollout_is_eff_sample_size`, over the
        tokens' weights as they multiply the policy terms: 1 when every weight is equal, the
        kept share when they are 0 or 1, lower as a few weights dominate."""
        abs_sum, tokens, truncated, sequences, masked, kl_sum, w_sum, w_square_sum = sums.tolist()
        return {
            "mismatch_abs_mean": abs_sum / tokens if tokens else 0.0,
            "mismatch_kl": kl_sum / tokens if tokens else 0.0,
            "mismatch_abs_max": abs_max,
            "mismatch_truncated_frac": truncated / tokens if tokens else 0.0,
            "mismatch_masked_frac": masked / sequences if sequences else 0.0,
            "mismatch_weight_mean": w_sum / tokens if tokens else 0.0,
            "mismatch_ess": w_sum**2 / (tokens * w_square_sum) if w_square_sum else 0.0,
        }


def _outside(log_weight: Tensor, cap: float, floor: float | None) -> Tensor:
    """Where a weight exp(log_weight) lies above C or, with a floor, below F."""
    above = log_weight > math.log(cap)
    return above if floor is None else above | (log_weight < math.log(floor))
