"""DAPO's dynamic sampling filter (docs/objectives.md §1.2): which groups carry a learning signal."""

from __future__ import annotations

from torch import Tensor


def informative_groups(correct: Tensor, group_size: int) -> Tensor:
    """[N] correctness (bool or 0/1, rows group by group) → [N / G] bool: keep this group.

    A group is dropped when all its responses are correct or all are wrong; the test is on
    correctness, not on the shaped reward (an overlong penalty must not rescue a group).
    """
    if correct.dim() != 1:
        raise ValueError(f"correct must be [N], got shape {tuple(correct.shape)}")
    if group_size < 1 or correct.numel() % group_size:
        raise ValueError(
            f"correct has {correct.numel()} rows, not a multiple of group_size={group_size}"
        )
    groups = correct.bool().reshape(-1, group_size)
    return groups.any(dim=1) & ~groups.all(dim=1)
