"""No work without a gradient (train/zero_advantage.py): rows whose advantage is all 0 are left out
of the update when nothing else reads them, with the same gradient (float64), and a step with no
such row anywhere takes no optimizer step."""

from __future__ import annotations

import copy

import pytest
import torch
from small_experience import ROWS, small_experience

from tepo_cli.config.validate import load_train_config
from tepo_cli.models.policy import Policy
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.engine import build_engine
from tepo_cli.train.flops import model_shape, update_work
from tepo_cli.train.update import accumulation_steps, update
from tepo_cli.train.zero_advantage import may_skip, rows_with_gradient


@pytest.fixture()
def make_engine(compose_config, tiny_model):
    """An engine over the tiny model in float64, and the update's gradient as the optimizer sees
    it (recorded at the accumulation boundary, before DeepSpeed steps)."""
    topo = setup_topology(num_threads=None)
    pristine = tiny_model.double()  # each engine starts from these weights (its step moves them)
    built = []

    def make(overrides: list[str]):
        base = ["model=tiny", "rollout.n=4", "trainer.prompts_per_step=2", "algo=dapo"]
        cfg = load_train_config(compose_config("train", [*base, *overrides]))
        model = copy.deepcopy(pristine)
        torch.manual_seed(0)
        engine = build_engine(Policy(model, cfg.kernel), cfg, accumulation_steps(cfg), 1)
        grads: list[dict[str, torch.Tensor]] = []
        step = engine.step

        def recording_step():
            if engine.is_gradient_accumulation_boundary():
                grads.append(
                    {
                        n: p.grad.clone()
                        for n, p in engine.module.named_parameters()
                        if p.grad is not None
                    }
                )
            step()

        engine.step = recording_step
        built.append(engine)
        return cfg, engine, grads

    try:
        yield make
    finally:
        teardown()
        del topo


def test_the_gradient_is_the_same_with_and_without_the_skip(make_engine):
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 0])  # group 2 scores 0 four times: A = 0
    results = []
    for skip in ("true", "false"):
        overrides = [f"trainer.skip_zero_advantage={skip}", "trainer.micro_batch_tokens=16"]
        cfg, engine, grads = make_engine(overrides)
        metrics = update(cfg, engine, small_experience(rewards), torch.Generator().manual_seed(0))
        results.append((metrics, grads))
    (skipped, skipped_grads), (full, full_grads) = results
    assert skipped["zero_advantage_rows"] == 4 and skipped["zero_advantage_minibatches"] == 0
    assert "zero_advantage_rows" not in full
    assert len(skipped_grads) == len(full_grads) == 1
    assert skipped_grads[0].keys() == full_grads[0].keys()
    for name, grad in skipped_grads[0].items():
        torch.testing.assert_close(grad, full_grads[0][name], rtol=1e-10, atol=1e-14, msg=name)
    assert any(g.abs().sum() > 0 for g in full_grads[0].values())  # a real gradient
    assert skipped["loss"] == pytest.approx(full["loss"], rel=1e-10, abs=1e-14)
    # The needed work counts the rows that ran (train/flops.py): group 1's four, not all eight.
    batch, shape = small_experience(rewards).batch, model_shape(engine.module.lm)
    assert skipped["update_flops"] == update_work(shape, batch, torch.arange(4))[0]
    assert full["update_flops"] == update_work(shape, batch, torch.arange(ROWS))[0]
    assert skipped["trained_tokens"] == 4 * 4 + (7 + 3 + 5 + 6)  # distinct prompts + answers
    assert full["trained_tokens"] == 8 * 4 + int(batch.completion_mask.sum())


