"""The tokens an optimizer step picks over its rows before its micro-batches run: KL-Cov /
Clip-Cov's by covariance (train/cov_selection.py) and `top_entropy_quantile`'s by entropy
(algos/high_entropy.py, docs/objectives.md §0.11).

Each pick is made once over the minibatch's rows on this rank, by π_old's scores from the score
stage, so it does not depend on how the token budget cuts the micro-batches. [our reading] for the
entropy pick: the authors' code (verl) and TRL pick per micro-batch by the forward's entropy; on
the first optimizer step of a rollout π = π_old, so those are the same entropies; later minibatches
and epochs pick by π_old where they use the moved π.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.high_entropy import high_entropy_tokens
from tepo_cli.train.cov_selection import step_selection
from tepo_cli.train.experience import Experience


@dataclass(frozen=True)
class StepPicks:
    """[N, T] bool over the step's experience rows (False off the minibatch), None when not
    picked: KL-Cov / Clip-Cov's `cov_selected`, the high-entropy `entropy_kept`; and the picks'
    metrics."""

    cov_selected: torch.Tensor | None = None
    entropy_kept: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def step_picks(
    algo: AlgoConfig, experience: Experience, minibatch: torch.Tensor, seed: int
) -> StepPicks:
    """The picks `algo` makes over `minibatch` (host row indices); Clip-Cov draws with `seed`."""
    cov_selected = entropy_kept = None
    metrics: dict[str, float] = {}
    if algo.covariance_selection:
        cov_selected, cov_metrics = step_selection(algo, experience, minibatch, seed)
        metrics.update(cov_metrics)
    if algo.entropy_selection:
        entropy = experience.before_update("old_entropy")
        if entropy is None:
            raise ValueError(
                f"top_entropy_quantile={algo.top_entropy_quantile} picks tokens before the step's "
                "forwards: the score stage must provide pi_old's entropies (experience.old or "
                "experience.selection)"
            )
        mask = experience.batch.trained_mask
        rows = minibatch.to(mask.device)
        kept, kept_metrics = high_entropy_tokens(
            entropy[rows.to(entropy.device)],
            mask[rows].to(entropy.device),
            algo.top_entropy_quantile,
        )
        entropy_kept = torch.zeros_like(mask)
        entropy_kept[rows] = kept.to(mask.device)
        metrics.update(kept_metrics)
    return StepPicks(cov_selected, entropy_kept, metrics)
