"""The KL in the reward (docs/objectives.md §0.14): the pure parts.

PPO for language models (Ziegler et al., arXiv 1909.08593) charges the rollout policy's
divergence from the frozen reference to the reward, per token, before the advantage is estimated;
verl's `algorithm.use_kl_in_reward` and OpenRLHF's PPO do the same. The loss's β·KL (§0.6) is a
separate term, and both may be on.

- `divergences`: D_t on each valid token from π_old's and the reference's log-probs of the sampled
  tokens (`kl_estimate`, k1 = ℓ^old − ℓ^ref by default, as verl's `kl_penalty=kl`), 0 elsewhere,
  without gradient.
- `mean_divergence`: each response's mean D_t, averaged over the step's responses — the KL the
  adaptive controller steers (verl's `current_kl`).
- `next_coef`: the adaptive controller, β ← β·(1 + clip(KL/KL_target − 1, −0.2, 0.2)·n/horizon),
  n the step's responses.

How each advantage estimator takes the charge β·D_t is the advantage stage's
(train/advantage_stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tepo_cli.algos.kl import kl_estimate

ERROR_CLIP = 0.2  # the controller's largest relative step, before n/horizon


@dataclass
class KlCharge:
    """What a step charges each token's reward, and what it logs."""

    penalties: Tensor  # [N, T] β·D_t on the trained tokens, 0 elsewhere
    metrics: dict[str, float]  # kl_reward (the step's KL), kl_reward_coef (its β)


def divergences(
    old_logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: Literal["k1", "k2", "k3"]
) -> Tensor:
    """[N, T] D_t = kl_estimate(ℓ^old_t, ℓ^ref_t) on the valid tokens, 0 elsewhere, detached."""
    divergence = kl_estimate(old_logp.detach(), ref_logp.detach(), estimator)
    return torch.where(mask.bool(), divergence, torch.zeros_like(divergence))


def response_sums(divergences: Tensor, mask: Tensor) -> Tensor:
    """[2] float64 (Σ over responses of each one's mean D_t, responses): add these over ranks and
    `mean_divergence` is the whole step's. A response without valid tokens counts with 0."""
    tokens = mask.to(torch.float64).sum(dim=1)
    means = divergences.to(torch.float64).sum(dim=1) / tokens.clamp(min=1.0)
    return torch.stack([means.sum(), means.new_tensor(float(means.numel()))])


def mean_divergence(sums: Tensor) -> float:
    """The step's KL from `response_sums` (summed over ranks): the mean of the responses' means."""
    total, responses = sums.tolist()
    return total / responses if responses else 0.0


def next_coef(coef: float, kl: float, target: float, horizon: int, responses: float) -> float:
    """The adaptive controller's next β after a step whose KL was `kl` over `responses` responses
    (Ziegler et al.'s log-space controller, its gain written as their code and verl's
    `AdaptiveKLController` write it, n/horizon): proportional to the relative error, clipped to
    ±0.2, scaled by the share of the horizon the step covers."""
    error = min(max(kl / target - 1.0, -ERROR_CLIP), ERROR_CLIP)
    return coef * (1.0 + error * responses / horizon)
