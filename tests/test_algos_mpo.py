"""MPO as the paper defines it (docs/objectives.md §1.5; invariants §2.1 and §2.9).

The hand reference below is written from the paper's Eq. 9–11 with plain loops over rows, anchors
and window slots; it shares no code with tepo_cli.algos or tepo_cli.kernels.units.
"""

from __future__ import annotations

import math

import pytest
import torch

from tepo_cli.algos import policy_loss

F64 = torch.float64
PAPER_BETAS = [0.82288, 0.06, 0.048, 0.0384, 0.03072]  # K = 5, beta_2 = 0.06, lambda = 0.8


def make_batch(seed: int, rows: int = 5, columns: int = 9, k: int = 5, spread: float = 0.3):
    """Off-policy log-probs with rows of mixed lengths, padded on the right (even rows) or on the
    left (odd rows); MTP log-probs for depths 2..k at every anchor (garbage where no target)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = (-torch.rand(shape, generator=gen, dtype=F64) * 2 - 0.1).requires_grad_(True)
    old = logp.detach() + spread * torch.randn(shape, generator=gen, dtype=F64)
    mtp = (-torch.rand((*shape, k - 1), generator=gen, dtype=F64) * 3 - 0.1).requires_grad_(True)
    old_mtp = mtp.detach() + spread * torch.randn((*shape, k - 1), generator=gen, dtype=F64)
    adv = torch.randn(rows, generator=gen, dtype=F64)
    lengths = torch.randint(1, columns + 1, (rows,), generator=gen)
    lengths[0] = columns
    mask = torch.zeros(shape, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        if b % 2:
            mask[b, columns - n :] = True
        else:
            mask[b, :n] = True
    return logp, old, mtp, old_mtp, adv, mask


def betas(beta2: float, lam: float, k: int) -> list[float]:
    future = [beta2 * lam ** (n - 2) for n in range(2, k + 1)]
    return [1.0 - sum(future), *future]


def paper_loss(
    logp, old, mtp, old_mtp, adv, mask, k, beta, eps=0.2, tail="drop", future="mtp"
) -> torch.Tensor:
    """Eq. 11: −(1 / Σ|o_i|) Σ_i Σ_t min(R̃ A, clip(R̃, 1 ± ε) A), R̃ = exp(Σ_n β_n d^(n)) (Eq. 9)."""
    total = torch.zeros((), dtype=F64)
    count = 0
    for b in range(mask.shape[0]):
        cols = [c for c in range(mask.shape[1]) if mask[b, c]]
        a = float(adv[b])
        for i, c in enumerate(cols):
            n_t = min(k, len(cols) - i)
            weights = beta[:n_t]
            if tail == "renormalise":
                weights = [w / sum(weights) for w in weights]
            d = weights[0] * (logp[b, c] - old[b, c])
            for n in range(2, n_t + 1):
                if future == "mtp":
                    term = mtp[b, c, n - 2] - old_mtp[b, c, n - 2]
                else:
                    target = cols[i + n - 1]
                    term = logp[b, target] - old[b, target]
                d = d + weights[n - 1] * term
            ratio = torch.exp(d)
            plain = ratio * a
            clipped = torch.clamp(ratio, 1 - eps, 1 + eps) * a
            smaller = float(plain.detach()) <= float(clipped.detach())
            total = total + (plain if smaller else clipped)
            count += 1
    return -total / max(count, 1)


def mpo(logp, old, mtp, old_mtp, adv, mask, **knobs):
    return policy_loss("mpo", logp, old, adv, mask, mtp_logp=mtp, old_mtp_logp=old_mtp, **knobs)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tail", ["drop", "renormalise"])
def test_loss_and_gradients_equal_a_hand_implementation_of_eq_9_to_11(seed: int, tail: str):
    logp, old, mtp, old_mtp, adv, mask = make_batch(seed)
    loss, metrics = mpo(logp, old, mtp, old_mtp, adv, mask, tail=tail)
    grads = torch.autograd.grad(loss, (logp, mtp))
    expected = paper_loss(logp, old, mtp, old_mtp, adv, mask, 5, PAPER_BETAS, tail=tail)
    expected_grads = torch.autograd.grad(expected, (logp, mtp))
    assert math.isclose(float(loss), float(expected), rel_tol=0, abs_tol=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert 0 < metrics["clip_frac"] < 1  # both branches of the clip are exercised
    assert grads[1].abs().sum() > 0  # the MTP terms carry gradient


def test_exact_future_equals_the_hand_implementation_with_backbone_terms():
    logp, old, _, _, adv, mask = make_batch(3)
    loss, _ = policy_loss("mpo_exact", logp, old, adv, mask, k=4)
    (grad,) = torch.autograd.grad(loss, logp)
    beta = betas(0.06, 0.8, 4)
    expected = paper_loss(logp, old, None, None, adv, mask, 4, beta, future="exact")
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert math.isclose(float(loss), float(expected), rel_tol=0, abs_tol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 5, 12])
@pytest.mark.parametrize("future", ["mtp", "exact"])
def test_beta2_zero_is_token_level_ppo_clip(k: int, future: str):
    """§2.9: with β₂ = 0 every window is its first token: token-level PPO-clip with token-mean,
    and the MTP log-probs get exactly zero gradient."""
    logp, old, mtp, old_mtp, adv, mask = make_batch(4, k=max(k, 2))
    mtp, old_mtp = mtp[..., : k - 1], old_mtp[..., : k - 1]
    grpo, _ = policy_loss("grpo", logp, old, adv, mask, beta=0.0, loss_agg="token-mean")
    grpo_grad = torch.autograd.grad(grpo, logp)[0]
    knobs = {"k": k, "block_weights": "decay:0,0.8", "future": future}
    extra = {"mtp_logp": mtp, "old_mtp_logp": old_mtp} if future == "mtp" else {}
    loss, metrics = policy_loss("mpo", logp, old, adv, mask, **extra, **knobs)
    assert metrics["clip_frac"] > 0
    assert math.isclose(float(loss), float(grpo), rel_tol=0, abs_tol=1e-14)
    if future == "mtp" and k > 1:
        grad, mtp_grad = torch.autograd.grad(loss, (logp, mtp))
        assert torch.all(mtp_grad == 0)
    else:
        (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, grpo_grad, rtol=0, atol=1e-14)


@pytest.mark.parametrize("k", [3, 5])
def test_on_policy_unclipped_coefficient_is_the_sum_of_the_first_betas(k: int):
    """§2.9: future=exact, π_old = π, no clip: token m (1-based) gets Σ_{n ≤ min(m, K)} β_n times
    GRPO's gradient — GRPO's own from m = K on."""
    logp, _, _, _, adv, mask = make_batch(5)
    old = logp.detach().clone()
    grpo, _ = policy_loss("grpo", logp, old, adv, mask, beta=0.0, loss_agg="token-mean")
    grpo_grad = torch.autograd.grad(grpo, logp)[0]
    loss, metrics = policy_loss("mpo_exact", logp, old, adv, mask, k=k)
    (grad,) = torch.autograd.grad(loss, logp)
    assert metrics["clip_frac"] == 0 and metrics["ratio_mean"] == 1.0
    beta = betas(0.06, 0.8, k)
    cumulative = torch.tensor([sum(beta[: n + 1]) for n in range(k)], dtype=F64)
    position = (torch.cumsum(mask.long(), dim=1) - 1).clamp(min=0, max=k - 1)
    expected = torch.where(mask, cumulative[position] * grpo_grad, 0.0)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    assert torch.allclose(grad[mask & (position == k - 1)], grpo_grad[mask & (position == k - 1)])


def test_k1_with_mtp_is_grpos_token_surrogate():
    """§2.1 for the paper's form: K = 1 has no MTP depth at all."""
    logp, old, _, _, adv, mask = make_batch(6)
    empty = torch.zeros((*mask.shape, 0), dtype=F64)
    grpo, _ = policy_loss("grpo", logp, old, adv, mask, beta=0.0, loss_agg="token-mean")
    loss, _ = mpo(logp, old, empty, empty, adv, mask, k=1)
    assert torch.equal(loss, grpo)
    torch.testing.assert_close(
        torch.autograd.grad(loss, logp)[0], torch.autograd.grad(grpo, logp)[0], rtol=0, atol=0
    )


