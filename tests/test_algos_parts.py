"""The shared parts one by one, and each knob changing the loss the way docs/objectives.md says."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tepo_cli.algos import (
    estimate_advantages,
    group_advantages,
    informative_groups,
    overlong_penalty,
    policy_loss,
    rloo_advantages,
)
from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.clip import clipped_surrogate
from tepo_cli.algos.gae import whiten_sums
from tepo_cli.algos.kl import kl_estimate
from tepo_cli.algos.overlong import resolve_overlong_lengths
from tepo_cli.algos.tepo_mask import tepo_kl_mask

F64 = torch.float64


def t(values, dtype=F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# advantage (§0.1) ---------------------------------------------------------------------------------
def test_group_advantages_std() -> None:
    rewards = t([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    got = group_advantages(rewards, group_size=2)
    std = math.sqrt(0.5)  # unbiased std of (1, 0)
    expected = [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), -0.5 / (std + 1e-6)]
    expected += [0.5 / (std + 1e-6), 1.0 / (math.sqrt(2) + 1e-6), -1.0 / (math.sqrt(2) + 1e-6)]
    assert got.tolist() == pytest.approx(expected, abs=1e-12)


def test_group_advantages_none_scale_and_equal_groups() -> None:
    rewards = t([1.0, 2.0, 6.0, 0.1, 0.1, 0.1])
    got = group_advantages(rewards, group_size=3, scale="none")
    assert got.tolist() == pytest.approx([-2.0, -1.0, 3.0, 0.0, 0.0, 0.0], abs=1e-12)
    assert torch.all(got[3:] == 0)  # exactly, not a rounding residue of the mean


def test_group_advantages_batch_scale_divides_by_the_step_s_deviation_on_every_rank() -> None:
    """Lite PPO / TRL's scale_rewards="batch": the group's mean, the whole step's std."""
    rewards = t([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0])
    got = group_advantages(rewards, group_size=2, scale="batch")
    values = rewards.tolist()
    mean = sum(values) / 8
    std = math.sqrt(sum((r - mean) ** 2 for r in values) / 7)  # unbiased, float64 by hand
    centred = [0.5, -0.5, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0]
    assert got.tolist() == pytest.approx([c / (std + 1e-6) for c in centred], abs=1e-12)
    assert torch.all(got[2:4] == 0) and torch.all(got[6:] == 0)  # equal groups: exactly 0
    # two ranks holding half the groups each, their (count, Σ, Σ²) summed: one rank's numbers
    halves = rewards[:4], rewards[4:]
    every = torch.ones(4, dtype=torch.bool)
    both = whiten_sums(halves[0], every) + whiten_sums(halves[1], every)
    split = [group_advantages(h, 2, scale="batch", reduce=lambda _: both) for h in halves]
    torch.testing.assert_close(torch.cat(split), got, rtol=0, atol=1e-14)
    assert not torch.allclose(group_advantages(halves[0], 2, scale="batch"), got[:4])


