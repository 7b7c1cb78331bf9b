"""The advantage stage of a step: the group estimators (GRPO, RLOO) on the sequence rewards (GRPO
with `aggregation=normalize_then_sum`: on each reward component apart, GDPO's way),
REINFORCE++ (whitened over the step's tokens on every rank), or, with advantage=gae, the critic's
values, GAE and the critic's regression targets (docs §0.1).

With the KL in the reward (§0.14) each token's charge β·D_t joins the rewards: summed over the
response for the group estimators (verl's way), per token for REINFORCE++ (returns from each
token on) and GAE (each token's reward)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tepo_cli.algos import estimate_advantages
from tepo_cli.algos.advantage import (
    decoupled_group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_token_advantages,
)
from tepo_cli.algos.gae import gae, token_rewards, whiten, whiten_sums
from tepo_cli.algos.kl_reward import KlCharge
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.sequences import SequenceBatch, widen
from tepo_cli.models.critic import Critic
from tepo_cli.runtime.clock import StepClock
from tepo_cli.train.micro_batches import micro_batches_for
from tepo_cli.train.sampling import Groups


@dataclass
class Advantages:
    """A step's advantages ([N], or [N, T] from a critic) and, with a critic, what it trains on."""

    advantages: torch.Tensor
    old_values: torch.Tensor | None = None  # [N, T] the critic's V at rollout
    returns: torch.Tensor | None = None  # [N, T] GAE returns, the critic's targets
    advantage_metrics: dict[str, float] = field(default_factory=dict)  # the critic's, KL's


def estimate(
    cfg: TrainConfig,
    groups: Groups,
    critic: Critic | None,
    clock: StepClock | None = None,
    kl: KlCharge | None = None,
) -> Advantages:
    """The configured estimator's advantages for the step's groups, charged the KL in the
    reward's `kl` if any."""
    advantages = _estimate(cfg, groups, critic, clock, None if kl is None else kl.penalties)
    if kl is not None:
        advantages.advantage_metrics.update(kl.metrics)
    return advantages


def _estimate(
    cfg: TrainConfig,
    groups: Groups,
    critic: Critic | None,
    clock: StepClock | None,
    penalties: torch.Tensor | None,
) -> Advantages:
    estimator, rewards = cfg.advantage, groups.rewards
    if estimator.name == "reinforce_pp":  # whitened over the step's tokens on every rank
        mask, group_size = groups.batch.trained_mask, cfg.rollout.n
        if penalties is not None:
            return Advantages(
                reinforce_pp_token_advantages(
                    rewards, penalties, mask, group_size, estimator.baseline, _all_ranks_sum
                )
            )
        return Advantages(
            reinforce_pp_advantages(
                rewards, mask, group_size, estimator.baseline, reduce=_all_ranks_sum
            )
        )
    if estimator.name == "grpo" and estimator.aggregation == "normalize_then_sum":
        names = sorted(groups.reward_terms)  # the grader's reward first, then each term
        components = [groups.base_rewards, *(groups.reward_terms[name] for name in names)]
        weights = [1.0, *(cfg.reward.terms[name].weight for name in names)]
        return Advantages(
            decoupled_group_advantages(
                components, weights, cfg.rollout.n, estimator.eps, reduce=_all_ranks_sum
            )
        )
    if not estimator.needs_critic:
        if penalties is not None:  # the response's charges, summed
            rewards = rewards - penalties.sum(dim=1).to(rewards.dtype)
        return Advantages(
            estimate_advantages(
                estimator.name,
                rewards,
                cfg.rollout.n,
                scale=estimator.scale,
                eps=estimator.eps,
                reduce=_all_ranks_sum,
            )
        )
    if critic is None:
        raise ValueError("advantage=gae needs the critic")
    with (clock or StepClock())("values"):
        return critic_targets(cfg, critic, groups.batch, rewards, penalties)


@torch.no_grad()
def critic_targets(
    cfg: TrainConfig,
    critic: Critic,
    batch: SequenceBatch,
    rewards: torch.Tensor,
    penalties: torch.Tensor | None = None,
) -> Advantages:
    """V_old in micro-batches, the sequence reward on each last token (less each token's
    `penalties`, the KL in the reward), GAE (γ, λ), returns, and the advantages whitened over
    every valid token of the step, on all ranks (docs §0.1)."""
    settings = cfg.advantage
    width = batch.completion_mask.shape[1]
    all_rows = torch.arange(len(batch), device="cpu")
    plan = micro_batches_for(cfg, batch, all_rows, critic)
    parts = plan.scores(
        critic.prompt_pass, batch, lambda part, prompts: widen(critic(part, prompts=prompts), width)
    )
    values = plan.in_row_order(parts).to(torch.float32)
    mask = batch.trained_mask  # multi-turn: GAE runs over the model's tokens, across observations
    per_token = token_rewards(rewards.to(values.dtype), mask)
    if penalties is not None:
        per_token = per_token - penalties.to(values.dtype)
    advantages, returns = gae(per_token, values, mask, settings.gamma, settings.lam)
    sums = _all_ranks_sum(whiten_sums(advantages, mask))
    if settings.whiten:
        advantages = whiten(advantages, mask, sums)
    residual = _all_ranks_sum(whiten_sums(returns - values, mask))
    target = _all_ranks_sum(whiten_sums(returns, mask))
    metrics = {
        "value_mean": _mean(_all_ranks_sum(whiten_sums(values, mask))),
        "return_mean": _mean(target),
        "explained_variance": 1.0 - _variance(residual) / max(_variance(target), 1e-12),
    }
    return Advantages(advantages, values, returns, metrics)


def _all_ranks_sum(sums: torch.Tensor) -> torch.Tensor:
    if not collective.multi_rank():
        return sums
    return collective.all_sum(sums).cpu()


def _mean(sums: torch.Tensor) -> float:
    count, total, _ = sums.tolist()
    return total / count if count else 0.0


def _variance(sums: torch.Tensor) -> float:
    count, total, squares = sums.tolist()
    if count == 0:
        return 0.0
    mean = total / count
    return max(squares / count - mean * mean, 0.0)
