"""TEPO's KL mask (algos/tepo_mask.py): the four entropy-decrease criteria on a hand-made batch
with left and right padding, per-response and per-token advantages, and the `first_order` test
fed from the chunked `token_entropy_terms` against the float64 full-softmax reference."""

from __future__ import annotations

import math

import pytest
import torch

from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.tepo_mask import tepo_kl_mask
from tepo_cli.kernels import token_entropy_terms
from tepo_cli.kernels.naive import naive_entropy_terms

F, T = False, True
LN_HALF = math.log(0.5)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# Row 0 right-padded (Â = 1), row 1 left-padded (Â = 2), row 2 unpadded with Â = -1. Each
# padding slot and all of row 2 hold values that would pass every criterion if not masked.
MASK = torch.tensor([[T, T, T, F], [F, T, T, T], [T, T, T, T]])
ADV = t([1.0, 2.0, -1.0])
OLD_LOGP = t([[-0.1, -2.0, LN_HALF, -0.1], [0.0, -1.0, -3.0, -0.5], [-0.1] * 4])
OLD_ENT = t([[0.5, 0.5, 1.0, 5.0], [1.0, 2.0, 1.0, 0.2], [1.0] * 4])
ENTROPY = t([[0.4, 0.6, 1.5, 0.0], [-1.0, 1.0, 2.0, 0.1], [0.0] * 4])
# S; c = p_a (ℓ_a + H) - S per token:
# row 0: 0.905*0.4-0.1 = 0.26, 0.135*(-1.5)+0.5 = 0.30, 0.5*0.307-0.2 = -0.05, (pad) 0.905*4.9
# row 1: (pad) 1*1+1 = 2, 0.368*1-0.5 = -0.13, 0.0498*(-2)+0.2 = 0.10, 0.607*(-0.3)-0 = -0.18
TERM = t([[0.1, -0.5, 0.2, 0.0], [-1.0, 0.5, -0.2, 0.0], [0.0] * 4])

EXPECTED = {
    "advantage_only": [[T, T, T, F], [F, T, T, T], [F] * 4],
    "covariance": [[T, F, T, F], [F, T, F, F], [F] * 4],  # ℓ + H > 0
    "entropy_drop": [[T, F, F, F], [F, T, F, T], [F] * 4],  # H < H_old
    "first_order": [[T, T, F, F], [F, F, T, F], [F] * 4],  # c > 0
}


def batch_of(adv, mask, old_logp, old_ent, entropy=None, term=None) -> PolicyBatch:
    """The mask's inputs as a batch (unchecked: padding keeps the values planted there)."""
    return PolicyBatch(
        old_logp, old_logp, adv, mask, entropy=entropy, old_entropy=old_ent, old_entropy_term=term
    )


def mask_for(criterion: str, adv: torch.Tensor = ADV) -> torch.Tensor:
    batch = batch_of(adv, MASK, OLD_LOGP, OLD_ENT, ENTROPY, TERM)
    return tepo_kl_mask(batch, criterion)  # type: ignore[arg-type]


@pytest.mark.parametrize("criterion", sorted(EXPECTED))
def test_criteria_on_hand_made_batch(criterion: str) -> None:
    got = mask_for(criterion)
    assert got.dtype == torch.bool
    assert got.tolist() == EXPECTED[criterion]


# Per-token advantages: a negative one switches single tokens off, and row 2 (all of whose
# tokens pass every criterion) now has positive tokens.
PER_TOKEN_ADV = t([[1.0, -1.0, 1.0, 1.0], [1.0, 1.0, -1.0, 1.0], [-1.0, 1.0, 1.0, 1.0]])
PER_TOKEN_EXPECTED = {
    "advantage_only": [[T, F, T, F], [F, T, F, T], [F, T, T, T]],
    "covariance": [[T, F, T, F], [F, T, F, F], [F, T, T, T]],
    "entropy_drop": [[T, F, F, F], [F, T, F, T], [F, T, T, T]],
    "first_order": [[T, F, F, F], [F, F, F, F], [F, T, T, T]],
}


@pytest.mark.parametrize("criterion", sorted(EXPECTED))
def test_per_token_advantages(criterion: str) -> None:
    assert mask_for(criterion, PER_TOKEN_ADV).tolist() == PER_TOKEN_EXPECTED[criterion]
    # A [B] advantage broadcast to [B, T] gives the same mask as the [B] form.
    expanded = ADV.unsqueeze(1).expand(3, 4)
    assert mask_for(criterion, expanded).tolist() == EXPECTED[criterion]


def test_first_order_without_entropy_term_raises() -> None:
    with pytest.raises(ValueError, match="old_entropy_term"):
        tepo_kl_mask(batch_of(ADV, MASK, OLD_LOGP, OLD_ENT), criterion="first_order")


def test_unknown_criterion_lists_all_four() -> None:
    with pytest.raises(ValueError) as info:
        tepo_kl_mask(batch_of(ADV, MASK, OLD_LOGP, OLD_ENT), criterion="bogus")  # type: ignore[arg-type]
    for name in EXPECTED:
        assert name in str(info.value)


def test_first_order_from_chunked_terms_matches_float64_reference() -> None:
    batch, length, width, vocab, temperature = 4, 6, 8, 23, 0.7
    gen = torch.Generator().manual_seed(10)
    hidden = torch.randn(batch * length, width, generator=gen)
    weight = torch.randn(vocab, width, generator=gen)
    # Sampled from the policy, as a rollout's tokens are (a uniform draw is mostly unlikely
    # tokens, for which c ≈ -S < 0).
    probs = torch.softmax(hidden.double() @ weight.double().t() / temperature, dim=-1)
    targets = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    lengths = torch.tensor([6, 4, 2, 5])
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.tensor([0.5, 1.0, -0.3, 2.0])

    logp, ent, term = (
        x.view(batch, length)
        for x in token_entropy_terms(hidden, weight, targets, temperature, 5, vocab_chunk_size=6)
    )
    got = tepo_kl_mask(batch_of(adv, mask, logp, ent, term=term), criterion="first_order")

    ref_logp, ref_ent, ref_term = (
        x.view(batch, length)
        for x in naive_entropy_terms(hidden.double(), weight.double(), targets, temperature)
    )
    c_ref = ref_logp.exp() * (ref_logp + ref_ent) - ref_term
    assert c_ref.abs().min().item() > 1e-3  # no token near the boundary: float32 must agree
    want = tepo_kl_mask(
        batch_of(adv, mask, ref_logp, ref_ent, term=ref_term), criterion="first_order"
    )
    assert got.tolist() == want.tolist()
    assert want.any() and (mask & (adv > 0).unsqueeze(1) & ~want).any()  # not all-or-nothing
