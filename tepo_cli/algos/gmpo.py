"""GMPO (Zhao et al., "Geometric-Mean Policy Optimization", arXiv 2507.20673; docs/objectives.md
§1.9): each answer's ratio is the geometric mean of its tokens' clipped ratios.

GRPO averages token terms ρ_t·Â arithmetically, so one token with an extreme ratio can dominate an
answer's update; the geometric mean exp(mean_t log ρ_t) damps such outliers, which the paper
argues lets the clip range widen (its (e^−0.4, e^0.4)) with a steadier update. Per answer i,
with d_t = ℓ_t − ℓ^old_t and s = sign(Â_i):

    c_t = s·min(s·d_t, s·clip(d_t, log(1 − ε_low), log(1 + ε_high)))   (PPO's pessimistic clip)
    L_i = −Â_i·exp(mean_t c_t)

as verl's `geo_mean` loss computes it; the tokens' clip is PPO's, taken in log space.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.clip import ClipFlags
from tepo_cli.algos.objectives import clip_metrics, kl_term, kl_term_reads
from tepo_cli.algos.registry import register_policy_loss


@register_policy_loss("gmpo", reads=kl_term_reads, advantage_proportional=True)
def gmpo_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """−Â_i·exp(mean of the clipped token log-ratios) per answer, on each of its tokens (so
    seq-mean-token-mean is the mean over answers), + the KL term (§0.6) when β > 0.

    Token-level advantages are averaged over the answer's tokens (one advantage per answer, as
    verl's), [our reading]."""
    mask = batch.mask  # padding is 0 in every input (algos/batch.py: checked_batch)
    lengths = mask.sum(dim=1).clamp(min=1)
    advantages = batch.advantages
    if advantages.dim() == 2:
        advantages = advantages.sum(dim=1) / lengths
    sign = torch.sign(advantages)[:, None]
    log_ratio = batch.logp - batch.old_logp
    low = math.log(1.0 - cfg.eps_low) if cfg.eps_low < 1.0 else -math.inf
    high = math.log1p(cfg.eps_high)
    bounded = log_ratio.clamp(low, high)
    clipped = sign * torch.minimum(sign * log_ratio, sign * bounded)
    ratio = torch.exp(torch.where(mask, clipped, 0.0).sum(dim=1) / lengths)
    surrogate = (-advantages * ratio)[:, None].expand_as(log_ratio)
    if batch.token_weights is not None:  # mismatch correction (algos/mismatch.py)
        surrogate = surrogate * batch.token_weights.to(surrogate.dtype)
    pg_loss = aggregate(surrogate, mask, cfg.loss_agg, **batch.normalisers)
    kl_loss, kl_metrics = kl_term(batch, cfg)
    with torch.no_grad():
        flags = ClipFlags(
            low=(sign < 0) & (log_ratio < low),
            high=(sign > 0) & (log_ratio > high),
            dual=torch.zeros_like(mask),
        )
    token_ratio = torch.exp(log_ratio.detach())
    metrics = {"pg_loss": float(pg_loss.detach()), **clip_metrics(flags, token_ratio, mask)}
    return pg_loss + kl_loss, {**metrics, **kl_metrics}
