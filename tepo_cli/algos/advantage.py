"""Advantage estimators (docs/objectives.md §0.1): rewards in, one advantage per response out."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def group_advantages(
    rewards: Tensor,
    group_size: int,
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-6,
) -> Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + eps), or R_i − mean_g R with `scale="none"` (Dr. GRPO).

    `rewards` is [N] with the rows ordered group by group: G = `group_size` consecutive rows per
    prompt. The standard deviation is the unbiased sample one (Bessel's correction, as GRPO
    implementations use). A group whose rewards are all equal gets exactly 0.
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
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    # Equal rewards give exactly 0, not a rounding residue that std would blow up.
    equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(equal, torch.zeros_like(centred), centred)
    if scale == "std":
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Â_i = R_i − mean_{j≠i} R_j over the G responses of a prompt (REINFORCE leave-one-out),
    computed as G/(G−1)·(R_i − mean R). Rows ordered group by group; equal rewards give exactly 0.
    """
    centred = group_advantages(rewards, group_size, scale="none")
    return centred * (group_size / (group_size - 1))


def estimate_advantages(
    name: Literal["grpo", "rloo"],
    rewards: Tensor,
    group_size: int,
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-6,
) -> Tensor:
    """The `advantage` group's estimator `name` on [N] rewards, G = `group_size` per prompt."""
    if name == "grpo":
        return group_advantages(rewards, group_size, scale=scale, eps=eps)
    if name == "rloo":
        return rloo_advantages(rewards, group_size)
    raise ValueError(f"unknown advantage estimator {name!r}: expected grpo or rloo")
