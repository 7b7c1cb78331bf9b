"""The step record's group shares (train/step_records.py): groups with a right answer, groups with
only right ones and groups with one reward for all, on a hand-made step of 4 groups × 3 answers."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tepo_cli.train.step_records import _summed_over_ranks


def test_group_shares_on_a_hand_made_step() -> None:
    # groups: none right; one right; all right; all right with one reward (rewards ±1 as DAPO's)
    correct = torch.tensor([0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    rewards = torch.tensor([-1.0, -1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    rollout = SimpleNamespace(
        lengths=torch.full((12,), 5), truncated=torch.zeros(12, dtype=torch.bool)
    )
    experience = SimpleNamespace(
        rewards=rewards,
        correct=correct,
        rollout=rollout,
        sampled_groups=4,
        overlong_mean=0.0,
    )
    cfg = SimpleNamespace(rollout=SimpleNamespace(n=3))
    sums = _summed_over_ranks(cfg, experience)  # type: ignore[arg-type]
    flat_groups, group_count = sums[6], sums[7]
    solved, all_correct = sums[10], sums[11]
    assert (flat_groups, group_count) == (3.0, 4.0)  # all wrong, and the two all-right groups
    assert (solved, all_correct) == (3.0, 2.0)
    assert sums[2] == 7.0  # right answers
