"""TEPO's token-level KL mask (ALGORITHMS.md §1.4, [our reading])."""

from __future__ import annotations

from typing import Literal

from torch import Tensor


def tepo_kl_mask(
    advantages: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    old_entropy: Tensor,
    entropy: Tensor | None = None,
    criterion: Literal["covariance", "entropy_drop"] = "covariance",
) -> Tensor:
    """[B, T] bool: the tokens that carry TEPO's KL term (never a padding token).

    M_{i,t} = 1[Â_i > 0] · c_{i,t}, where the entropy-decrease test c is
    - `covariance`: ℓ^old_t + H^old_t > 0. Under a natural-gradient step the entropy change at a
      state is −Cov(log π, A): with Â > 0 the entropy falls when the sampled token's log-prob is
      above the state's average log-prob, −H.
    - `entropy_drop`: H_t < H^old_t, with the current policy's entropy (detached).
    """
    positive = (advantages.detach() > 0).unsqueeze(1)
    if criterion == "covariance":
        falling = (old_logp.detach() + old_entropy.detach()) > 0
    elif criterion == "entropy_drop":
        if entropy is None:
            raise ValueError("entropy is required by mask_criterion=entropy_drop")
        falling = entropy.detach() < old_entropy.detach()
    else:
        raise ValueError(
            f"unknown mask_criterion {criterion!r}: expected covariance or entropy_drop"
        )
    return positive & falling & mask.bool()
