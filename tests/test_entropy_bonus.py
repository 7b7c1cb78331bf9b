"""The entropy bonus `algo.entropy_coef` (docs/objectives.md §0.12) against float64 by hand.

The reference aggregates the entropies over the valid tokens in plain Python for each `loss_agg`;
the direction test takes a gradient step on logits through the kernel's entropy and checks that a
positive coefficient raises the entropy and a negative one lowers it.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from tiny_run import tiny_run

from tepo_cli.algos import policy_loss, resolve_algo
from tepo_cli.kernels import token_logprobs

F64 = torch.float64


def batch(seed: int, rows: int = 4, columns: int = 7):
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 3 - 0.05
    old = logp + 0.2 * torch.randn(shape, generator=gen, dtype=F64)
    adv = torch.randn(rows, generator=gen, dtype=F64)
    mask = torch.arange(columns) < torch.tensor([7, 3, 5, 1])[:, None]
    entropy = 2 * torch.rand(shape, generator=gen, dtype=F64)
    return logp, old, adv, mask, entropy


def reference_mean(entropy, mask, loss_agg: str) -> float:
    rows = [[float(entropy[b, t]) for t in range(mask.shape[1]) if mask[b, t]] for b in range(4)]
    tokens = sum(len(r) for r in rows)
    if loss_agg == "token-mean":
        return sum(map(sum, rows)) / tokens
    if loss_agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if loss_agg == "seq-mean-token-sum":
        return sum(map(sum, rows)) / len(rows)
    return sum(map(sum, rows)) / (len(rows) * mask.shape[1])  # seq-mean-token-sum-norm


@pytest.mark.parametrize(
    "loss_agg",
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
)
@pytest.mark.parametrize("coef", [0.01, -0.3])
def test_the_bonus_is_minus_coef_times_the_aggregated_entropy(loss_agg, coef):
    logp, old, adv, mask, entropy = batch(0)
    entropy.requires_grad_(True)
    args = ("grpo", logp, old, adv, mask)
    plain, plain_metrics = policy_loss(*args, beta=0, loss_agg=loss_agg)
    loss, metrics = policy_loss(
        *args, entropy=entropy, beta=0, loss_agg=loss_agg, entropy_coef=coef
    )
    expected = -coef * reference_mean(entropy.detach(), mask, loss_agg)
    assert float((loss - plain).detach()) == pytest.approx(expected, rel=1e-12)
    assert metrics["entropy_bonus_loss"] == pytest.approx(expected, rel=1e-12)
    assert metrics["pg_loss"] == plain_metrics["pg_loss"]
    (grad,) = torch.autograd.grad(loss, entropy)
    assert bool((grad[~mask] == 0).all())
    if loss_agg == "token-mean":  # −c / N on every valid token
        assert torch.allclose(grad[mask], torch.full_like(grad[mask], -coef / int(mask.sum())))


def test_zero_is_the_plugin_bit_for_bit_without_an_entropy():
    logp, old, adv, mask, entropy = batch(1)
    plain, metrics = policy_loss("dapo", logp, old, adv, mask)
    same, same_metrics = policy_loss("dapo", logp, old, adv, mask, entropy=entropy, entropy_coef=0)
    assert torch.equal(plain, same) and metrics == same_metrics
    assert "entropy_bonus_loss" not in same_metrics


@pytest.mark.parametrize(("coef", "direction"), [(0.5, 1.0), (-0.5, -1.0)])
def test_a_step_on_the_bonus_alone_moves_the_entropy_its_way(coef, direction):
    """Zero advantages and no KL: the loss is the bonus alone; one gradient step on the hidden
    states through the kernel's entropy raises it (c > 0) or lowers it (c < 0)."""
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(12, 8, generator=gen, dtype=F64, requires_grad=True)
    weight = torch.randn(20, 8, generator=gen, dtype=F64)
    targets = torch.randint(0, 20, (12,), generator=gen)

    def mean_entropy_and_loss():
        logp, entropy = token_logprobs(hidden, weight, targets, 1.0, with_entropy=True)
        shaped = (logp.view(3, 4), entropy.view(3, 4))
        mask = torch.ones(3, 4, dtype=torch.bool)
        loss, _ = policy_loss(
            "dapo",
            shaped[0],
            shaped[0].detach(),
            torch.zeros(3, dtype=F64),
            mask,
            entropy=shaped[1],
            entropy_coef=coef,
        )
        return float(entropy.detach().mean()), loss

    before, loss = mean_entropy_and_loss()
    (grad,) = torch.autograd.grad(loss, hidden)
    with torch.no_grad():
        hidden -= 0.05 * grad
    after, _ = mean_entropy_and_loss()
    assert direction * (after - before) > 0


def test_refusals_name_the_knob_or_the_input():
    logp, old, adv, mask, _ = batch(3)
    with pytest.raises(ValueError, match=r"entropy is required: entropy_coef=0\.01"):
        policy_loss("grpo", logp, old, adv, mask, beta=0, entropy_coef=0.01)
    with pytest.raises(ValidationError, match="entropy_coef"):
        resolve_algo("grpo", {"entropy_coef": float("nan")})


def test_the_bonus_keeps_every_row_in_the_update(compose_config):
    """The zero-advantage skip would drop rows the bonus still trains: it is off."""
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.train.zero_advantage import may_skip

    base = ["model=tiny", "algo=dapo", "trainer.skip_zero_advantage=true"]
    assert may_skip(load_train_config(compose_config("train", base)))
    cfg = load_train_config(compose_config("train", [*base, "algo.entropy_coef=0.01"]))
    assert cfg.algo.auxiliary_loss and not may_skip(cfg)


@pytest.mark.slow
def test_two_training_steps_log_the_bonus(compose_config, tmp_path):
    """algo=dapo (token-mean, one optimizer step a rollout): the logged bonus is −c times the
    logged entropy, the token mean over the same rows."""
    overrides = ["algo=dapo", "algo.dynamic_sampling=false", "algo.entropy_coef=0.02"]
    for record in tiny_run(compose_config, tmp_path, overrides).records:
        assert record["grad_norm"] > 0
        assert record["entropy_bonus_loss"] == pytest.approx(-0.02 * record["entropy"], rel=1e-5)