def test_a_step_with_no_advantage_anywhere_takes_no_optimizer_step(make_engine):
    cfg, engine, grads = make_engine([])
    weights = [p.detach().clone() for p in engine.module.parameters()]
    metrics = update(
        cfg, engine, small_experience(torch.zeros(ROWS)), torch.Generator().manual_seed(0)
    )
    assert metrics["zero_advantage_rows"] == ROWS and metrics["zero_advantage_minibatches"] == 1
    assert grads == [] and metrics["skipped_optimizer_steps"] == 0
    assert metrics["update_flops"] == 0 and metrics["trained_tokens"] == 0  # no work, no MFU
    after = list(engine.module.parameters())
    assert all(torch.equal(a.detach(), b) for a, b in zip(after, weights, strict=True))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algo=dapo"], True),
        (["algo=gspo"], True),
        (["algo=mpo"], True),
        (["algo=grpo"], False),  # β = 0.04: the KL term reads every row
        (["algo=tepo"], False),
        (["algo=grpo", "algo.beta=0"], True),
        (["algo=dapo", "advantage=gae"], False),  # the critic trains on every row
        (["algo=mpo", "algo.future=mtp", "algo.mtp.aux_coef=0.1"], False),
        (["algo=dapo", "trainer.skip_zero_advantage=false"], False),
    ],
)
def test_the_skip_applies_only_where_no_other_term_reads_the_rows(
    compose_config, overrides, expected
):
    assert (
        may_skip(load_train_config(compose_config("train", ["model=tiny", *overrides]))) is expected
    )


def test_rows_with_gradient_reads_per_token_advantages_on_trained_tokens_only():
    advantages = torch.tensor([[0.0, 0, 0], [0, 0.5, 0], [0, 0, 2.0], [0, 0, 0]])
    trained = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    kept = rows_with_gradient(advantages, trained, torch.tensor([3, 2, 1, 0]))
    assert kept.tolist() == [1]  # row 2's advantage sits on an untrained token
    assert rows_with_gradient(torch.zeros(4), trained, torch.arange(4)) is None


def _entropy_of_every_row(cfg, policy: Policy, rewards: torch.Tensor) -> float:
    """The reference: one float64 forward over all the rows, the token-mean entropy of their
    trained tokens."""
    batch = small_experience(rewards).batch
    with torch.no_grad():
        scores = policy(batch, cfg.rollout.temperature, with_entropy=True)
    valid = batch.trained_mask
    return float((scores.entropy * valid).sum() / valid.sum())


@pytest.mark.parametrize(
    ("overrides", "rewards"),
    [
        ([], [1.0, 0, 1, 0, 0, 0, 0, 0]),  # group 2 left out, group 1 trained
        (["trainer.micro_batch_tokens=1024"], [0.0, 0, 0, 0, 1, 1, 0, 1]),  # one micro-batch
        ([], [0.0] * ROWS),  # nothing to train: the whole minibatch left out
        (["trainer.minibatches=2"], [1.0, 0, 1, 0, 0, 0, 0, 0]),  # a step between minibatches
    ],
)
def test_the_logged_entropy_covers_every_row_whatever_the_skip(make_engine, overrides, rewards):
    rewards = torch.tensor(rewards)
    logged, reference = [], []
    for skip in ("true", "false"):
        overrides_ = [f"trainer.skip_zero_advantage={skip}", "trainer.micro_batch_tokens=16"]
        cfg, engine, _ = make_engine([*overrides_, *overrides])
        reference.append(_entropy_of_every_row(cfg, engine.module, rewards))
        metrics = update(cfg, engine, small_experience(rewards), torch.Generator().manual_seed(0))
        logged.append(metrics)
    skipped, full = logged
    assert skipped["zero_advantage_rows"] >= 4  # the skip did leave rows out
    assert skipped["entropy"] == pytest.approx(full["entropy"], rel=1e-12, abs=0)
    if "trainer.minibatches=2" not in overrides:  # one minibatch: before any optimizer step
        assert full["entropy"] == pytest.approx(reference[1], rel=1e-12, abs=0)
    assert reference[0] == reference[1]  # both engines started from the same weights
