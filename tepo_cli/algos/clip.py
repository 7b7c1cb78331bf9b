"""The clipped surrogate with clip-higher and optional dual clip (docs/objectives.md §0.4)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ClipFlags:
    """[B, T] bool: where the clipped branch is the active one (for the clip-fraction metrics)."""

    low: Tensor  # Â < 0 and ρ < 1 − ε_low
    high: Tensor  # Â > 0 and ρ > 1 + ε_high
    dual: Tensor  # Â < 0 and the dual-clip bound −c·Â is active


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, ClipFlags]:
    """L = −min(ρÂ, clip(ρ, 1 − ε_low, 1 + ε_high)Â); with dual clip, L = min(L, −cÂ) where Â < 0.

    `ratio` and `advantages` broadcast to one shape (per token or per unit); returns the per-element
    loss and which clip is active. ε_high only changes elements with Â > 0 and ε_low only those
    with Â < 0.
    """
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        low = (advantages < 0) & (ratio < 1.0 - eps_low)
        high = (advantages > 0) & (ratio > 1.0 + eps_high)
        dual = torch.zeros_like(low)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * advantages
        negative = advantages < 0
        loss = torch.where(negative, torch.minimum(loss, bound), loss)
        with torch.no_grad():
            dual = negative & (ratio > dual_clip)  # −ρÂ > −cÂ  ⇔  ρ > c  when Â < 0
    return loss, ClipFlags(low=low, high=high, dual=dual)
