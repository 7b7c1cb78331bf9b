"""Per-token KL estimators against a target policy (docs/objectives.md §0.6)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

K3_CLAMP = 10.0
_EXP_CLAMP = 20.0


def kl_estimate(
    logp: Tensor, target_logp: Tensor, estimator: Literal["k1", "k2", "k3"] = "k3"
) -> Tensor:
    """D_t with x = ℓ^tgt_t − ℓ_t: k1 = −x, k2 = x²/2, k3 = exp(x) − x − 1 clamped to [−10, 10].

    For k3, x is also clamped to [−20, 20] before the exponential: this never changes a value
    (k3 already exceeds 10 there) but keeps exp finite, so the clamped region has a zero gradient
    instead of NaN. The target gets no gradient.
    """
    x = target_logp.detach() - logp
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x.square()
    if estimator == "k3":
        x = x.clamp(-_EXP_CLAMP, _EXP_CLAMP)
        return (torch.exp(x) - x - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown kl_estimator {estimator!r}: expected k1, k2 or k3")


def importance_weighted(divergence: Tensor, logp: Tensor, old_logp: Tensor) -> Tensor:
    """ρ_t · D_t with ρ_t = π(y_t) / π_old(y_t), gradient through both: the tokens were sampled
    from π_old, so E_{π_old}[ρ·D] is the KL of π itself and its gradient is the KL's gradient
    (DeepSeek-V3.2's unbiased estimate, §0.6). log ρ is clamped to ±20 (e^20 ≈ 5·10^8) only to
    keep the exponential finite."""
    log_ratio = (logp - old_logp.detach()).clamp(-_EXP_CLAMP, _EXP_CLAMP)
    return torch.exp(log_ratio) * divergence
