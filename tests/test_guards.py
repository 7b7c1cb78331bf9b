"""Numeric guards and degenerate rollouts: a non-finite step changes nothing, and neither does a
rollout of only empty completions (no NaN from a zero token count)."""

from __future__ import annotations

import copy

import pytest
import torch

from tepo_cli.algos.advantage import group_advantages
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.policy import Policy
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.engine import build_engine
from tepo_cli.runtime.guards import FiniteAdamW, GuardedLambdaLR, skipped_optimizer_steps
from tepo_cli.runtime.rng_and_streams import CountingStream
from tepo_cli.train import experience as exp
from tepo_cli.train.update import accumulation_steps, update


def test_a_non_finite_gradient_skips_the_step_and_leaves_everything_as_it_was():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    optimizer = FiniteAdamW([weight], lr=0.1)
    schedule = GuardedLambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    weight.grad = torch.randn(5, dtype=torch.float64)
    optimizer.step()
    schedule.step()
    before = (weight.detach().clone(), copy.deepcopy(optimizer.state_dict()), schedule.last_epoch)

    for bad in (float("nan"), float("inf")):
        weight.grad = torch.randn(5, dtype=torch.float64)
        weight.grad[2] = bad
        optimizer.step()
        schedule.step()
        assert optimizer.last_step_skipped
        assert torch.equal(weight.detach(), before[0])
        state = optimizer.state_dict()["state"][0]
        assert torch.equal(state["exp_avg"], before[1]["state"][0]["exp_avg"])
        assert float(state["step"]) == 1.0
        assert schedule.last_epoch == before[2] and optimizer.param_groups[0]["lr"] == 0.05
    assert optimizer.skipped_steps == 2

    weight.grad = torch.ones(5, dtype=torch.float64)
    optimizer.step()
    schedule.step()
    assert not optimizer.last_step_skipped and not torch.equal(weight.detach(), before[0])
    assert schedule.last_epoch == 2


def test_counting_stream_restores_its_position_by_redrawing():
    def numbers():
        yield from range(100)

    stream = CountingStream(numbers())
    first = [next(stream) for _ in range(7)]
    resumed = CountingStream(numbers(), skip=stream.drawn)
    assert first == list(range(7)) and resumed.drawn == 7
    assert next(resumed) == next(stream) == 7


@pytest.fixture()
def engine_and_config(compose_config, tiny_model):
    cfg = load_train_config(
        compose_config("train", ["model=tiny", "rollout.n=4", "trainer.prompts_per_step=2"])
    )
    topo = setup_topology(num_threads=None)
    try:
        policy = Policy(tiny_model, cfg.kernel)
        yield build_engine(policy, cfg, accumulation_steps(cfg), topo.world_size), cfg
    finally:
        teardown()


def test_only_padding_completions_leave_the_model_untouched(engine_and_config):
    engine, cfg = engine_and_config
    rows, width = 8, 6
    rollout = Rollout(
        prompt_ids=torch.full((rows, 3), 5, dtype=torch.long),
        prompt_mask=torch.ones(rows, 3, dtype=torch.long),
        completion_ids=torch.zeros(rows, width, dtype=torch.long),
        completion_mask=torch.zeros(rows, width, dtype=torch.bool),  # nothing was generated
        texts=[""] * rows,
        truncated=torch.zeros(rows, dtype=torch.bool),
    )
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    experience = exp.Experience(
        problems=[],
        rollout=rollout,
        batch=SequenceBatch.from_rollout(rollout),
        rewards=rewards,
        correct=rewards.bool(),
        advantages=group_advantages(rewards, 4),
    )
    weights = [p.detach().clone() for p in engine.module.parameters()]
    metrics = update(cfg, engine, experience, torch.Generator().manual_seed(0))
    assert metrics == {
        "empty_minibatches": 1.0,
        "skipped_optimizer_steps": 0,
        "update_flops": 0.0,  # nothing ran: no work, no MFU
        "trained_tokens": 0.0,
    }
    assert skipped_optimizer_steps(engine) == 0
    after = list(engine.module.parameters())
    assert all(torch.equal(a.detach(), b) for a, b in zip(after, weights, strict=True))
