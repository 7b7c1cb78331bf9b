"""The KL in the reward for one step (docs/objectives.md §0.14): β·D_t per token from the score
stage's π_old and reference log-probs, the step's KL over every rank's responses, and, with
`algo.kl_reward_target`, the controller's β for the next step (kept in the run's state, so a
resumed run charges what the uninterrupted one would). The advantage stage takes the charge."""

from __future__ import annotations

import torch

from tepo_cli.algos.kl_reward import (
    KlCharge,
    divergences,
    mean_divergence,
    next_coef,
    response_sums,
)
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.runtime.state import TrainerState
from tepo_cli.train.experience import Scores


def charge(
    cfg: TrainConfig, batch: SequenceBatch, scores: Scores, state: TrainerState
) -> KlCharge | None:
    """None unless `algo.kl_reward_coef` > 0. Collective with it: every rank's responses count."""
    algo = cfg.algo
    if algo.kl_reward_coef == 0:
        return None
    old_logp, ref_logp = scores.before_update("old_logp"), scores.ref_logp
    if old_logp is None or ref_logp is None:
        raise ValueError("the KL in the reward needs π_old's and the reference's log-probs")
    mask = batch.trained_mask  # multi-turn: the model's tokens, not the observations
    divergence = divergences(old_logp, ref_logp, mask, algo.kl_reward_estimator)
    sums = collective.all_sum(response_sums(divergence, mask)).cpu()
    kl, responses = mean_divergence(sums), float(sums[1])
    coef = algo.kl_reward_coef if state.kl_reward_coef is None else state.kl_reward_coef
    if algo.kl_reward_target is not None:
        state.kl_reward_coef = next_coef(
            coef, kl, algo.kl_reward_target, algo.kl_reward_horizon, responses
        )
    penalties = (coef * divergence).to(torch.float32)
    return KlCharge(penalties, {"kl_reward": kl, "kl_reward_coef": coef})
