"""One objective's loss on a checked `PolicyBatch`: the registered plugin (algos/registry.py) with
the parts every objective shares around it, the high-entropy pick that weighs its policy term
(§0.11) and the entropy bonus added to it (§0.12). `policy_loss` (algos/api.py) and the trainer's
micro-batches (train/micro_batch_objective.py) both call it, so the two cannot drift apart."""

from __future__ import annotations

from torch import Tensor

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.entropy_bonus import entropy_bonus
from tepo_cli.algos.high_entropy import keep_high_entropy
from tepo_cli.algos.registry import get_policy_loss


def objective_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """Loss and metrics of objective `cfg.name` on `batch` (already through `checked_batch` and
    `require_inputs`); with the defaults (top_entropy_quantile=1, entropy_coef=0) exactly the
    plugin's."""
    weighted, pick_metrics = keep_high_entropy(batch, cfg)
    loss, metrics = get_policy_loss(cfg.name)(weighted, cfg)
    bonus, bonus_metrics = entropy_bonus(batch, cfg)
    if bonus is not None:
        loss = loss + bonus
    return loss, {**metrics, **pick_metrics, **bonus_metrics}
