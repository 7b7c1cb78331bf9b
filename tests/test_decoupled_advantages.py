"""`advantage.aggregation=normalize_then_sum` (GDPO; docs/objectives.md §0.1) against float64 by
hand: each reward component normalised within its group with the sample std, the weighted sum
divided by its sample std over the step. Also TRL's formula, which subtracts the step's mean too,
and the run's wiring: the grader's reward and each term reach the estimator apart."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from tepo_cli.algos.advantage import decoupled_group_advantages, group_advantages
from tepo_cli.config.schema import AdvantageConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.train.advantage_stage import estimate

EPS = 1e-6
CORRECT = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
FORMAT = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # group 3: all equal
LENGTH = [12.0, 40.0, 7.0, 30.0, 9.0, 9.0, 9.0, 9.0, 5.0, 5.0, 5.0, 5.0]
WEIGHTS = [1.0, 0.5, -0.01]


def by_hand(components, weights, size=4, eps=EPS, centre=False) -> list[float]:
    total = [0.0] * len(components[0])
    for values, weight in zip(components, weights, strict=True):
        for start in range(0, len(values), size):
            group = values[start : start + size]
            if len(set(group)) == 1:
                continue  # a group of equal values gives exactly 0
            mean, std = statistics.fmean(group), statistics.stdev(group)
            for i, value in enumerate(group):
                total[start + i] += weight * (value - mean) / (std + eps)
    mean = statistics.fmean(total) if centre else 0.0
    deviation = statistics.stdev(total)
    return [(value - mean) / (deviation + eps) for value in total]


def tensors(*columns):
    return [torch.tensor(c, dtype=torch.float64) for c in columns]


def test_each_component_is_normalised_in_its_group_then_the_sum_over_the_step():
    got = decoupled_group_advantages(tensors(CORRECT, FORMAT, LENGTH), WEIGHTS, 4, EPS)
    assert got.tolist() == pytest.approx(by_hand([CORRECT, FORMAT, LENGTH], WEIGHTS), rel=1e-12)
    assert got[8:].tolist() == [0.0] * 4  # every component equal in group 3: exactly 0
    trl = by_hand([CORRECT, FORMAT, LENGTH], WEIGHTS, centre=True)  # the step's mean removed too
    assert got.tolist() == pytest.approx(trl, abs=1e-12)


def test_a_large_spread_no_longer_drowns_the_other_components():
    """Summed first (GRPO), the length cost decides the first group's order; decoupled, the one
    right answer ranks first, as its own component says."""
    summed = [c + 0.5 * f - 0.01 * n for c, f, n in zip(CORRECT, FORMAT, LENGTH, strict=True)]
    plain = group_advantages(torch.tensor(summed, dtype=torch.float64), 4)
    decoupled = decoupled_group_advantages(tensors(CORRECT, FORMAT, LENGTH), [1.0, 0.5, -1.0], 4)
    plain_weighted = [
        c + 0.5 * f - 1.0 * n for c, f, n in zip(CORRECT, FORMAT, LENGTH, strict=True)
    ]
    heavy = group_advantages(torch.tensor(plain_weighted, dtype=torch.float64), 4)
    assert int(plain[:4].argmax()) == 0
    assert int(heavy[:4].argmax()) == 2  # the length weight decides alone: the shortest wins
    assert int(decoupled[:4].argmax()) == 0  # the right answer still ranks first


def test_the_run_hands_the_grader_s_reward_and_each_term_apart(compose_config, tmp_path):
    terms = tmp_path / "terms.py"
    terms.write_text("def fmt(completion, problem):\n    return 1.0\n")
    cfg = load_train_config(
        compose_config(
            "train",
            [
                "model=tiny",
                "rollout.n=4",
                "advantage.aggregation=normalize_then_sum",
                f"+reward.terms.fmt.path={terms}",
                "+reward.terms.fmt.function=fmt",
                "+reward.terms.fmt.weight=0.5",
            ],
        )
    )
    base, fmt = tensors(CORRECT, FORMAT)
    groups = SimpleNamespace(
        rewards=base + 0.5 * fmt, base_rewards=base, reward_terms={"fmt": fmt}, batch=None
    )
    got = estimate(cfg, groups, critic=None).advantages
    assert torch.equal(got, decoupled_group_advantages([base, fmt], [1.0, 0.5], 4, EPS))
    summed = load_train_config(compose_config("train", ["model=tiny", "rollout.n=4"]))
    assert torch.equal(
        estimate(summed, groups, critic=None).advantages, group_advantages(base + 0.5 * fmt, 4)
    )


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"name": "rloo", "aggregation": "normalize_then_sum"}, "do not apply to advantage=rloo"),
        (
            {"name": "grpo", "aggregation": "normalize_then_sum", "scale": "none"},
            "leave advantage.scale=std",
        ),
    ],
)
def test_settings_it_cannot_honour_are_refused(knobs, message):
    with pytest.raises(ValidationError, match=message):
        AdvantageConfig(**knobs)
