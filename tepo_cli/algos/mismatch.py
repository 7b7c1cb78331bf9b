"""Rollout–training mismatch correction (docs/objectives.md §0.8).

An engine that is not the trainer (vLLM) samples with its own kernels: its log-probs ℓ^roll of
the sampled tokens differ from the trainer's ℓ^old for the same weights. The trainer keeps its own
ℓ^old as the ratio's denominator and reweights each token by w = exp(ℓ^old − ℓ^roll):

- `token_tis`: each token's policy-gradient term times sg[min(w_t, C)] (truncated IS);
- `seq_mask`: a response whose geometric-mean weight exp(mean_t log w_t) lies outside [1/C, C]
  is left out of the loss (weight 0), and still counted in the normalisers;
- `none`: weight 1.

The weights go to `policy_loss(..., token_weights=...)`, which multiplies each token's policy
term by its weight (for a sequence or block unit: the unit's surrogate, carried by each of its
tokens, times that token's weight); the KL penalty is not reweighted [our reading].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("none", "token_tis", "seq_mask")


def correction_weights(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, cap: float
) -> Tensor:
    """[B, T] detached weights: 1 where nothing is corrected, 0 on padding."""
    if mode not in MODES:
        raise ValueError(
            f"mismatch correction mode must be one of {', '.join(MODES)}; got {mode!r}"
        )
    if not cap > 1.0:
        raise ValueError(f"the mismatch cap C must be > 1, got {cap}")
    valid = mask.to(old_logp.dtype)
    log_weight = (old_logp.detach() - rollout_logp.to(old_logp.dtype)) * valid
    if mode == "none":
        return valid
    if mode == "token_tis":
        return torch.exp(log_weight).clamp(max=cap) * valid
    mean_log = log_weight.sum(dim=1) / valid.sum(dim=1).clamp(min=1)
    keep = (mean_log.abs() <= math.log(cap)).to(valid.dtype)
    return keep.unsqueeze(1) * valid


@dataclass
class MismatchTally:
    """What the step's metrics say about the mismatch, summed over the rows seen once each."""

    abs_sum: float = 0.0
    abs_max: float = 0.0
    tokens: float = 0.0
    truncated_tokens: float = 0.0  # token_tis: w_t > C
    sequences: float = 0.0
    masked_sequences: float = 0.0  # seq_mask: left out

    def add(
        self,
        old_logp: Tensor,
        rollout_logp: Tensor,
        mask: Tensor,
        weights: Tensor,
        mode: str,
        cap: float,
    ) -> None:
        valid = mask.bool()
        gap = (old_logp.detach() - rollout_logp.to(old_logp.dtype))[valid]
        self.abs_sum += float(gap.abs().sum())
        self.abs_max = max(self.abs_max, float(gap.abs().max()) if gap.numel() else 0.0)
        self.tokens += float(valid.sum())
        if mode == "token_tis":
            self.truncated_tokens += float((gap > math.log(cap)).sum())
        has_tokens = valid.any(dim=1)
        self.sequences += float(has_tokens.sum())
        if mode == "seq_mask":
            self.masked_sequences += float((has_tokens & ~(weights > 0).any(dim=1)).sum())

    def as_tensor(self) -> Tensor:
        return torch.tensor(
            [
                self.abs_sum,
                self.tokens,
                self.truncated_tokens,
                self.sequences,
                self.masked_sequences,
            ],
            dtype=torch.float64,
            device="cpu",
        )

    @staticmethod
    def metrics(sums: Tensor, abs_max: float) -> dict[str, float]:
        """The logged metrics from (possibly all-reduced) `as_tensor` sums and the max."""
        abs_sum, tokens, truncated, sequences, masked = sums.tolist()
        return {
            "mismatch_abs_mean": abs_sum / tokens if tokens else 0.0,
            "mismatch_abs_max": abs_max,
            "mismatch_truncated_frac": truncated / tokens if tokens else 0.0,
            "mismatch_masked_frac": masked / sequences if sequences else 0.0,
        }
