"""The entropy of the rows the zero-advantage skip leaves out of the update (train/zero_advantage.py),
so the logged `entropy` stays the mean over every row of the step, skip on or off.

The update logs the policy's next-token entropy from its own forward, which under the skip runs
only the rows with a gradient: about half of a word_math step's groups score all-equal rewards,
and their rows would drop out of the metric, biasing it toward the groups the model is unsure
of. The rows left out get a no-grad forward here instead, at the same temperature and with the
same weights their update forward would have had (before the minibatch's optimizer step), so the
metric equals the skip-off run's to float rounding. The forward is a third or less of the
forward + backward + activations the skip saves on those rows.

Under data parallelism every forward of a ZeRO-3 model is a collective: when any rank has rows
left out, every rank scores (a rank with none scores its minibatch's first row and discards it),
and the micro-batch plan agrees on a count over ranks (train/micro_batches.py).
"""

from __future__ import annotations

from typing import Any

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.packing import ExternalPrompts
from tepo_cli.models.policy import Policy
from tepo_cli.train.experience import Experience
from tepo_cli.train.micro_batches import micro_batches_for
from tepo_cli.train.zero_advantage import may_skip


def left_out_rows(minibatch: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """The rows of `minibatch` (host indices) that the update does not run: all of them when
    `kept` is None (no rank has a row with a gradient)."""
    if kept is None:
        return minibatch
    return minibatch[~torch.isin(minibatch, kept)]


@torch.no_grad()
def entropy_sum(
    cfg: TrainConfig, policy: Policy, batch: SequenceBatch, rows: torch.Tensor, fallback: int
) -> tuple[float, int]:
    """(Σ of the next-token entropies over the trained tokens of `rows`, their count), in float64;
    (0.0, 0) without a forward when no rank has a row. `fallback`: the row a rank without any
    scores (and discards) when another rank has some."""
    if not collective.any_rank(len(rows) > 0):
        return 0.0, 0
    scored = rows if len(rows) else torch.tensor([fallback], dtype=torch.long, device=rows.device)

    def entropy(part: SequenceBatch, prompts: ExternalPrompts | None) -> torch.Tensor:
        scores = policy(part, cfg.rollout.temperature, make=("entropy",), prompts=prompts)
        assert scores.entropy is not None
        return (scores.entropy.double() * part.trained_mask).sum().cpu()

    plan = micro_batches_for(cfg, batch, scored, policy)
    total = torch.zeros((), dtype=torch.float64, device="cpu")  # sums of .cpu() parts
    for part_sum in plan.scores(policy.prompt_pass, batch, entropy):
        total += part_sum
    if not len(rows):
        return 0.0, 0
    return float(total), int(batch.trained_mask[rows].sum())


def left_out_entropy(
    cfg: TrainConfig,
    engine: Any,
    critic_engine: Any,
    experience: Experience,
    everything: torch.Tensor,
    trained: torch.Tensor | None,
    num_tokens: float,
) -> tuple[float, int]:
    """(Σ entropy, tokens) of the minibatch's rows the zero-advantage skip leaves out of the
    update; (0.0, 0) where nothing can be skipped (the same on every rank)."""
    if not (num_tokens > 0 and critic_engine is None and may_skip(cfg)):
        return 0.0, 0
    left_out = left_out_rows(everything, trained)
    return entropy_sum(cfg, engine.module, experience.batch, left_out, int(everything[0]))
