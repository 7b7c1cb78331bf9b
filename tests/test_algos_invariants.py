"""The invariants of docs/objectives.md §2 (1-7), each its own test with real numbers (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from tepo_cli.algos import group_advantages, overlong_penalty, policy_loss

F64 = torch.float64
PRESETS = ["grpo", "dapo", "gspo", "tepo", "mpo_exact", "mpo_disjoint", "cispo", "sapo", "gmpo"]


def inputs(seed: int = 0, rows: int = 6, columns: int = 10, spread: float | list[float] = 0.3):
    """Random log-probs with mixed padding: even rows right-padded, odd rows left-padded.

    `spread`: standard deviation of ℓ_old − ℓ, one for all rows or one per row (cycled).
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = (-torch.rand(shape, generator=gen, dtype=F64) * 3 - 0.05).requires_grad_(True)
    spreads = spread if isinstance(spread, list) else [spread]
    scale = torch.tensor([spreads[b % len(spreads)] for b in range(rows)], dtype=F64)
    old = logp.detach() + scale[:, None] * torch.randn(shape, generator=gen, dtype=F64)
    ref = logp.detach() + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    old_ent = torch.rand(shape, generator=gen, dtype=F64) * 3
    adv = torch.randn(rows, generator=gen, dtype=F64)
    mask = torch.zeros(shape, dtype=torch.bool)
    lengths = torch.randint(1, columns + 1, (rows,), generator=gen)
    lengths[0] = columns
    for b in range(rows):
        n = int(lengths[b])
        if b % 2:
            mask[b, columns - n :] = True
        else:
            mask[b, :n] = True
    return logp, old, adv, mask, ref, old_ent


def loss_and_grad(algo, logp, *args, **kwargs):
    loss, metrics = policy_loss(algo, logp, *args, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


def assert_same(a, b, atol: float = 1e-12) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


# §2.1 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["mpo_exact", "mpo_disjoint"])
def test_mpo_k1_equals_grpo_token_surrogate(preset: str) -> None:
    """Either layout (the paper's sliding windows, the disjoint ablation); the MTP form with
    K = 1 is in test_algos_mpo.py."""
    logp, old, adv, mask, _, _ = inputs(1)
    grpo = loss_and_grad("grpo", logp, old, adv, mask, beta=0.0, loss_agg="token-mean")
    mpo = loss_and_grad(preset, logp, old, adv, mask, k=1)
    assert_same(mpo[0], grpo[0])
    assert_same(mpo[1], grpo[1])
    assert grpo[2]["clip_frac"] > 0  # off-policy enough that clipping takes part


# §2.2 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [10, 25])
def test_mpo_whole_response_block_mean_equals_gspo(k: int) -> None:
    logp, old, adv, mask, _, _ = inputs(2, spread=[0.0, 1e-4, 5e-3, 2e-4, 1e-2, 0.0])
    gspo = loss_and_grad("gspo", logp, old, adv, mask)
    mpo = loss_and_grad(
        "mpo_disjoint",
        logp,
        old,
        adv,
        mask,
        k=k,
        ratio_norm="mean",
        eps_low=3e-4,
        eps_high=4e-4,
        loss_agg="seq-mean-token-mean",
    )
    assert_same(mpo[0], gspo[0])
    assert_same(mpo[1], gspo[1])
    assert 0 < gspo[2]["clip_frac"] < 1  # some responses clipped, some not


# §2.3 ---------------------------------------------------------------------------------------------
def test_on_policy_gspo_gspo_token_grpo_gradients_agree() -> None:
    logp, _, adv, mask, _, _ = inputs(3)
    old = logp.detach().clone()
    gspo = loss_and_grad("gspo", logp, old, adv, mask)
    gspo_token = loss_and_grad("gspo", logp, old, adv, mask, route="token")
    grpo = loss_and_grad("grpo", logp, old, adv, mask, beta=0.0)
    assert_same(gspo_token[1], gspo[1])
    assert_same(grpo[1], gspo[1])
    assert gspo[1].abs().sum() > 0
    # The loss is −mean Â for all three (ratio 1), while the gradient is not zero (§1.1).
    assert_same(grpo[0], -adv.mean())
    assert_same(gspo[0], grpo[0])


# §2.4 ---------------------------------------------------------------------------------------------
def test_tepo_without_kl_equals_gspo_token_with_token_mean() -> None:
    logp, old, adv, mask, _, _ = inputs(4, spread=[0.0, 0.05, 1.0, 0.1, 1.5, 0.02])
    tepo = loss_and_grad("tepo", logp, old, adv, mask, beta=0.0)
    gspo_token = loss_and_grad(
        "gspo",
        logp,
        old,
        adv,
        mask,
        route="token",
        loss_agg="token-mean",
        eps_low=0.2,
        eps_high=0.28,
    )
    assert_same(tepo[0], gspo_token[0])
    assert_same(tepo[1], gspo_token[1])
    assert tepo[2]["clip_frac"] > 0


# §2.5 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_zero_variance_group_gives_exactly_zero_policy_gradient(preset: str) -> None:
    logp, old, _, mask, _, _ = inputs(5, rows=8)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 0.3, 0.3], dtype=F64)
    adv = group_advantages(rewards, group_size=4)
    assert torch.equal(adv[4:], torch.zeros(4, dtype=F64))
    _, grad, _ = loss_and_grad(preset, logp, old, adv, mask, beta=0.0)
    assert torch.all(grad[4:] == 0)
    assert grad[:4].abs().sum() > 0


