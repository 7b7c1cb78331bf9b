"""The entropy bonus (`algo.entropy_coef`, docs/objectives.md §0.12), for every objective.

PPO's entropy bonus, as verl's `entropy_coeff`: −c · agg(H) is added to the loss, H the current
policy's next-token entropy (with its gradient, through the chunked kernel), aggregated over the
valid tokens with the policy term's `loss_agg` and normalisers. A positive c holds entropy up; a
negative c minimises it (entropy minimisation as an objective of its own).
"""

from __future__ import annotations

from torch import Tensor

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch


def entropy_bonus(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor | None, dict[str, float]]:
    """(−c · agg(H), its metric `entropy_bonus_loss`), or (None, {}) when c = 0."""
    if cfg.entropy_coef == 0:
        return None, {}
    assert batch.entropy is not None  # require_inputs
    mean_entropy = aggregate(batch.entropy, batch.mask, cfg.loss_agg, **batch.normalisers)
    loss = -cfg.entropy_coef * mean_entropy
    return loss, {"entropy_bonus_loss": float(loss.detach())}
