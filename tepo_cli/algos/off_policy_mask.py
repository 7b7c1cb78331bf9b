"""Off-policy sequence masking (`algo.off_policy_mask`, docs/objectives.md §0.13), for every
objective.

DeepSeek-V3.2 (arXiv 2512.02556, Eq. 9) drops the policy term of a response with a negative
advantage whose sampling policy has drifted far from the one being trained: learning from one's
own mistakes is useful, from a stale policy's mistakes it can destabilise. The drift is the
response's mean log-ratio of the sampling policy to the current one, δ_i = mean_t (ℓ^samp_t − ℓ_t);
ℓ^samp is the rollout engine's own log-probs where it returns them (the training–inference
mismatch counts too), else π_old's. TRL ships it as `off_policy_mask_threshold`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch


def off_policy_kept(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor | None, dict[str, float]]:
    """[B, T] bool, the tokens whose policy term counts (None when the mask is off): all but
    those with Â < 0 in a response whose drift δ_i exceeds `cfg.off_policy_mask`; and the share
    of valid tokens dropped (`off_policy_masked_frac`). Per-token advantages are tested token by
    token, as TRL tests them."""
    if cfg.off_policy_mask is None:
        return None, {}
    mask = batch.mask
    sampling = batch.old_logp if batch.sampling_logp is None else batch.sampling_logp
    gap = torch.where(mask, sampling - batch.logp.detach(), 0.0).sum(dim=1)
    drift = gap / mask.sum(dim=1).clamp(min=1)
    advantages = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None]
    dropped = (advantages < 0) & (drift > cfg.off_policy_mask)[:, None] & mask
    valid = int(mask.sum())
    frac = int(dropped.sum()) / valid if valid else 0.0
    return mask & ~dropped, {"off_policy_masked_frac": frac}
