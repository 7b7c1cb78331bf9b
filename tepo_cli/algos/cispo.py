"""CISPO (MiniMax-M1, arXiv 2506.13585; docs/objectives.md §1.7): REINFORCE on every token, each
term weighted by its importance ratio, clipped and detached.

PPO's clip (§0.4) gives a token whose ratio left [1 − ε_low, 1 + ε_high] no gradient at all; the
paper found those are often the rare tokens where a chain of thought turns ("However", "Wait"),
clipped out after a rollout's first update, and that they matter for a stable entropy. CISPO
bounds the weight instead and keeps every token's gradient:

    L_t = −sg(clip(ρ_t, 1 − ε_low, 1 + ε_high)) · Â_t · ℓ_t

ρ_t is the token's unit ratio (§0.2: `unit=token` in the preset; `unit=sequence` gives one
detached weight per answer, as TRL's `importance_sampling_level="sequence"`); the gradient
always goes through the token's own log-prob, with the token's own advantage (token-level ones,
e.g. GAE's, are not averaged over the unit), so `route` changes nothing here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.clip import ClipFlags
from tepo_cli.algos.objectives import (
    clip_metrics,
    clipped_reads,
    kl_term,
    token_ratios,
)
from tepo_cli.algos.registry import register_policy_loss


@register_policy_loss("cispo", reads=clipped_reads, advantage_proportional=True)
def cispo_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """−sg(clip(ρ))·Â·ℓ on every valid token, + the KL term (§0.6) when β > 0.

    `clip_frac` counts the tokens whose weight the clip bounded, whatever their advantage's sign
    (each still has a gradient, unlike PPO's clipped tokens)."""
    mask = batch.mask  # padding is 0 in every input (algos/batch.py: checked_batch)
    ratio = token_ratios(batch, cfg).detach()
    weight = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    advantages = batch.advantages  # each token's own: [B] broadcast, or [B, T] (e.g. GAE)
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    surrogate = -weight * advantages * batch.logp
    if batch.token_weights is not None:  # mismatch correction (algos/mismatch.py)
        surrogate = surrogate * batch.token_weights.to(surrogate.dtype)
    pg_loss = aggregate(surrogate, mask, cfg.loss_agg, **batch.normalisers)
    kl_loss, kl_metrics = kl_term(batch, cfg)
    flags = ClipFlags(
        low=ratio < 1.0 - cfg.eps_low,
        high=ratio > 1.0 + cfg.eps_high,
        dual=torch.zeros_like(mask),
    )
    metrics = {"pg_loss": float(pg_loss.detach()), **clip_metrics(flags, ratio, mask)}
    return pg_loss + kl_loss, {**metrics, **kl_metrics}