def test_padding_and_absent_window_slots_get_exactly_zero_gradient():
    logp, old, mtp, old_mtp, adv, mask = make_batch(7)
    with torch.no_grad():  # garbage where nothing is read must stay harmless
        logp[~mask] = 50.0
        mtp[~mask] = float("nan")
    loss, _ = mpo(logp, old, mtp, old_mtp, adv, mask)
    grad, mtp_grad = torch.autograd.grad(loss, (logp, mtp))
    assert torch.isfinite(loss)
    assert torch.all(grad[~mask] == 0) and torch.all(mtp_grad[~mask] == 0)
    tokens_left = mask.sum(1, keepdim=True) - (torch.cumsum(mask.long(), 1) - 1)
    for n in range(2, 6):
        absent = mask & (tokens_left < n)  # anchor t has no token n − 1 places ahead
        assert torch.all(mtp_grad[..., n - 2][absent] == 0)
        assert mtp_grad[..., n - 2][mask & (tokens_left >= n)].abs().sum() > 0


def test_zero_variance_groups_give_exactly_zero_gradient():
    logp, old, mtp, old_mtp, _, mask = make_batch(8)
    loss, _ = mpo(logp, old, mtp, old_mtp, torch.zeros(5, dtype=F64), mask)
    grad, mtp_grad = torch.autograd.grad(loss, (logp, mtp))
    assert float(loss) == 0.0 and torch.all(grad == 0) and torch.all(mtp_grad == 0)


