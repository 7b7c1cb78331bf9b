"""§2.11: PPO's critic arithmetic (tepo_cli/algos/gae.py) against float64 hand references."""

from __future__ import annotations

import pytest
import torch

from tepo_cli.algos.gae import gae, token_rewards, value_loss, whiten, whiten_sums

F64 = torch.float64


def batch(seed: int = 0, rows: int = 5, columns: int = 7):
    """Rows of mixed lengths, right padding on even rows and left padding on odd ones."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, columns + 1, (rows,), generator=gen)
    lengths[0] = columns
    mask = torch.zeros(rows, columns, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        if b % 2:
            mask[b, columns - n :] = True
        else:
            mask[b, :n] = True
    rewards = torch.randn(rows, generator=gen, dtype=F64)
    values = torch.randn(rows, columns, generator=gen, dtype=F64)
    return rewards, values, mask


def hand_gae(rewards, values, mask, gamma, lam):
    advantages = torch.zeros_like(values)
    for b in range(mask.shape[0]):
        cols = [c for c in range(mask.shape[1]) if mask[b, c]]
        r = [0.0] * len(cols)
        if cols:
            r[-1] = float(rewards[b])
        v = [float(values[b, c]) for c in cols] + [0.0]
        for i, c in enumerate(cols):
            advantages[b, c] = sum(
                (gamma * lam) ** k * (r[i + k] + gamma * v[i + k + 1] - v[i + k])
                for k in range(len(cols) - i)
            )
    return advantages, torch.where(mask, advantages + values, 0.0)


def test_token_rewards_sit_on_the_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.bool)
    got = token_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64), mask)
    expected = [[0, 0, 1, 0], [0, 0, 0, 2], [0, 0, 0, 0], [0, 0, 4, 0]]
    assert got.tolist() == expected


@pytest.mark.parametrize(("gamma", "lam"), [(0.9, 0.8), (0.99, 0.95), (1.0, 0.5), (0.5, 1.0)])
def test_gae_equals_the_hand_sum_of_discounted_deltas(gamma: float, lam: float):
    rewards, values, mask = batch()
    advantages, returns = gae(token_rewards(rewards, mask), values, mask, gamma, lam)
    expected, expected_returns = hand_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, expected_returns, rtol=0, atol=1e-12)
    assert torch.all(advantages[~mask] == 0) and torch.all(returns[~mask] == 0)


def test_undiscounted_with_a_zero_critic_every_token_gets_the_return():
    rewards, _, mask = batch(1)
    advantages, returns = gae(
        token_rewards(rewards, mask), torch.zeros_like(mask, dtype=F64), mask, 1.0, 1.0
    )
    expected = torch.where(mask, rewards.unsqueeze(1), 0.0)
    assert torch.equal(advantages, expected) and torch.equal(returns, expected)


def test_whitening_over_ranks_and_micro_batches_equals_one_big_batch():
    _, values, mask = batch(2, rows=8)
    whole = whiten(values, mask)
    parts = [slice(0, 3), slice(3, 4), slice(4, 8)]  # ranks or micro-batches
    summed = sum(whiten_sums(values[p], mask[p]) for p in parts)  # what all_reduce computes
    pieces = torch.cat([whiten(values[p], mask[p], summed) for p in parts])
    torch.testing.assert_close(pieces, whole, rtol=0, atol=1e-13)
    valid = whole[mask]
    assert abs(float(valid.mean())) < 1e-12 and abs(float(valid.std()) - 1) < 1e-6
    x = values[mask]  # verl's masked_whiten: (x - mean) * rsqrt(unbiased var + 1e-8)
    expected = (x - x.mean()) * torch.rsqrt(x.var() + 1e-8)
    torch.testing.assert_close(valid, expected, rtol=0, atol=1e-12)
    unshifted = whiten(values, mask, shift=False)
    torch.testing.assert_close(unshifted[mask], x * torch.rsqrt(x.var() + 1e-8), rtol=0, atol=1e-12)
    assert torch.all(whiten(values, torch.zeros_like(mask)) == 0)


def test_value_clipped_loss_takes_the_larger_branch():
    values = torch.tensor([1.0, 1.0, 0.0, 2.0], dtype=F64)
    old = torch.tensor([0.0, 0.9, 0.0, 0.0], dtype=F64)
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=F64)
    loss, clipped = value_loss(values, old, returns, clip=0.5)
    # row 0: V moved 1 from V_old=0, clipped to 0.5: max((1-1)^2, (0.5-1)^2) = 0.25 -> 0.125
    # row 1: moved 0.1 (inside the clip): both branches (1)^2 -> 0.5
    # row 2: unchanged: (0-1)^2 -> 0.5
    # row 3: moved 2, clipped to 0.5: max(4, 0.25) = 4 -> 2
    assert loss.tolist() == pytest.approx([0.125, 0.5, 0.5, 2.0], abs=1e-15)
    assert clipped.tolist() == [True, False, False, False]
    plain, none_clipped = value_loss(values, old, returns, clip=None)
    assert (
        plain.tolist() == pytest.approx([0.0, 0.5, 0.5, 2.0], abs=1e-15) and not none_clipped.any()
    )


def test_bad_inputs_name_the_problem():
    rewards, values, mask = batch()
    with pytest.raises(ValueError, match=r"must all be \[B, T\]"):
        gae(rewards, values, mask, 1.0, 1.0)
    with pytest.raises(ValueError, match="gamma and lam must lie in"):
        gae(values, values, mask, 1.5, 1.0)
