"""§1.9 GMPO against a float64 reference written from docs/objectives.md: each answer's ratio is
the geometric mean of its tokens' ratios, each clipped PPO's way before the mean."""

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
    """−A·exp(mean_t c_t) on each token of an answer (+ β·k3 KL): c_t = d_t, or the bound where
    the clip acts on the advantage's side (d > log(1 + ε_high) with A > 0, d < log(1 − ε_low)
    with A < 0), 0 when A = 0; branches written out, by hand."""
    high = math.log(1 + knobs["eps_high"])
    low = math.log(1 - knobs["eps_low"]) if knobs["eps_low"] < 1 else -math.inf
    ratios = []
    for b in range(mask.shape[0]):
        a, terms = float(adv[b]), []
        for t in (t for t in range(mask.shape[1]) if mask[b, t]):
            d = logp[b, t] - old[b, t]
            if a > 0 and d.item() > high:
                d = torch.tensor(high, dtype=F64)
            elif a < 0 and d.item() < low:
                d = torch.tensor(low, dtype=F64)
            terms.append(d if a != 0 else torch.zeros((), dtype=F64))
        ratios.append(torch.exp(sum(terms) / len(terms)))
    return hand_loss(knobs, logp, mask, ref, lambda b, t: -float(adv[b]) * ratios[b])


VARIANTS = [
    {},
    {"eps_low": 0.2, "eps_high": 0.2},
    {"eps_low": 0.1, "eps_high": 0.05, "loss_agg": "token-mean", "beta": 0.05},
    {"eps_low": 1.0, "eps_high": 0.3},
]


@pytest.mark.parametrize("knobs", VARIANTS, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_match_the_float64_reference(knobs: dict, seed: int) -> None:
    metrics = assert_matches_reference("gmpo", knobs, seed, _reference)
    if knobs.get("eps_high") == 0.05:  # the narrow clip acts on both sides of this batch
        assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0


def test_on_policy_the_gradient_is_gspos() -> None:
    """π = π_old: every token inside the clip, the geometric mean is GSPO's sequence ratio."""
    assert_same_on_policy_gradient("gmpo", "gspo")


def test_without_a_clip_acting_it_is_gspo_without_its_clip() -> None:
    """Wide bounds on both: the same value and gradient off-policy (mean log-ratio, −A·s_i)."""
    logp, old, adv, mask, _, _ = off_policy_batch(5)
    wide = {"eps_low": 1.0, "eps_high": 1e6}
    gmpo, _ = policy_loss("gmpo", logp, old, adv, mask, **wide)
    gspo, _ = policy_loss("gspo", logp, old, adv, mask, **wide)
    assert math.isclose(gmpo.item(), gspo.item(), rel_tol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(gmpo, logp)[0], torch.autograd.grad(gspo, logp)[0], rtol=1e-12, atol=0
    )


def test_one_outlying_token_moves_the_geometric_mean_less_than_the_arithmetic_one() -> None:
    """An answer of 4 tokens, one with ratio 3, A = 1, no clip: GMPO's ratio is 3^(1/4) ≈ 1.32,
    GRPO's token mean (3 + 1 + 1 + 1)/4 = 1.5."""
    logp = torch.zeros(1, 4, dtype=F64, requires_grad=True)
    old = torch.tensor([[-math.log(3.0), 0.0, 0.0, 0.0]], dtype=F64)
    adv, mask = torch.ones(1, dtype=F64), torch.ones(1, 4, dtype=torch.bool)
    wide = {"eps_low": 1.0, "eps_high": 1e6}
    gmpo, _ = policy_loss("gmpo", logp, old, adv, mask, **wide)
    grpo, _ = policy_loss("grpo", logp, old, adv, mask, beta=0.0, **wide)
    assert math.isclose(-gmpo.item(), 3**0.25, rel_tol=1e-12)
    assert math.isclose(-grpo.item(), 1.5, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [({"unit": "sequence"}, "gmpo clips each token's ratio"), ({"eps_low": 1.5}, "less than")],
)
def test_knobs_gmpo_cannot_honour_are_refused(knobs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        resolve_algo("gmpo", knobs)