def test_micro_batches_with_global_normalisers_equal_one_big_batch():
    logp, old, mtp, old_mtp, adv, mask = make_batch(9, rows=6)
    whole, _ = mpo(logp, old, mtp, old_mtp, adv, mask)
    tokens = float(mask.sum())
    parts = [
        mpo(logp[r], old[r], mtp[r], old_mtp[r], adv[r], mask[r], num_tokens=tokens)[0]
        for r in (slice(0, 2), slice(2, 3), slice(3, 6))
    ]
    summed = sum(parts)
    assert math.isclose(float(summed), float(whole), rel_tol=0, abs_tol=1e-14)
    for a, b in zip(
        torch.autograd.grad(whole, (logp, mtp)),
        torch.autograd.grad(summed, (logp, mtp)),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def test_gradient_matches_finite_differences():
    logp, old, mtp, old_mtp, adv, mask = make_batch(10, rows=3, columns=6, spread=1e-3)

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return mpo(x, old, y, old_mtp, adv, mask)[0]

    assert torch.autograd.gradcheck(loss, (logp, mtp), eps=1e-6, atol=1e-7)


def test_missing_or_misshaped_mtp_inputs_name_the_argument():
    logp, old, mtp, old_mtp, adv, mask = make_batch(11)
    with pytest.raises(ValueError, match=r"^mtp_logp is required: algo mpo uses future=mtp"):
        policy_loss("mpo", logp, old, adv, mask)
    with pytest.raises(ValueError, match=r"^old_mtp_logp is required"):
        policy_loss("mpo", logp, old, adv, mask, mtp_logp=mtp)
    with pytest.raises(ValueError, match=r"^mtp_logp has 4 MTP depths .* k=3 needs k - 1 = 2"):
        mpo(logp, old, mtp, old_mtp, adv, mask, k=3)
    with pytest.raises(ValueError, match=r"^mtp_logp must be \[B, T, K-1\]"):
        mpo(logp, old, mtp[:, :-1], old_mtp, adv, mask)
    with pytest.raises(ValueError, match=r"^old_mtp_logp .* must match"):
        mpo(logp, old, mtp, old_mtp[..., :2], adv, mask)
