"""The KL in the reward (`algo.kl_reward_coef`, docs/objectives.md §0.14) against float64 by hand:
each token's D_t from π_old's and the reference's log-probs, the step's KL as the mean of the
responses' means, Ziegler et al.'s adaptive controller, and how each estimator takes the charge β·D_t
(summed for GRPO/RLOO, returns from each token on for REINFORCE++, each token's reward for GAE).
Then the run: the first step's KL is 0 (π_old is the reference), β follows the controller step by
step, and a run that dies and resumes charges what the uninterrupted one does."""

from __future__ import annotations

import copy
import itertools
import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from run_files import comparable_metrics
from tiny_run import tiny_run

from tepo_cli.algos.advantage import reinforce_pp_advantages
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.kl_reward import (
    KlCharge,
    divergences,
    mean_divergence,
    next_coef,
    response_sums,
)
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.runtime.critic_files import build_critic
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.hooks import RunHooks
from tepo_cli.train.advantage_stage import critic_targets, estimate
from tepo_cli.train.setup import build_policy

LENGTHS = [5, 3, 0, 4, 2, 5]  # six responses, two groups of three; the third has no tokens
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def _mask(lengths: list[int] = LENGTHS, width: int = 5) -> torch.Tensor:
    return torch.tensor([[t < n for t in range(width)] for n in lengths])


def _log_probs(seed: int) -> torch.Tensor:
    return -torch.rand(len(LENGTHS), 5, generator=torch.Generator().manual_seed(seed)).double() * 3


def _penalties(seed: int = 2) -> torch.Tensor:
    charge = torch.rand(len(LENGTHS), 5, generator=torch.Generator().manual_seed(seed)).double()
    return torch.where(_mask(), charge * 0.3, 0.0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_each_tokens_divergence_and_the_steps_kl_by_hand(estimator):
    old, ref, mask = _log_probs(0), _log_probs(1), _mask()
    got = divergences(old, ref, mask, estimator)
    expected = torch.zeros_like(old)
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            x = float(ref[i, t]) - float(old[i, t])
            expected[i, t] = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - x - 1}[estimator]
    assert torch.allclose(got, expected, rtol=1e-12, atol=0)
    means = [
        sum(float(expected[i, t]) for t in range(n)) / n if n else 0.0
        for i, n in enumerate(LENGTHS)
    ]
    sums = response_sums(got, mask)
    assert sums.tolist() == pytest.approx([sum(means), 6.0], rel=1e-12)
    assert mean_divergence(sums) == pytest.approx(statistics.fmean(means), rel=1e-12)


def test_the_adaptive_coefficient_follows_ziegler_et_al():
    """β·(1 + clip(KL/target − 1, ±0.2)·n/horizon): the error is clipped both ways."""
    assert next_coef(0.05, 0.3, 0.1, 10000, 512) == pytest.approx(0.05 * (1 + 0.2 * 512 / 10000))
    assert next_coef(0.05, 0.0, 0.1, 1000, 64) == pytest.approx(0.05 * (1 - 0.2 * 64 / 1000))
    assert next_coef(0.05, 0.11, 0.1, 1000, 64) == pytest.approx(0.05 * (1 + 0.1 * 64 / 1000))
    assert next_coef(0.05, 0.1, 0.1, 1000, 64) == 0.05


def _config(compose_config, *overrides: str):
    return load_train_config(
        compose_config(
            "train", ["model=tiny", "rollout.n=3", "trainer.prompts_per_step=2", *overrides]
        )
    )


def _groups(rewards=REWARDS):
    batch = SimpleNamespace(trained_mask=_mask())
    return SimpleNamespace(rewards=torch.tensor(rewards, dtype=torch.float64), batch=batch)


def _charge(penalties: torch.Tensor) -> KlCharge:
    return KlCharge(penalties, {"kl_reward": 0.25, "kl_reward_coef": 0.1})


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_estimators_take_each_responses_summed_charge(compose_config, estimator):
    cfg = _config(compose_config, f"advantage={estimator}", "algo.kl_reward_coef=0.1")
    penalties = _penalties()
    got = estimate(cfg, _groups(), None, kl=_charge(penalties))
    charged = [r - float(penalties[i].sum()) for i, r in enumerate(REWARDS)]
    expected = []
    for start in (0, 3):
        group = charged[start : start + 3]
        mean = statistics.fmean(group)
        if estimator == "grpo":
            expected += [(r - mean) / (statistics.stdev(group) + 1e-6) for r in group]
        else:
            expected += [
                r - statistics.fmean(group[:j] + group[j + 1 :]) for j, r in enumerate(group)
            ]
    assert got.advantages.tolist() == pytest.approx(expected, rel=1e-9)
    assert got.advantage_metrics == {"kl_reward": 0.25, "kl_reward_coef": 0.1}


