"""The policy's objective on one micro-batch: π_old's scores (the rollout pass's, or the current
forward's detached), the advantages and the mismatch weights of its rows, the objective plugin's
loss (algos/objectives.py) and MPO's MTP terms. `train/update.py` runs its backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tepo_cli.algos import policy_loss
from tepo_cli.algos.mismatch import MismatchTally, correction_weights
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.mtp_loss import mtp_metrics, mtp_prediction_loss
from tepo_cli.train.experience import Experience


def micro_batch_objective(
    cfg: TrainConfig,
    experience: Experience,
    rows: torch.Tensor,
    part: SequenceBatch,
    scores: Any,
    num_tokens: float,
    num_seqs: float,
    tally: MismatchTally | None,
    selected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of the micro-batch `part` (these `rows` of the step) from the policy's `scores`,
    normalised by the minibatch's global token and sequence counts, and its metrics. `selected`
    [N, T]: KL-Cov / Clip-Cov's pick over the step's rows (train/cov_selection.py)."""
    width = part.completion_mask.shape[1]
    trained_mask = part.trained_mask  # the model's own tokens (multi-turn: not the observations)
    old = _old_scores(experience, rows, width, scores)
    advantages = experience.advantages  # [N], or [N, T] from a critic
    advantages = _rows(advantages, rows, width) if advantages.dim() == 2 else advantages[rows]
    weights = _mismatch_weights(cfg, experience, rows, old.logp, trained_mask, tally)
    loss, metrics = policy_loss(
        cfg.algo,
        scores.logp,
        old.logp,
        advantages,
        trained_mask,  # PolicyBatch.mask: the loss plugins' name for it
        ref_logp=_rows(experience.ref_logp, rows, width),
        entropy=scores.entropy,
        old_entropy=old.entropy,
        mtp_logp=scores.mtp_logp,
        old_mtp_logp=old.mtp_logp,
        old_entropy_term=old.entropy_term,
        token_weights=weights,
        turns=part.turns,
        cov_selected=_rows(selected, rows, width),
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_len=cfg.completion_tokens,
    )
    metrics = dict(metrics)
    if scores.mtp_logp is not None:
        loss = _with_mtp_terms(cfg, loss, scores, trained_mask, num_tokens, metrics)
    return loss, metrics


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
    mode, cap = cfg.rollout.correction_mode, cfg.rollout.correction_cap
    weights = correction_weights(old_logp, rollout_logp, mask, mode, cap)
    if tally is not None:
        tally.add(old_logp, rollout_logp, mask, weights, mode, cap)
    return None if mode == "none" else weights


@dataclass
class _OldScores:
    logp: torch.Tensor
    entropy: torch.Tensor | None
    entropy_term: torch.Tensor | None
    mtp_logp: torch.Tensor | None


def _old_scores(experience: Experience, rows: torch.Tensor, width: int, scores: Any) -> _OldScores:
    """π_old's scores of the micro-batch: the rollout pass's (off-policy), or the current
    forward's, detached (on-policy: π_old is the current policy)."""
    if experience.old_logp is None:
        mtp = scores.mtp_logp
        return _OldScores(
            scores.logp.detach(),
            scores.entropy,
            scores.entropy_term,
            None if mtp is None else mtp.detach(),
        )
    return _OldScores(
        experience.old_logp[rows, :width],
        _rows(experience.old_entropy, rows, width),
        _rows(experience.old_entropy_term, rows, width),
        _rows(experience.old_mtp_logp, rows, width),
    )


def _with_mtp_terms(
    cfg: TrainConfig,
    loss: torch.Tensor,
    scores: Any,
    mask: torch.Tensor,
    num_tokens: float,
    metrics: dict[str, float],
) -> torch.Tensor:
    """MPO's MTP metrics, and its auxiliary prediction loss added when `algo.mtp.aux_coef` > 0."""
    mtp = cfg.algo.mtp
    metrics.update(mtp_metrics(scores.mtp_logp.detach(), scores.logp.detach(), mask))
    if mtp.aux_coef <= 0:
        return loss
    aux = mtp_prediction_loss(scores.mtp_logp, mask, mtp.warmup.alpha_decay, num_tokens)
    metrics["mtp_aux_loss"] = float(aux.detach())
    return loss + mtp.aux_coef * aux


def _rows(values: torch.Tensor | None, rows: torch.Tensor, width: int) -> torch.Tensor | None:
    """The micro-batch's rows of a per-step tensor, cut to its completion width."""
    return None if values is None else values[rows, :width]
