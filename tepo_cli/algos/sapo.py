"""SAPO (Gao et al., "Soft Adaptive Policy Optimization", arXiv 2511.20347; docs/objectives.md
§1.8): PPO's hard clip replaced by a smooth gate on each token's ratio.

    L_t = −f(ρ_t)·Â_t,  f(ρ) = (4/τ)·σ(τ(ρ − 1)),  τ = τ_pos where Â > 0, τ_neg where Â ≤ 0

f'(1) = 1, so on-policy the gradient is the plain policy gradient; away from 1 the gradient
ρ·f'(ρ) = 4ρσ(1 − σ) fades smoothly instead of dropping to zero at a clip edge, and τ_neg > τ_pos
makes it fade faster for negative advantages (the paper argues that their updates spread
probability over many unsampled tokens and destabilise training more). No clip acts: `clip_frac` is 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.objectives import (
    _masked_mean,
    clipped_reads,
    kl_term,
    token_ratios,
    unit_advantages,
)
from tepo_cli.algos.registry import register_policy_loss


@register_policy_loss("sapo", reads=clipped_reads, advantage_proportional=True)
def sapo_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """−(4/τ)·σ(τ(ρ − 1))·Â on every valid token, + the KL term (§0.6) when β > 0."""
    ratio = token_ratios(batch, cfg)
    advantages = unit_advantages(batch.advantages, batch.mask, cfg, batch.turns)
    tau = torch.where(advantages > 0, ratio.new_tensor(cfg.tau_pos), ratio.new_tensor(cfg.tau_neg))
    surrogate = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages
    if batch.token_weights is not None:  # mismatch correction (algos/mismatch.py)
        surrogate = surrogate * batch.token_weights.to(surrogate.dtype)
    pg_loss = aggregate(surrogate, batch.mask, cfg.loss_agg, **batch.normalisers)
    kl_loss, kl_metrics = kl_term(batch, cfg)
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clip_frac": 0.0,  # no clip: the key every objective reports, for reports and plots
        "ratio_mean": _masked_mean(ratio.detach(), batch.mask, empty=1.0),
    }
    return pg_loss + kl_loss, {**metrics, **kl_metrics}
