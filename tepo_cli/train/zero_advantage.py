"""No work without a gradient: the update leaves out the responses whose every advantage is exactly
0 when nothing else in the loss reads them (`trainer.skip_zero_advantage`, docs/objectives.md
§0.5).

An objective registered as advantage-proportional (algos/registry.py; every shipped one) adds
(clipped ratio) × Â per token, so such a row's gradient is exactly 0 — unless another term reads
it: a KL term (algo.beta > 0), an auxiliary loss (MPO's, the entropy bonus:
`AlgoConfig.auxiliary_loss`) or a critic (advantage=gae: its value loss trains on every row). The minibatch's normalisers are counted
before the rows are left out, so token-mean stays a mean over all of them and the gradient is
the same as without the skip. When no rank keeps a row, the optimizer step is left out as an
all-empty minibatch's is (train/update.py): weights, AdamW moments and the schedule's count stay
as they were. The update's metrics (clip fractions, ratio, mismatch) then cover the rows that
ran; `entropy` alone covers every row, the ones left out scored by a no-grad forward
(train/left_out_entropy.py).
"""

from __future__ import annotations

import torch

from tepo_cli.algos.registry import advantage_proportional
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective


def may_skip(cfg: TrainConfig) -> bool:
    """Whether rows without an advantage can be left out of this run's update at all."""
    algo = cfg.algo
    return (
        cfg.trainer.skip_zero_advantage
        and advantage_proportional(algo.name)
        and algo.beta == 0
        and not algo.auxiliary_loss
        and cfg.advantage.name != "gae"
    )


def rows_with_gradient(
    advantages: torch.Tensor, trained_mask: torch.Tensor, minibatch: torch.Tensor
) -> torch.Tensor | None:
    """The rows of `minibatch` (host indices) with a non-zero advantage on a trained token, in
    order; None when no rank has one. A rank left with none keeps its first row (its gradient is
    0): every rank then runs the same collectives of the backward and the optimizer step."""
    rows = advantages[minibatch]
    if rows.dim() == 2:  # per token (a critic's): any non-zero advantage on a trained token
        moving = ((rows != 0) & trained_mask[minibatch].to(rows.device)).any(dim=1)
    else:
        moving = rows != 0
    kept = minibatch[moving.cpu()]
    if not collective.any_rank(len(kept) > 0):
        return None
    return kept if len(kept) else minibatch[:1]
