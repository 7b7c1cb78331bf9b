"""TEPO's token-level KL mask (docs/objectives.md §1.4, [our reading])."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from tepo_cli.algos.batch import PolicyBatch

CRITERIA = ("covariance", "entropy_drop", "advantage_only", "first_order")


def tepo_kl_mask(
    batch: PolicyBatch,
    criterion: Literal[
        "covariance", "entropy_drop", "advantage_only", "first_order"
    ] = "covariance",
) -> Tensor:
    """[B, T] bool: the tokens of `batch` that carry TEPO's KL term (never a padding token).

    Its advantages are [B] (one per response) or [B, T] (one per token). M_{i,t} = 1[Â > 0] · c_{i,t},
    where the entropy-decrease test c is
    - `covariance`: ℓ^old_t + H^old_t > 0. Under a natural-gradient step the entropy change at a
      state is −Cov(log π, A): with Â > 0 the entropy falls when the sampled token's log-prob is
      above the state's average log-prob, −H.
    - `entropy_drop`: H_t < H^old_t, with the current policy's entropy (detached).
    - `advantage_only`: c = 1, every positive-advantage token.
    - `first_order`: p_a (ℓ_a + H) − S > 0 with ℓ_a = ℓ^old_t, H = H^old_t, p_a = e^ℓ_a and
      S = Σ_j p_j² (log p_j + H) = `old_entropy_term` (kernels.token_entropy_terms). Since
      ∂H/∂z_j = −p_j (log p_j + H) and a softmax policy-gradient step moves the logits by
      η Â (e_a − p), ΔH ≈ −η Â [p_a (ℓ_a + H) − S]: with Â > 0 the entropy falls iff c holds.
    """
    old_logp, old_entropy, mask = batch.old_logp, batch.old_entropy, batch.mask
    adv = batch.advantages.detach()
    positive = (adv.unsqueeze(1) if adv.dim() == 1 else adv) > 0
    if criterion == "covariance":
        falling = (old_logp.detach() + old_entropy.detach()) > 0
    elif criterion == "entropy_drop":
        if batch.entropy is None:
            raise ValueError("entropy is required by mask_criterion=entropy_drop")
        falling = batch.entropy.detach() < old_entropy.detach()
    elif criterion == "advantage_only":
        falling = torch.ones_like(mask, dtype=torch.bool)
    elif criterion == "first_order":
        if batch.old_entropy_term is None:
            raise ValueError("old_entropy_term is required by mask_criterion=first_order")
        ell = old_logp.detach()
        falling = ell.exp() * (ell + old_entropy.detach()) - batch.old_entropy_term.detach() > 0
    else:
        raise ValueError(
            f"unknown mask_criterion {criterion!r}: expected one of {', '.join(CRITERIA)}"
        )
    return positive & falling & mask.bool()
