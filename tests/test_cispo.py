"""§1.7 CISPO against a float64 reference written from docs/objectives.md, and what sets it apart
from PPO's clip: a token outside the clip range keeps a gradient, bounded by its clipped weight."""

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

from tepo_cli.algos import load_preset, policy_loss, resolve_algo

F64 = torch.float64


def _reference(knobs: dict, logp, old, adv, mask, ref, weights=None) -> torch.Tensor:
    """−w·A·ℓ per token (w a plain float: no gradient through it), + β·k3 KL, aggregated by
    hand; w is the clipped token ratio, or the answer's clipped mean-log ratio."""
    low, high = 1 - knobs["eps_low"], 1 + knobs["eps_high"]
    d = (logp.detach() - old).tolist()
    means = [
        sum(d[b][t] for t in range(mask.shape[1]) if mask[b, t]) / max(int(mask[b].sum()), 1)
        for b in range(mask.shape[0])
    ]

    def term(b: int, t: int) -> torch.Tensor:
        ratio = math.exp(means[b] if knobs["unit"] == "sequence" else d[b][t])
        w = min(max(ratio, low), high)
        a = float(adv[b, t]) if adv.dim() == 2 else float(adv[b])
        return -w * a * logp[b, t] * (1.0 if weights is None else float(weights[b, t]))

    return hand_loss(knobs, logp, mask, ref, term)


VARIANTS = [
    {},
    {"eps_low": 0.2, "eps_high": 0.28},
    {"unit": "sequence", "ratio_norm": "mean", "eps_low": 0.5, "eps_high": 0.5},
    {"loss_agg": "seq-mean-token-mean", "beta": 0.05, "eps_high": 1.0},
]


@pytest.mark.parametrize("knobs", VARIANTS, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_match_the_float64_reference(knobs: dict, seed: int) -> None:
    assert_matches_reference("cispo", knobs, seed, _reference)


@pytest.mark.parametrize("knobs", [{}, {"unit": "sequence", "ratio_norm": "mean"}], ids=str)
def test_token_advantages_and_mismatch_weights_match_the_reference(knobs: dict) -> None:
    """Each token takes its own advantage, also when its weight is its answer's ratio."""
    logp, old, adv, mask, ref, weights = off_policy_batch(2)
    token_adv = adv[:, None] + 0.3 * torch.randn(mask.shape, dtype=F64)
    loss, _ = policy_loss("cispo", logp, old, token_adv, mask, token_weights=weights, **knobs)
    cfg = {**load_preset("cispo"), **knobs}
    expected = _reference(cfg, logp, old, token_adv, mask, ref, weights)
    torch.testing.assert_close(
        torch.autograd.grad(loss, logp)[0],
        torch.autograd.grad(expected, logp)[0],
        rtol=0,
        atol=1e-12,
    )


def test_a_token_outside_the_clip_keeps_a_bounded_gradient_where_ppo_gives_none() -> None:
    """Row 0: A = +1, the first token's ratio 10 (above 1.28); row 1: A = −1, the first token's
    ratio 0.1 (below 0.8). GRPO's clip leaves both without gradient; CISPO weighs them 1.28
    and 0.8: dL/dℓ = −w·A / N with N = 6 valid tokens."""
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    old = logp.detach().clone()
    old[0, 0] -= math.log(10.0)
    old[1, 0] -= math.log(0.1)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    knobs = {"eps_low": 0.2, "eps_high": 0.28}
    loss, metrics = policy_loss("cispo", logp, old, adv, mask, **knobs)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[-1.28, -1.0, -1.0], [0.8, 1.0, 1.0]], dtype=F64) / 6
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    assert metrics["clip_frac_high"] == metrics["clip_frac_low"] == 1 / 6
    ppo, _ = policy_loss("dapo", logp, old, adv, mask, **knobs)
    (ppo_grad,) = torch.autograd.grad(ppo, logp)
    assert ppo_grad[0, 0] == 0 and ppo_grad[1, 0] == 0


def test_on_policy_the_gradient_is_dapos_token_mean_policy_gradient() -> None:
    """With π = π_old every weight is 1 and every ratio is inside any clip: REINFORCE with the
    group advantage, as DAPO's surrogate (token-mean, no KL) gives it."""
    assert_same_on_policy_gradient("cispo", "dapo")


def test_padding_and_zero_advantage_rows_get_exactly_zero_gradient() -> None:
    logp, old, adv, mask, _, _ = off_policy_batch(4)
    adv = adv.clone()
    adv[2] = 0.0
    poisoned = logp.detach().masked_fill(~mask, float("nan")).requires_grad_(True)
    stale = old.masked_fill(~mask, float("inf"))
    loss, _ = policy_loss("cispo", poisoned, stale, adv, mask)
    (grad,) = torch.autograd.grad(loss, poisoned)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad[~mask].abs().sum() == 0 and grad[2].abs().sum() == 0
    assert grad[mask].abs().sum() > 0


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"dual_clip": 3.0}, "cispo has no such surrogate"),
        ({"eps_low": 1.5}, "less than or equal to 1"),
    ],
)
def test_knobs_cispo_cannot_honour_are_refused(knobs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        resolve_algo("cispo", knobs)
