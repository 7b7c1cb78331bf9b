"""A small step's experience for the update's tests: 8 rows of random tokens in 2 groups of 4,
answers of lengths 2-7, the group advantages of the rewards given."""

from __future__ import annotations

import torch

import tepo_cli.train.experience as exp
from tepo_cli.algos.advantage import group_advantages
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.rollout.backend import Rollout

ROWS, WIDTH = 8, 7


def small_experience(rewards: torch.Tensor) -> exp.Experience:
    generator = torch.Generator().manual_seed(0)
    completion = torch.randint(10, 500, (ROWS, WIDTH), generator=generator)
    lengths = torch.tensor([7, 3, 5, 6, 2, 7, 4, 5])
    rollout = Rollout(
        prompt_ids=torch.randint(10, 500, (ROWS, 4), generator=generator),
        prompt_mask=torch.ones(ROWS, 4, dtype=torch.long),
        completion_ids=completion,
        completion_mask=torch.arange(WIDTH) < lengths[:, None],
        texts=[""] * ROWS,
        truncated=torch.zeros(ROWS, dtype=torch.bool),
    )
    return exp.Experience(
        problems=[],
        rollout=rollout,
        batch=SequenceBatch.from_rollout(rollout),
        rewards=rewards,
        correct=rewards.bool(),
        advantages=group_advantages(rewards, 4),
    )
