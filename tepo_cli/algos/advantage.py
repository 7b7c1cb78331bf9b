"""Advantage estimators (docs/objectives.md §0.1): rewards in, one advantage per response out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

from tepo_cli.algos.gae import token_rewards, whiten, whiten_sums


def group_advantages(
    rewards: Tensor,
    group_size: int,
    scale: Literal["std", "batch", "none"] = "std",
    eps: float = 1e-6,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + eps), or R_i − mean_g R with `scale="none"` (Dr. GRPO),
    or (R_i − mean_g R) / (std R + eps) with `scale="batch"`, the deviation of every reward of the
    step (Lite PPO's group mean and batch deviation; TRL's `scale_rewards="batch"`).

    `rewards` is [N] with the rows ordered group by group: G = `group_size` consecutive rows per
    prompt. The standard deviations are the unbiased sample ones (Bessel's correction, as GRPO
    implementations use). A group whose rewards are all equal gets exactly 0. `reduce` sums the
    batch deviation's (count, Σ, Σ²) over ranks (identity on one).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 for a group-relative advantage, got {group_size}"
        )
    if rewards.numel() % group_size:
        raise ValueError(
            f"rewards has {rewards.numel()} rows, not a multiple of group_size={group_size}"
        )
    if scale not in ("std", "batch", "none"):
        raise ValueError(f"scale must be 'std', 'batch' or 'none', got {scale!r}")
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    # Equal rewards give exactly 0, not a rounding residue that std would blow up.
    equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(equal, torch.zeros_like(centred), centred)
    if scale == "std":
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    if scale == "batch":
        centred = centred / (_batch_std(rewards, reduce) + eps)
    return centred.reshape(-1)


def decoupled_group_advantages(
    components: Sequence[Tensor],
    weights: Sequence[float],
    group_size: int,
    eps: float = 1e-6,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """GDPO (arXiv 2601.05242; TRL's `multi_objective_aggregation="normalize_then_sum"`): each
    reward component normalised within its group on its own, Â^k_i = (r^k_i − mean_g r^k) /
    (std_g r^k + eps), then S_i = Σ_k w_k·Â^k_i divided by the deviation of S over the step's
    rows (every rank's with `reduce`) + eps. Summing first lets a component with a large spread
    drown the others; normalising each first keeps every component's ranking within a group.

    TRL also subtracts the step's mean of S: each group's Â^k sum to 0, so that mean is 0 up to
    rounding [our reading: it is left out, so a group whose every component is equal keeps an
    advantage of exactly 0, which the zero-advantage skip relies on]."""
    if len(components) != len(weights) or not components:
        raise ValueError("decoupled advantages need one weight per reward component, and one")
    total = sum(
        float(w) * group_advantages(r, group_size, "std", eps)
        for r, w in zip(components, weights, strict=True)
    )
    assert isinstance(total, Tensor)
    return total / (_batch_std(total, reduce) + eps)


def _batch_std(rewards: Tensor, reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
    """The unbiased deviation of every reward of the step (all ranks' with `reduce`); 0 for one."""
    sums = whiten_sums(rewards, torch.ones_like(rewards, dtype=torch.bool))
    count, total, squares = (sums if reduce is None else reduce(sums)).tolist()
    variance = max(squares - total * total / count, 0.0) / (count - 1) if count > 1 else 0.0
    return rewards.new_tensor(variance**0.5)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Â_i = R_i − mean_{j≠i} R_j over the G responses of a prompt (REINFORCE leave-one-out),
    computed as G/(G−1)·(R_i − mean R). Rows ordered group by group; equal rewards give exactly 0.
    """
    centred = group_advantages(rewards, group_size, scale="none")
    return centred * (group_size / (group_size - 1))


def reinforce_pp_advantages(
    rewards: Tensor,
    mask: Tensor,
    group_size: int,
    baseline: Literal["group", "none"] = "group",
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """REINFORCE++ (Hu, arXiv 2501.03262) on outcome rewards: each response's reward, minus its
    group's mean with `baseline="group"` (REINFORCE++-baseline), whitened over every valid token
    of the step, (a − mean)·(var + 1e-8)^−½ token-weighted with the unbiased variance, as verl's
    `masked_whiten`. So a long answer weighs more in the statistics, and a group of equal
    rewards gets −mean/std, not 0 (as in verl and OpenRLHF).

    `mask` [N, T]: each response's valid tokens. `reduce` sums the (count, Σ, Σ²) statistics
    over ranks (identity on one); returns one advantage per response, [N].
    """
    if rewards.dim() != 1 or mask.shape[:1] != rewards.shape:
        raise ValueError(
            f"rewards must be [N] and mask [N, T], got {tuple(rewards.shape)}, {tuple(mask.shape)}"
        )
    if baseline not in ("group", "none"):
        raise ValueError(f"baseline must be 'group' or 'none', got {baseline!r}")
    centred = group_advantages(rewards, group_size, "none") if baseline == "group" else rewards
    column = centred.double()[:, None]  # one value per response, every token of it carries it
    sums = whiten_sums(column.expand(mask.shape), mask)
    sums = sums if reduce is None else reduce(sums)
    every_row = torch.ones_like(column, dtype=torch.bool)
    return whiten(column, every_row, sums)[:, 0].to(rewards.dtype)


def reinforce_pp_token_advantages(
    rewards: Tensor,
    penalties: Tensor,
    mask: Tensor,
    group_size: int,
    baseline: Literal["group", "none"] = "group",
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """REINFORCE++ with a charge on each token (the KL in the reward, §0.14): token t's return is
    the response's reward (less its group's mean with `baseline="group"`) minus the charges from
    t on, Σ_{s≥t} c_s (γ = 1, OpenRLHF's cumulative returns), whitened over every valid token of
    the step as `reinforce_pp_advantages`. [N, T], 0 on padding; with no charge every token
    carries `reinforce_pp_advantages`' value."""
    if penalties.shape != mask.shape or mask.shape[:1] != rewards.shape:
        raise ValueError(
            f"rewards must be [N] and penalties and mask [N, T], got {tuple(rewards.shape)}, "
            f"{tuple(penalties.shape)}, {tuple(mask.shape)}"
        )
    centred = group_advantages(rewards, group_size, "none") if baseline == "group" else rewards
    valid = mask.bool()
    steps = torch.where(valid, token_rewards(centred.double(), valid) - penalties.double(), 0.0)
    returns = torch.where(valid, steps.flip(1).cumsum(1).flip(1), 0.0)
    sums = whiten_sums(returns, valid)
    return whiten(returns, valid, sums if reduce is None else reduce(sums)).to(rewards.dtype)


def estimate_advantages(
    name: Literal["grpo", "rloo"],
    rewards: Tensor,
    group_size: int,
    scale: Literal["std", "batch", "none"] = "std",
    eps: float = 1e-6,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The `advantage` group's estimator `name` on [N] rewards, G = `group_size` per prompt."""
    if name == "grpo":
        return group_advantages(rewards, group_size, scale=scale, eps=eps, reduce=reduce)
    if name == "rloo":
        return rloo_advantages(rewards, group_size)
    raise ValueError(f"unknown advantage estimator {name!r}: expected grpo or rloo")