@pytest.mark.parametrize("baseline", ["group", "none"])
def test_reinforce_pp_charges_each_token_the_charges_from_it_on(compose_config, baseline):
    overrides = ["advantage=reinforce_pp", f"advantage.baseline={baseline}"]
    cfg = _config(compose_config, *overrides, "algo.kl_reward_coef=0.1")
    penalties = _penalties()
    got = estimate(cfg, _groups(), None, kl=_charge(penalties)).advantages
    returns = {}
    for i, n in enumerate(LENGTHS):
        group = REWARDS[i // 3 * 3 : i // 3 * 3 + 3]
        reward = REWARDS[i] - (statistics.fmean(group) if baseline == "group" else 0.0)
        for t in range(n):
            returns[i, t] = reward - sum(float(penalties[i, s]) for s in range(t, n))
    values = list(returns.values())
    mean, std = statistics.fmean(values), statistics.stdev(values)
    expected = torch.zeros(len(LENGTHS), 5, dtype=torch.float64)
    for (i, t), value in returns.items():
        expected[i, t] = (value - mean) / (std**2 + 1e-8) ** 0.5
    assert torch.allclose(got, expected, rtol=1e-9, atol=1e-12)
    # No charge: every token carries the sequence estimator's value
    free = estimate(cfg, _groups(), None, kl=_charge(torch.zeros(6, 5, dtype=torch.float64)))
    plain = reinforce_pp_advantages(_groups().rewards, _mask(), 3, baseline)
    broadcast = torch.where(_mask(), plain[:, None].expand(6, 5), 0.0)
    assert torch.allclose(free.advantages, broadcast, rtol=1e-12, atol=1e-12)


def _rollout() -> Rollout:
    generator = torch.Generator().manual_seed(0)
    return Rollout(
        prompt_ids=torch.randint(3, 60, (6, 4), generator=generator),
        prompt_mask=torch.ones(6, 4, dtype=torch.long),
        completion_ids=torch.randint(3, 60, (6, 5), generator=generator),
        completion_mask=_mask(),
        texts=[""] * 6,
        truncated=torch.zeros(6, dtype=torch.bool),
    )


def test_gae_charges_each_tokens_reward(compose_config, tiny_model):
    """GAE is linear in the rewards: the charged advantages are the plain ones less
    Σ_l (γλ)^l·c_{t+l}, whatever the critic's values (unwhitened to compare them)."""
    gamma, lam = 0.9, 0.8
    overrides = ["advantage=gae", f"advantage.gamma={gamma}", f"advantage.lam={lam}"]
    cfg = _config(compose_config, *overrides, "advantage.whiten=false", "algo.kl_reward_coef=0.1")
    torch.manual_seed(0)
    topo = setup_topology(num_threads=None)
    try:
        critic = build_critic(cfg, build_policy(cfg, copy.deepcopy(tiny_model)), topo).double()
        batch, rewards = SequenceBatch.from_rollout(_rollout()), torch.tensor(REWARDS).double()
        penalties = _penalties()
        plain = critic_targets(cfg, critic, batch, rewards)
        charged = critic_targets(cfg, critic, batch, rewards, penalties)
    finally:
        teardown()
    expected = plain.advantages.clone()
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            expected[i, t] -= sum(
                (gamma * lam) ** (s - t) * float(penalties[i, s]) for s in range(t, n)
            )
    assert torch.equal(charged.old_values, plain.old_values)
    assert torch.allclose(charged.advantages, expected, rtol=1e-5, atol=1e-6)  # V is float32
    assert torch.allclose(charged.returns - charged.old_values * _mask(), charged.advantages)


def test_the_knobs_are_refused_where_they_cannot_act(compose_config):
    with pytest.raises(
        ValidationError, match=r"kl_reward_target=0.1 adapts .* set kl_reward_coef > 0"
    ):
        AlgoConfig(name="grpo", kl_reward_target=0.1)
    assert AlgoConfig(name="grpo", kl_reward_coef=0.01).needs_ref  # no loss KL, still a reference
    assert not AlgoConfig(name="grpo").needs_ref
    with pytest.raises(ConfigError, match="normalize_then_sum normalises each reward component"):
        _config(
            compose_config, "algo.kl_reward_coef=0.1", "advantage.aggregation=normalize_then_sum"
        )


KNOBS = [
    "algo.beta=0",
    "algo.kl_reward_coef=0.05",
    "algo.kl_reward_target=0.001",
    "algo.kl_reward_horizon=100",
    "rollout.n=2",
    "trainer.prompts_per_step=4",
]


@pytest.mark.parametrize("regime", ["on_policy", "off_policy"])
def test_a_run_charges_the_kl_and_adapts_its_coefficient(compose_config, tmp_path, regime):
    more = ["trainer.minibatches=2"] if regime == "off_policy" else []
    records = tiny_run(compose_config, tmp_path, [*KNOBS, *more], steps=3).records
    assert records[0]["kl_reward"] == pytest.approx(0.0, abs=1e-6)  # π_old is the reference
    assert records[0]["kl_reward_coef"] == 0.05
    for before, after in itertools.pairwise(records):
        expected = next_coef(before["kl_reward_coef"], before["kl_reward"], 0.001, 100, 8)
        assert after["kl_reward_coef"] == pytest.approx(expected, rel=1e-12)
    assert records[1]["kl_reward"] != 0.0


class _DieAtStep(RunHooks):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.dies_at = step

    def reached(self, point: str) -> None:
        if point == "update" and self.step == self.dies_at:
            raise RuntimeError("the test's crash")


def test_a_resumed_run_charges_what_the_uninterrupted_one_does(compose_config, tmp_path):
    """β lives in the run's state: resumed after step 2, step 3 charges the β the controller
    gave, not kl_reward_coef again."""
    knobs = [*KNOBS, "trainer.save_every=1", "trainer.keep_checkpoints=3"]
    whole = tiny_run(compose_config, tmp_path / "whole", knobs, steps=3)
    cut = tmp_path / "cut"
    with pytest.raises(RuntimeError, match="the test's crash"):
        tiny_run(compose_config, cut, knobs, steps=3, hooks=_DieAtStep(3))
    tiny_run(compose_config, cut, [*knobs, "resume=true"], steps=3)
    assert whole.records[2]["kl_reward_coef"] != 0.05
    assert comparable_metrics(cut) == comparable_metrics(tmp_path / "whole")