def test_rloo_is_each_reward_against_the_mean_of_the_others() -> None:
    """§2.11: Â_i = R_i − mean_{j≠i} R_j, which equals G/(G−1)·(R_i − mean R)."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(12, generator=gen, dtype=F64)
    for size in (2, 3, 4):
        got = rloo_advantages(rewards, size)
        groups = rewards.view(-1, size).tolist()
        loops = [
            r - sum(g[j] for j in range(size) if j != i) / (size - 1)
            for g in groups
            for i, r in enumerate(g)
        ]
        assert got.tolist() == pytest.approx(loops, abs=1e-14)
        centred = rewards.view(-1, size) - rewards.view(-1, size).mean(dim=1, keepdim=True)
        identity = (size / (size - 1) * centred).reshape(-1)
        torch.testing.assert_close(got, identity, rtol=0, atol=1e-14)
    flat = rloo_advantages(t([1.0, 1.0, 1.0, 0.3, 0.3, 0.3]), 3)
    assert torch.all(flat == 0)  # equal rewards: exactly no signal
    assert torch.equal(estimate_advantages("rloo", rewards, 4), rloo_advantages(rewards, 4))
    assert torch.equal(estimate_advantages("grpo", rewards, 4), group_advantages(rewards, 4))
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        estimate_advantages("gae", rewards, 4)  # type: ignore[arg-type]


def test_group_advantages_errors() -> None:
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        group_advantages(t([1.0, 2.0]), group_size=1)
    with pytest.raises(ValueError, match="not a multiple"):
        group_advantages(t([1.0, 2.0, 3.0]), group_size=2)
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(t([[1.0, 2.0]]), group_size=2)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(t([1.0, 2.0]), group_size=2, scale="rank")  # type: ignore[arg-type]


def test_informative_groups_use_correctness() -> None:
    correct = torch.tensor([1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0])
    assert informative_groups(correct, 2).tolist() == [False, False, False, False, True, True]
    assert informative_groups(correct.bool(), 4).tolist() == [True, True, True]
    assert informative_groups(correct, 6).tolist() == [True, True]
    assert informative_groups(torch.tensor([0, 0, 0, 1, 1, 1]), 3).tolist() == [False, False]


# overlong punishment (§1.2) ------------------------------------------------------------------------
def test_overlong_penalty_linear_zone_and_errors() -> None:
    got = overlong_penalty(torch.arange(8, dtype=F64), max_len=6, cache_len=3)
    assert got.tolist() == pytest.approx([0, 0, 0, 0, -1 / 3, -2 / 3, -1, -1], abs=1e-12)
    assert overlong_penalty(torch.arange(8), 6, 3).dtype == torch.get_default_dtype()
    with pytest.raises(ValueError, match="cache_len < max_len"):
        overlong_penalty(torch.arange(3), max_len=4, cache_len=4)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.arange(3), max_len=4, cache_len=0)


def test_resolve_overlong_lengths_defaults() -> None:
    assert resolve_overlong_lengths(None, None, 20480) == (20480, 4096)
    assert resolve_overlong_lengths(None, None, 3) == (3, 1)
    assert resolve_overlong_lengths(100, 10, 16) == (100, 10)
    with pytest.raises(ValueError, match="smaller than overlong_max_len"):
        resolve_overlong_lengths(None, 16, 16)


# KL estimators (§0.6) -----------------------------------------------------------------------------
def test_kl_estimators_values() -> None:
    logp = t([-1.0, -2.0, -0.5])
    target = t([-1.5, -1.0, -0.5])
    x = target - logp  # -0.5, 1.0, 0
    assert kl_estimate(logp, target, "k1").tolist() == pytest.approx((-x).tolist())
    assert kl_estimate(logp, target, "k2").tolist() == pytest.approx((x * x / 2).tolist())
    k3 = [math.exp(v) - v - 1 for v in x.tolist()]
    assert kl_estimate(logp, target, "k3").tolist() == pytest.approx(k3, abs=1e-15)
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(logp, target, "k4")  # type: ignore[arg-type]


def test_k3_is_clamped_finite_and_flat_far_away() -> None:
    logp = t([0.0, 0.0, 0.0, 0.0]).requires_grad_(True)
    target = t([-50.0, 50.0, 800.0, 2.0])
    d = kl_estimate(logp, target, "k3")
    assert d.tolist()[:3] == [10.0, 10.0, 10.0]
    (grad,) = torch.autograd.grad(d.sum(), logp)
    assert grad.tolist()[:3] == [0.0, 0.0, 0.0]
    assert grad[3] == pytest.approx(-(math.exp(2.0) - 1))


# TEPO mask (§1.4) ---------------------------------------------------------------------------------
def test_tepo_mask_covariance_and_entropy_drop() -> None:
    adv = t([1.0, -1.0])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    old_logp = t([[-0.5, -2.0, -0.1, -0.1], [-0.1, -0.1, -0.1, -0.1]])
    old_ent = t([[1.0, 1.0, 0.0, 5.0], [1.0, 1.0, 1.0, 1.0]])
    entropy = t([[0.5, 0.5, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    without = PolicyBatch(old_logp, old_logp, adv, mask, old_entropy=old_ent)
    cov = tepo_kl_mask(without, criterion="covariance")
    # ℓ_old + H_old: 0.5 > 0, -1 < 0, -0.1 < 0, padding; row 2 has Â < 0.
    assert cov.tolist() == [[True, False, False, False], [False] * 4]
    with_entropy = dataclasses.replace(without, entropy=entropy)
    drop = tepo_kl_mask(with_entropy, criterion="entropy_drop")
    assert drop.tolist() == [[True, True, False, False], [False] * 4]
    with pytest.raises(ValueError, match="entropy is required"):
        tepo_kl_mask(without, criterion="entropy_drop")


# clipped surrogate (§0.4) -------------------------------------------------------------------------
def test_clipped_surrogate_values_and_flags() -> None:
    ratio = t([0.5, 0.5, 1.0, 1.5, 1.5, 4.0]).requires_grad_(True)
    adv = t([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    loss, flags = clipped_surrogate(ratio, adv, 0.2, 0.28)
    assert loss.tolist() == pytest.approx([-0.5, 0.8, -1.0, -1.28, 1.5, 4.0])
    assert flags.high.tolist() == [False, False, False, True, False, False]
    assert flags.low.tolist() == [False, True, False, False, False, False]
    (grad,) = torch.autograd.grad(loss.sum(), ratio)
    assert grad.tolist() == [-1.0, 0.0, -1.0, 0.0, 1.0, 1.0]


def test_dual_clip_caps_negative_advantages_only() -> None:
    ratio = t([4.0, 2.0, 4.0]).requires_grad_(True)
    adv = t([-1.0, -1.0, 1.0])
    loss, flags = clipped_surrogate(ratio, adv, 0.2, 0.2, dual_clip=3.0)
    assert loss.tolist() == pytest.approx([3.0, 2.0, -1.2])
    assert flags.dual.tolist() == [True, False, False]
    (grad,) = torch.autograd.grad(loss.sum(), ratio)
    assert grad.tolist() == [0.0, 1.0, 0.0]


# aggregation (§0.5) -------------------------------------------------------------------------------
def test_aggregation_modes() -> None:
    values = t([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(values, mask, "seq-mean-token-sum")) == pytest.approx(10 / 2)
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm")) == pytest.approx(10 / 8)
    assert float(aggregate(values, mask, "token-mean", num_tokens=20)) == pytest.approx(0.5)
    assert float(aggregate(values, mask, "seq-mean-token-sum", num_seqs=5)) == pytest.approx(2)
    norm = aggregate(values, mask, "seq-mean-token-sum-norm", num_seqs=4, max_len=10)
    assert float(norm) == pytest.approx(10 / 40)
    empty = torch.zeros_like(mask)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert float(aggregate(values, empty, agg)) == 0.0  # type: ignore[arg-type]


# knobs through policy_loss ------------------------------------------------------------------------
def batch(adv_sign: float, seed: int = 0, spread: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(4, 6, generator=gen, dtype=F64) - 0.1).requires_grad_(True)
    old = logp.detach() + spread * torch.randn(4, 6, generator=gen, dtype=F64)
    adv = adv_sign * (torch.rand(4, generator=gen, dtype=F64) + 0.1)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, :2] = False
    return logp, old, adv, mask


def run(algo, logp, old, adv, mask, **kw):
    loss, metrics = policy_loss(algo, logp, old, adv, mask, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), grad, metrics


@pytest.mark.parametrize("algo", ["dapo", "mpo_exact", "mpo_disjoint", "gspo"])
def test_eps_high_only_affects_positive_advantages(algo: str) -> None:
    neg = batch(-1.0)
    a, b = run(algo, *neg, eps_high=0.05), run(algo, *neg, eps_high=0.5)
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    pos = batch(+1.0)
    assert run(algo, *pos, eps_high=0.05)[0] != run(algo, *pos, eps_high=0.5)[0]


@pytest.mark.parametrize("algo", ["dapo", "mpo_exact", "mpo_disjoint", "gspo"])
def test_eps_low_only_affects_negative_advantages(algo: str) -> None:
    pos = batch(+1.0)
    a, b = run(algo, *pos, eps_low=0.05), run(algo, *pos, eps_low=0.5)
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    neg = batch(-1.0)
    assert run(algo, *neg, eps_low=0.05)[0] != run(algo, *neg, eps_low=0.5)[0]


def test_dual_clip_knob_bounds_the_loss_of_negative_advantages() -> None:
    logp, old, adv, mask = batch(-1.0, spread=3.0)
    free, _, m_free = run("dapo", logp, old, adv, mask)
    capped, _, m_capped = run("dapo", logp, old, adv, mask, dual_clip=2.0)
    assert capped < free
    assert m_capped["dual_clip_frac"] > 0 and m_free["dual_clip_frac"] == 0
    # Every token's loss is at most 2 |Â|, so the token-mean is at most the mean of 2 |Â| per token.
    bound = float((2 * adv.abs()[:, None].expand(4, 6)[mask]).mean())
    assert capped <= bound + 1e-12


def test_ratio_norm_mean_shrinks_block_log_ratio() -> None:
    logp, old, adv, mask = batch(1.0, spread=0.2)
    s = run("mpo_disjoint", logp, old, adv, mask, eps_high=10.0, eps_low=0.99)
    m = run("mpo_disjoint", logp, old, adv, mask, ratio_norm="mean", eps_high=10.0, eps_low=0.99)
    assert s[2]["ratio_mean"] != m[2]["ratio_mean"]
    assert abs(math.log(m[2]["ratio_mean"])) < abs(math.log(s[2]["ratio_mean"]))


def test_route_token_same_value_gradient_through_own_token_only() -> None:
    """route=token keeps each token's ratio value ρ_u, but token t's gradient is ρ_u ∇ℓ_t alone:
    for a joint (sum) block ratio that is 1/|u| of the unit-routed gradient, for a mean ratio it is
    the same (GSPO-token = GSPO with per-sequence advantages, §1.3)."""
    logp, old, adv, mask = batch(1.0, spread=0.02)
    wide = {"eps_low": 0.9, "eps_high": 9.0}
    for algo, extra in (("gspo", {}), ("mpo_disjoint", {"ratio_norm": "mean"})):
        unit = run(algo, logp, old, adv, mask, **wide, **extra)
        token = run(algo, logp, old, adv, mask, route="token", **wide, **extra)
        assert unit[0] == pytest.approx(token[0], abs=1e-15)
        torch.testing.assert_close(unit[1], token[1], rtol=0, atol=1e-15)
    unit = run("mpo_disjoint", logp, old, adv, mask, k=3, **wide)
    token = run("mpo_disjoint", logp, old, adv, mask, k=3, route="token", **wide)
    assert unit[0] == pytest.approx(token[0], abs=1e-15)
    sizes = torch.full((4, 6), 3.0, dtype=F64)
    sizes[1] = torch.tensor([0.0, 0.0, 3.0, 3.0, 3.0, 1.0])  # row 1: 4 tokens, a block of 3 and 1
    torch.testing.assert_close(unit[1], sizes * token[1], rtol=0, atol=1e-15)
    sliding = {"k": 3, **wide}
    unit = run("mpo_exact", logp, old, adv, mask, **sliding)
    token = run("mpo_exact", logp, old, adv, mask, route="token", **sliding)
    assert unit[0] == pytest.approx(token[0], abs=1e-15)
    assert not torch.allclose(unit[1], token[1])


def test_beta_scales_the_kl_term_linearly_and_targets() -> None:
    logp, old, adv, mask = batch(1.0)
    ref = logp.detach() - 0.3
    base = run("grpo", logp, old, adv, mask, ref_logp=ref, beta=0.0)
    one = run("grpo", logp, old, adv, mask, ref_logp=ref, beta=0.1)
    two = run("grpo", logp, old, adv, mask, ref_logp=ref, beta=0.2)
    assert two[0] - base[0] == pytest.approx(2 * (one[0] - base[0]), abs=1e-12)
    assert one[2]["kl_loss"] == pytest.approx(one[0] - base[0], abs=1e-12)
    assert base[2]["kl"] == one[2]["kl"] > 0  # monitored even at beta = 0
    # kl_target=old ignores ref_logp and needs none.
    old_target = run("grpo", logp, old, adv, mask, beta=0.1, kl_target="old")
    expected = float(kl_estimate(logp.detach(), old, "k3")[mask].mean())
    assert old_target[2]["kl"] == pytest.approx(expected, abs=1e-12)
    assert old_target[0] != one[0]


def test_tepo_mask_knob_changes_which_tokens_carry_kl() -> None:
    logp, old, adv, mask = batch(1.0)
    ref = logp.detach() - 0.3
    old_ent = torch.full_like(old, 0.5)  # ℓ_old + H_old > 0 only where ℓ_old > -0.5
    masked = run("tepo", logp, old, adv, mask, ref_logp=ref, old_entropy=old_ent)
    full = run("tepo", logp, old, adv, mask, ref_logp=ref, old_entropy=old_ent, kl_mask="none")
    share = float(((old + old_ent) > 0)[mask].double().mean())
    assert masked[2]["kl_mask_frac"] == pytest.approx(share)
    assert 0 < share < 1
    assert 0 < masked[2]["kl_loss"] < full[2]["kl_loss"]
    assert "kl_mask_frac" not in full[2]


def test_loss_agg_knob_changes_the_normaliser() -> None:
    logp, old, adv, mask = batch(1.0)
    by_agg = {
        agg: run("dapo", logp, old, adv, mask, loss_agg=agg)[0]
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
    }
    assert by_agg["seq-mean-token-sum"] == pytest.approx(by_agg["token-mean"] * 22 / 4)
    assert len(set(by_agg.values())) == 3
