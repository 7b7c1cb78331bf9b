"""One objective's loss on a checked `PolicyBatch`: the registered plugin (algos/registry.py) with
the parts every objective shares around it, the token masks that weigh its policy term (the
high-entropy pick, §0.11; off-policy sequence masking, §0.13) and the entropy bonus added to it
(§0.12). `policy_loss` (algos/api.py) and the trainer's micro-batches
(train/micro_batch_objective.py) both call it, so the two cannot drift apart."""

from __future__ import annotations

import dataclasses

from torch import Tensor

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.entropy_bonus import entropy_bonus
from tepo_cli.algos.high_entropy import entropy_kept
from tepo_cli.algos.off_policy_mask import off_policy_kept
from tepo_cli.algos.registry import get_policy_loss


def objective_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """Loss and metrics of objective `cfg.name` on `batch` (already through `checked_batch` and
    `require_inputs`); with the defaults (top_entropy_quantile=1, off_policy_mask=null,
    entropy_coef=0) exactly the plugin's."""
    metrics: dict[str, float] = {}
    weights = batch.token_weights
    for kept, kept_metrics in (entropy_kept(batch, cfg), off_policy_kept(batch, cfg)):
        metrics.update(kept_metrics)
        if kept is not None:  # a token outside the mask keeps its place in the normalisers
            weights = kept.to(batch.logp.dtype) if weights is None else weights * kept
    unchanged = weights is batch.token_weights  # the defaults: no copy of the batch
    weighted = batch if unchanged else dataclasses.replace(batch, token_weights=weights)
    loss, plugin_metrics = get_policy_loss(cfg.name)(weighted, cfg)
    bonus, bonus_metrics = entropy_bonus(batch, cfg)
    if bonus is not None:
        loss = loss + bonus
    return loss, {**plugin_metrics, **metrics, **bonus_metrics}
