"""`token_entropy_terms` (kernels/entropy_terms.py): (log p_a, H, S = sum_j p_j^2 (log p_j + H))
against the full-softmax float64 reference, a hand-computed case, float32 accuracy, argument
checks, and the sign of the first-order entropy change it predicts."""

from __future__ import annotations

import math

import pytest
import torch

from tepo_cli.kernels import token_entropy_terms, token_logprobs
from tepo_cli.kernels.naive import naive_entropy_terms

F64 = torch.float64


def make_inputs(n: int, h: int, v: int, dtype=F64, seed: int = 0, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=gen, dtype=F64) * scale).to(dtype)
    weight = torch.randn(v, h, generator=gen, dtype=F64).to(dtype)
    return hidden, weight, torch.randint(0, v, (n,), generator=gen)


@pytest.mark.parametrize(
    ("chunk", "vocab_chunk"),
    [
        (None, None),  # one block
        (1, None),  # one row at a time, whole vocabulary
        (5, 7),  # 8 row chunks (last one 2 rows), 15 tiles (last one 3 wide)
        (8, 1),  # one vocabulary entry per tile
        (37, 100),  # one row chunk, a last tile of width 1
        (4, 50),  # 3 tiles, the last 1 wide
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("scale", [1.0, 50.0, 1e-3])  # moderate, near one-hot, near uniform
def test_matches_float64_reference(chunk, vocab_chunk, temperature, scale) -> None:
    hidden, weight, targets = make_inputs(37, 16, 101, scale=scale)
    ours = token_entropy_terms(
        hidden, weight, targets, temperature, chunk, vocab_chunk_size=vocab_chunk
    )
    ref = naive_entropy_terms(hidden, weight, targets, temperature)
    for got, want in zip(ours, ref, strict=True):
        assert got.dtype == F64 and got.shape == (37,)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("vocab_chunk", [None, 1, 2])
@pytest.mark.parametrize(("h", "temperature"), [(1.0, 1.0), (0.5, 0.5)])
def test_hand_computed_three_token_vocabulary(vocab_chunk, h, temperature) -> None:
    # logits ln 1, ln 2, ln 3 -> p = (1/6, 1/3, 1/2); the target is the last token.
    weight = torch.tensor([[0.0], [math.log(2.0)], [math.log(3.0)]], dtype=F64)
    hidden = torch.tensor([[h]], dtype=F64)
    logp, ent, term = token_entropy_terms(
        hidden, weight, torch.tensor([2]), temperature, vocab_chunk_size=vocab_chunk
    )
    # H = ln6/6 + ln3/3 + ln2/2 = 1.0114042647073518
    # S = (H - ln6)/36 + (H - ln3)/9 + (H - ln2)/4 = 0.04819795713785899
    assert logp.item() == pytest.approx(-0.6931471805599453, abs=1e-14)  # ln(1/2)
    assert ent.item() == pytest.approx(1.0114042647073518, abs=1e-14)
    assert term.item() == pytest.approx(0.04819795713785899, abs=1e-14)


def test_single_token_vocabulary_is_zero() -> None:
    hidden, weight, targets = make_inputs(6, 4, 1)
    for value in token_entropy_terms(hidden, weight, targets, chunk_size=4):
        assert value.abs().max().item() < 1e-12


def test_float32_close_to_float64_and_consistent_with_token_logprobs() -> None:
    hidden, weight, targets = make_inputs(29, 16, 301, seed=3, scale=2.0)
    ref = token_entropy_terms(hidden, weight, targets, 0.7, 6, vocab_chunk_size=64)
    got = token_entropy_terms(hidden.float(), weight.float(), targets, 0.7, 6, vocab_chunk_size=64)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g.double(), r, rtol=0, atol=2e-5)
    logp, ent = token_logprobs(hidden, weight, targets, 0.7, True, backend="torch")
    assert ent is not None
    torch.testing.assert_close(ref[0], logp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref[1], ent, rtol=0, atol=1e-12)


def test_no_autograd_and_empty_input() -> None:
    hidden, weight, targets = make_inputs(5, 4, 9)
    outs = token_entropy_terms(hidden.requires_grad_(), weight.requires_grad_(), targets)
    assert not any(o.requires_grad for o in outs)
    empty = token_entropy_terms(hidden[:0], weight, targets[:0])
    assert [tuple(o.shape) for o in empty] == [(0,), (0,), (0,)]


def _entropy(z: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_first_order_entropy_change_sign_and_value() -> None:
    """A step eta A (e_a - p) on the (scaled) logits changes H by -eta A [p_a (l_a + H) - S]."""
    gen = torch.Generator().manual_seed(7)
    eta, checked, signs = 1e-6, 0, set()
    for trial in range(200):
        vocab = int(torch.randint(2, 9, (1,), generator=gen))
        temperature = (1.0, 0.7)[trial % 2]
        raw = torch.randn(1, vocab, generator=gen, dtype=F64) * 3.0
        target = torch.randint(0, vocab, (1,), generator=gen)
        logp, ent, term = token_entropy_terms(
            raw, torch.eye(vocab, dtype=F64), target, temperature, vocab_chunk_size=3
        )
        c = (logp.exp() * (logp + ent) - term).item()
        if abs(c) < 1e-2:  # the second-order term would dominate the tolerance
            continue
        z = raw[0] / temperature
        p = torch.softmax(z, dim=-1)
        one_hot = torch.nn.functional.one_hot(target[0], vocab).to(F64)
        for adv in (1.0, -1.0):
            actual = (_entropy(z + eta * adv * (one_hot - p)) - _entropy(z)).item()
            predicted = -eta * adv * c
            assert math.copysign(1.0, actual) == math.copysign(1.0, predicted)
            assert actual == pytest.approx(predicted, rel=1e-3)
        signs.add(c > 0)  # both signs of the bracket occur: the test is not one-sided
        checked += 1
    assert checked > 150 and signs == {True, False}


def test_validation_names_the_argument() -> None:
    hidden, weight, targets = make_inputs(4, 3, 5)
    with pytest.raises(ValueError, match="targets"):
        token_entropy_terms(hidden, weight, targets.int())
    with pytest.raises(ValueError, match="vocab_chunk_size"):
        token_entropy_terms(hidden, weight, targets, vocab_chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        token_entropy_terms(hidden, weight, targets, 0.0)