def test_zero_variance_group_gets_no_tepo_kl_either() -> None:
    """TEPO's mask needs Â > 0, so its KL term leaves a zero-advantage group alone as well."""
    logp, old, _, mask, ref, old_ent = inputs(5, rows=8)
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2], dtype=F64), group_size=4)
    _, grad, metrics = loss_and_grad(
        "tepo", logp, old, adv, mask, ref_logp=ref, old_entropy=old_ent
    )
    assert torch.all(grad[4:] == 0)
    assert metrics["kl_loss"] > 0


@pytest.mark.parametrize("preset", PRESETS)
def test_padding_gets_exactly_zero_gradient_whatever_its_values(preset: str) -> None:
    logp, old, adv, mask, ref, old_ent = inputs(6)
    garbage = logp.detach().clone()
    garbage[~mask] = float("nan")
    garbage[~mask & (torch.arange(10) % 2 == 0)] = float("-inf")
    logp = garbage.requires_grad_(True)
    old = torch.where(mask, old, float("inf"))
    ref = torch.where(mask, ref, float("nan"))
    old_ent = torch.where(mask, old_ent, float("nan"))
    loss, grad, metrics = loss_and_grad(
        preset, logp, old, adv, mask, ref_logp=ref, old_entropy=old_ent
    )
    assert torch.isfinite(loss)
    assert torch.all(grad[~mask] == 0)
    assert torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


# §2.6 ---------------------------------------------------------------------------------------------
def test_soft_overlong_punishment_at_the_boundaries() -> None:
    lengths = torch.tensor([0, 10, 16, 17, 18, 19, 20, 21, 100])
    got = overlong_penalty(lengths, max_len=20, cache_len=4)
    expected = torch.tensor([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    assert torch.equal(got, expected.to(got.dtype))


# §2.7 ---------------------------------------------------------------------------------------------
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("preset", PRESETS)
def test_micro_batches_with_global_normalisers_equal_one_big_batch(preset: str, agg: str) -> None:
    logp, old, adv, mask, ref, old_ent = inputs(7, rows=6)
    extra = {"ref_logp": ref, "old_entropy": old_ent, "loss_agg": agg, "beta": 0.1}
    big, big_grad, _ = loss_and_grad(preset, logp, old, adv, mask, **extra)
    counts = {"num_tokens": int(mask.sum()), "num_seqs": 6, "max_len": mask.shape[1]}
    total = torch.zeros((), dtype=F64)
    grad = torch.zeros_like(logp)
    for rows in (slice(0, 2), slice(2, 6)):  # uneven split: 2 + 4 rows
        part = {
            key: value[rows] if isinstance(value, torch.Tensor) else value
            for key, value in extra.items()
        }
        loss, part_grad = _micro_batch(preset, logp, old, adv, mask, rows, part, counts)
        total = total + loss
        grad = grad + part_grad
    assert_same(total, big)
    assert_same(grad, big_grad)


def _micro_batch(preset, logp, old, adv, mask, rows, part, counts):
    """One micro-batch's loss; its gradient w.r.t. the full logp (zero outside its rows)."""
    loss, _ = policy_loss(preset, logp[rows], old[rows], adv[rows], mask[rows], **part, **counts)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def test_token_mean_without_global_normaliser_is_a_different_objective() -> None:
    """Why the normalisers exist: per-micro-batch token means do not add up to the big batch."""
    logp, old, adv, mask, _, _ = inputs(8)
    mask[:2, 3:] = False  # make the two halves hold different token counts
    big, _ = policy_loss("dapo", logp, old, adv, mask)
    halves = sum(
        policy_loss("dapo", logp[s], old[s], adv[s], mask[s])[0] / 2
        for s in (slice(0, 3), slice(3, 6))
    )
    assert not math.isclose(float(big.detach()), float(halves.detach()), abs_tol=1e-6)
