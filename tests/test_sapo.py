"""§1.8 SAPO against a float64 reference written from docs/objectives.md: a smooth gate on each
token's ratio, whose slope is 1 on-policy and fades, never to exactly zero, away from it."""

from __future__ import annotations

import math

import pytest
import torch
from off_policy_batch import (
    assert_matches_reference,
    assert_same_on_policy_gradient,
    hand_loss,
    off_policy_batch,
)
from pydantic import ValidationError

from tepo_cli.algos import policy_loss, resolve_algo

F64 = torch.float64


def _reference(knobs: dict, logp, old, adv, mask, ref) -> torch.Tensor:
    """−(4/τ)σ(τ(ρ − 1))·A per token (ρ the token's, or the answer's geometric-mean, ratio),
    τ by the sign of A, + β·k3 KL; seq-mean-token-mean or token-mean, by hand."""

    def term(b: int, t: int) -> torch.Tensor:
        a = float(adv[b])
        tau = knobs["tau_pos"] if a > 0 else knobs["tau_neg"]
        if knobs["unit"] == "sequence":
            cols = [c for c in range(mask.shape[1]) if mask[b, c]]
            ratio = torch.exp(sum(logp[b, c] - old[b, c] for c in cols) / len(cols))
        else:
            ratio = torch.exp(logp[b, t] - old[b, t])
        return -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * a

    return hand_loss(knobs, logp, mask, ref, term)


VARIANTS = [
    {},
    {"tau_pos": 0.5, "tau_neg": 3.0},
    {"loss_agg": "token-mean", "beta": 0.05},
    {"unit": "sequence", "ratio_norm": "mean"},
]


@pytest.mark.parametrize("knobs", VARIANTS, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_match_the_float64_reference(knobs: dict, seed: int) -> None:
    metrics = assert_matches_reference("sapo", knobs, seed, _reference)
    assert metrics["clip_frac"] == 0.0


def test_the_gradient_is_4_rho_sigma_one_minus_sigma_times_the_advantage() -> None:
    """One token a row, token-mean over 2: dL/dℓ = −4ρσ(1 − σ)·A / 2 with σ = σ(τ(ρ − 1)).
    At ρ = 10 (A > 0, τ = 1) the gate has nearly closed, yet the gradient is not zero, where
    PPO's clip gives exactly zero; at ρ = 1 it is −A / 2, the plain policy gradient."""
    logp = torch.full((2, 1), -1.0, dtype=F64, requires_grad=True)
    old = logp.detach() - torch.tensor([[math.log(10.0)], [0.0]], dtype=F64)
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    mask = torch.ones(2, 1, dtype=torch.bool)
    loss, _ = policy_loss("sapo", logp, old, adv, mask, loss_agg="token-mean")
    (grad,) = torch.autograd.grad(loss, logp)
    sigma = 1 / (1 + math.exp(-9.0))
    expected = torch.tensor([[-4 * 10 * sigma * (1 - sigma) / 2], [2.0 / 2]], dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=0)
    assert 0 < -grad[0, 0] < 1e-2
    ppo, _ = policy_loss("dapo", logp, old, adv, mask)
    assert torch.autograd.grad(ppo, logp)[0][0, 0] == 0


def test_on_policy_the_gradient_is_grpos_without_kl() -> None:
    assert_same_on_policy_gradient("sapo", "grpo", beta=0.0)


def test_each_temperature_acts_on_its_advantage_sign_only() -> None:
    logp, old, adv, mask, _, _ = off_policy_batch(4)
    base, _ = policy_loss("sapo", logp, old, adv, mask)
    hotter, _ = policy_loss("sapo", logp, old, adv, mask, tau_neg=5.0)
    grad, hotter_grad = (torch.autograd.grad(x, logp)[0] for x in (base, hotter))
    positive = adv > 0
    assert torch.equal(grad[positive], hotter_grad[positive])
    assert not torch.allclose(grad[~positive], hotter_grad[~positive])


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"tau_pos": 0.0}, "greater than 0"),
        ({"tau_neg": -1.0}, "greater than 0"),
        ({"dual_clip": 3.0}, "sapo has no such surrogate"),
    ],
)
def test_knobs_sapo_cannot_honour_are_refused(knobs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        resolve_algo("sapo", knobs)
