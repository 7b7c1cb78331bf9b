"""The policy's objective on one micro-batch: π_old's scores (the rollout pass's, or the current
forward's detached), the advantages and the mismatch weights of its rows, the objective plugin's
loss (algos/objectives.py) and the policy's attached modules' terms. `train/update.py` runs its
backward."""

from __future__ import annotations

from typing import Any

import torch

from tepo_cli.algos import objective_reads
from tepo_cli.algos.batch import PolicyBatch, checked_batch, require_inputs
from tepo_cli.algos.inputs import OLD, scored
from tepo_cli.algos.mismatch import MismatchTally, correction_weights
from tepo_cli.algos.objective_loss import objective_loss
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.policy import Scores
from tepo_cli.train.experience import Experience
from tepo_cli.train.token_picks import StepPicks


def forward_scores(cfg: TrainConfig, experience: Experience) -> frozenset[str]:
    """What the update's forward scores besides logp (algos/inputs.py)."""
    on_policy = experience.old_logp is None
    return scored(objective_reads(cfg.algo), rollout=False, on_policy=on_policy)


def micro_batch_objective(
    cfg: TrainConfig, batch: PolicyBatch, scores: Scores, attached: Any | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The micro-batch's loss and metrics: the registered objective on its `objective_batch`,
    with the run's already validated `cfg.algo`; then, when the forward scored the policy's
    `attached` modules, their own terms (MPO's: metrics and an auxiliary loss). The high-entropy
    pick (`top_entropy_quantile` < 1) comes in `batch.entropy_kept` (algos/objective_loss.py)."""
    loss, metrics = objective_loss(batch, cfg.algo)
    metrics = dict(metrics)
    if attached is None or scores.get(attached.scores) is None:
        return loss, metrics
    return attached.objective_terms(loss, metrics, scores, batch)


def objective_batch(
    cfg: TrainConfig,
    experience: Experience,
    rows: torch.Tensor,
    part: SequenceBatch,
    scores: Scores,
    num_tokens: float,
    num_seqs: float,
    tally: MismatchTally | None,
    picks: StepPicks | None = None,
) -> PolicyBatch:
    """The checked `PolicyBatch` of micro-batch `part` (these `rows` of the step) under the
    minibatch's global counts: the inputs the objective declared, by name, from the forward's
    `scores`, π_old's, the reference's and the step's `picks` (train/token_picks.py)."""
    picks = picks or StepPicks()
    width = part.completion_mask.shape[1]
    trained_mask = part.trained_mask  # the model's own tokens (multi-turn: not the observations)
    if experience.old_logp is None:  # on-policy: π_old is the current forward, detached
        old = {OLD + name: value.detach() for name, value in scores.items()}
    else:  # the score stage's pass
        old = {name: value[rows, :width] for name, value in experience.old.items()}
    advantages = experience.advantages  # [N], or [N, T] from a critic
    advantages = _rows(advantages, rows, width) if advantages.dim() == 2 else advantages[rows]
    weights = _mismatch_weights(cfg, experience, rows, old["old_logp"], trained_mask, tally)
    available = {**scores, **old, "ref_logp": _rows(experience.ref_logp, rows, width)}
    available["cov_selected"] = _rows(picks.cov_selected, rows, width)
    sampling = experience.rollout.logprobs if cfg.algo.off_policy_mask is not None else None
    batch = checked_batch(
        PolicyBatch(
            scores["logp"],
            old["old_logp"],
            advantages,
            trained_mask,  # PolicyBatch.mask: the loss plugins' name for it
            token_weights=weights,
            turns=part.turns,
            entropy_kept=_rows(picks.entropy_kept, rows, width),
            sampling_logp=_rows(sampling, rows, width),  # the engine's own (§0.13), or None
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=cfg.completion_tokens,
            **{name: available.get(name) for name in objective_reads(cfg.algo)},
        )
    )
    require_inputs(batch, cfg.algo)
    return batch


def _mismatch_weights(
    cfg: TrainConfig,
    experience: Experience,
    rows: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    tally: MismatchTally | None,
) -> torch.Tensor | None:
    """Each token's mismatch weight when an engine that is not the trainer sampled (docs §0.8);
    None when nothing is corrected."""
    rollout_logp = _rows(experience.rollout.logprobs, rows, mask.shape[1])
    if rollout_logp is None:
        return None
    mode, cap, floor = (
        cfg.rollout.correction_mode,
        cfg.rollout.correction_cap,
        cfg.rollout.correction_floor,
    )
    weights = correction_weights(old_logp, rollout_logp, mask, mode, cap, floor)
    if tally is not None:
        tally.add(old_logp, rollout_logp, mask, weights, mode, cap, floor)
    return None if mode == "none" else weights


def _rows(values: torch.Tensor | None, rows: torch.Tensor, width: int) -> torch.Tensor | None:
    """The micro-batch's rows of a per-step tensor, cut to its completion width."""
    return None if values is None else values[rows, :width]
