"""The policy's objective on one micro-batch: π_old's scores (the rollout pass's, or the current
forward's detached), the advantages and the mismatch weights of its rows, the objective plugin's
loss (algos/objectives.py) and MPO's MTP terms. `train/update.py` runs its backward."""

from __future__ import annotations

import torch

from tepo_cli.algos import get_policy_loss, objective_reads
from tepo_cli.algos.batch import PolicyBatch, checked_batch, require_inputs
from tepo_cli.algos.inputs import OLD, scored
from tepo_cli.algos.mismatch import MismatchTally, correction_weights
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.mtp_loss import mtp_metrics, mtp_prediction_loss
from tepo_cli.models.policy import Scores
from tepo_cli.train.experience import Experience


def forward_scores(cfg: TrainConfig, experience: Experience) -> frozenset[str]:
    """What the update's forward makes besides logp (algos/inputs.py): the entropy, the inputs
    the objective reads of the current policy, and on-policy π_old's as well."""
    on_policy = experience.old_logp is None
    return scored(objective_reads(cfg.algo), rollout=False, on_policy=on_policy)


def micro_batch_objective(
    cfg: TrainConfig,
    experience: Experience,
    rows: torch.Tensor,
    part: SequenceBatch,
    scores: Scores,
    num_tokens: float,
    num_seqs: float,
    tally: MismatchTally | None,
    selected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of the micro-batch `part` (these `rows` of the step) from the policy's `scores`,
    normalised by the minibatch's global token and sequence counts, and its metrics: the
    registered loss on `objective_batch`, with the run's already validated `cfg.algo`."""
    batch = objective_batch(
        cfg, experience, rows, part, scores, num_tokens, num_seqs, tally, selected
    )
    loss, metrics = get_policy_loss(cfg.algo.name)(batch, cfg.algo)
    metrics = dict(metrics)
    if scores.mtp_logp is not None:
        loss = _with_mtp_terms(cfg, loss, scores, part.trained_mask, num_tokens, metrics)
    return loss, metrics


def objective_batch(
    cfg: TrainConfig,
    experience: Experience,
    rows: torch.Tensor,
    part: SequenceBatch,
    scores: Scores,
    num_tokens: float,
    num_seqs: float,
    tally: MismatchTally | None,
    selected: torch.Tensor | None = None,
) -> PolicyBatch:
    """The checked `PolicyBatch` of the micro-batch: its rows' advantages and mismatch weights,
    and the inputs the objective declared (algos/inputs.py), by name, from the current forward's
    `scores`, π_old's, the reference's and `selected` [N, T], KL-Cov / Clip-Cov's pick over the
    step's rows (train/cov_selection.py)."""
    width = part.completion_mask.shape[1]
    trained_mask = part.trained_mask  # the model's own tokens (multi-turn: not the observations)
    old = _old_scores(experience, rows, width, scores)
    advantages = experience.advantages  # [N], or [N, T] from a critic
    advantages = _rows(advantages, rows, width) if advantages.dim() == 2 else advantages[rows]
    weights = _mismatch_weights(cfg, experience, rows, old["old_logp"], trained_mask, tally)
    available = {
        **scores,
        **old,
        "ref_logp": _rows(experience.ref_logp, rows, width),
        "cov_selected": _rows(selected, rows, width),
    }
    batch = checked_batch(
        PolicyBatch(
            scores["logp"],
            old["old_logp"],
            advantages,
            trained_mask,  # PolicyBatch.mask: the loss plugins' name for it
            token_weights=weights,
            turns=part.turns,
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
    mode, cap = cfg.rollout.correction_mode, cfg.rollout.correction_cap
    weights = correction_weights(old_logp, rollout_logp, mask, mode, cap)
    if tally is not None:
        tally.add(old_logp, rollout_logp, mask, weights, mode, cap)
    return None if mode == "none" else weights


def _old_scores(
    experience: Experience, rows: torch.Tensor, width: int, scores: Scores
) -> dict[str, torch.Tensor]:
    """π_old's scores of the micro-batch by input name (old_logp, old_entropy, ...): the rollout
    pass's (off-policy), or the current forward's, detached (on-policy: π_old is the current
    policy)."""
    if experience.old_logp is None:
        return {OLD + name: value.detach() for name, value in scores.items()}
    return {name: value[rows, :width] for name, value in experience.old.items()}


def _with_mtp_terms(
    cfg: TrainConfig,
    loss: torch.Tensor,
    scores: Scores,
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
