"""Turn completions into training rewards: the verifier, then the objective's reward shaping.

Rewards and correctness come from the reward group's verifier (`reward.correct/incorrect`; DAPO's
preset sets them to ±1, docs/objectives.md §1.2). The soft overlong punishment sits on top. Dynamic
sampling filters on correctness, never on the shaped reward; so does every accuracy. The reward
terms of `reward.terms` (rewards/terms.py) are added last, each weight times its value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tepo_cli.algos import overlong_penalty, resolve_overlong_lengths
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.rewards import Reward


@dataclass
class Graded:
    rewards: torch.Tensor  # [N] float32, shaped
    correct: torch.Tensor  # [N] bool
    overlong: torch.Tensor  # [N] float32, the overlong term included in rewards (0 when off)
    base: torch.Tensor  # [N] float32, the grader's reward with the overlong term, before the terms
    # reward.terms by name: [N] float32 unweighted values; weight x value is in rewards
    terms: dict[str, torch.Tensor] = field(default_factory=dict)

    def take(self, rows: torch.Tensor) -> Graded:
        terms = {name: values[rows] for name, values in self.terms.items()}
        picked = (self.rewards, self.correct, self.overlong, self.base)
        return Graded(*(values[rows] for values in picked), terms)


def grade(
    cfg: TrainConfig,
    rollout: Rollout,
    problems: list[Problem],
    reward: Reward,
    results: list[RewardResult] | None = None,
) -> Graded:
    """The rows' rewards: the grader's on each completion, or `results` already given (an
    episode's environment grades it when it ends)."""
    owners = [problems[i // cfg.rollout.n] for i in range(len(rollout.texts))]
    if results is None:
        results = reward.score_many(rollout.texts, owners)
    device = rollout.completion_ids.device
    correct = torch.tensor([r.correct for r in results], dtype=torch.bool, device=device)
    algo = cfg.algo
    rewards = torch.tensor([r.reward for r in results], dtype=torch.float32, device=device)
    overlong = torch.zeros_like(rewards)
    if algo.overlong_penalty:
        max_len, cache_len = resolve_overlong_lengths(
            algo.overlong_max_len, algo.overlong_cache_len, cfg.completion_tokens
        )
        # [our reading] an episode's length is its model tokens (docs/objectives.md §0.2)
        lengths = rollout.trained_mask.sum(dim=1)
        overlong = overlong_penalty(lengths, max_len, cache_len).float()
        rewards = rewards + overlong
    base, terms = rewards, {}
    for term in reward.terms:
        values = term.values(rollout.texts, owners)
        terms[term.name] = torch.tensor(values, dtype=torch.float32, device=device)
        rewards = rewards + term.weight * terms[term.name]
    return Graded(rewards, correct, overlong, base, terms)
