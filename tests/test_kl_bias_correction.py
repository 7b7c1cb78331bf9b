"""`algo.kl_bias_correction` (docs/objectives.md §0.6): the KL estimate weighted by π_θ/π_old.

The exact check enumerates a small vocabulary in float64: each action a is one sampled token,
weighted by π_old(a) as the sampler draws it; the weighted estimate must then be KL(π_θ‖π_ref) and
its gradient the KL's, which the plain k3 misses once π_θ ≠ π_old.
"""

from __future__ import annotations

import math

import pytest
import torch

from tepo_cli.algos import policy_loss, resolve_algo
from tepo_cli.algos.kl import importance_weighted, kl_estimate

F64 = torch.float64


def distributions(seed: int, vocab: int = 6):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=gen, dtype=F64, requires_grad=True)
    old = torch.log_softmax(torch.randn(vocab, generator=gen, dtype=F64), 0)
    ref = torch.log_softmax(torch.randn(vocab, generator=gen, dtype=F64), 0)
    return logits, old, ref


def test_the_weighted_estimate_is_the_kl_and_its_gradient_under_the_sampler():
    logits, old, ref = distributions(0)
    logp = torch.log_softmax(logits, 0)
    weighted = importance_weighted(kl_estimate(logp, ref, "k3"), logp, old)
    expectation = (old.exp() * weighted).sum()  # E over tokens drawn from π_old
    exact = (logp.exp() * (logp - ref)).sum()  # KL(π_θ ‖ π_ref)
    assert float(expectation.detach()) == pytest.approx(float(exact.detach()), rel=1e-12)
    grad_est = torch.autograd.grad(expectation, logits, retain_graph=True)[0]
    grad_kl = torch.autograd.grad(exact, logits, retain_graph=True)[0]
    assert torch.allclose(grad_est, grad_kl, rtol=1e-10, atol=1e-12)
    plain = (old.exp() * kl_estimate(logp, ref, "k3")).sum()  # the bias the weight removes
    assert abs(float(plain.detach()) - float(exact.detach())) > 1e-3


def batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=gen, dtype=F64) * 2 - 0.1
    old = logp + 0.2 * torch.randn(3, 5, generator=gen, dtype=F64)
    ref = logp + 0.3 * torch.randn(3, 5, generator=gen, dtype=F64)
    mask = torch.arange(5) < torch.tensor([5, 2, 4])[:, None]
    return logp, old, ref, torch.tensor([0.5, -1.0, 0.2], dtype=F64), mask


def test_the_loss_weighs_each_tokens_k3_by_its_ratio_and_the_metric_stays_plain():
    logp, old, ref, adv, mask = batch(1)
    args = dict(ref_logp=ref, beta=0.1, loss_agg="token-mean")
    _, plain = policy_loss("grpo", logp, old, adv, mask, **args)
    _, fixed = policy_loss("grpo", logp, old, adv, mask, **args, kl_bias_correction=True)
    total, count = 0.0, 0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                x = float(ref[b, t] - logp[b, t])
                total += math.exp(float(logp[b, t] - old[b, t])) * (math.exp(x) - x - 1)
                count += 1
    assert fixed["kl_loss"] == pytest.approx(0.1 * total / count, rel=1e-12)
    assert fixed["kl"] == plain["kl"] and fixed["pg_loss"] == plain["pg_loss"]
    assert fixed["kl_loss"] != plain["kl_loss"]


def test_on_policy_the_value_is_unchanged_and_the_gradient_gains_k3_times_the_score():
    """ρ = 1 on-policy: the same loss, but d/dℓ_t gains β·k3_t/N (the score-function term)."""
    logp, _, ref, adv, mask = batch(2)
    logp.requires_grad_(True)
    old = logp.detach()
    args = dict(ref_logp=ref, beta=0.1, loss_agg="token-mean")
    plain, _ = policy_loss("grpo", logp, old, adv, mask, **args)
    fixed, _ = policy_loss("grpo", logp, old, adv, mask, **args, kl_bias_correction=True)
    assert float(fixed.detach()) == pytest.approx(float(plain.detach()), rel=1e-14)
    grad_plain = torch.autograd.grad(plain, logp)[0]
    grad_fixed = torch.autograd.grad(fixed, logp)[0]
    x = (ref - logp.detach()).clamp(-20, 20)
    k3 = (x.exp() - x - 1).clamp(-10, 10)
    expected = torch.where(mask, 0.1 * k3 / int(mask.sum()), 0.0)
    assert torch.allclose(grad_fixed - grad_plain, expected, rtol=1e-10, atol=1e-15)


def test_off_by_default_and_bit_identical():
    logp, old, ref, adv, mask = batch(3)
    assert not resolve_algo("grpo").kl_bias_correction
    a = policy_loss("grpo", logp, old, adv, mask, ref_logp=ref)
    b = policy_loss("grpo", logp, old, adv, mask, ref_logp=ref, kl_bias_correction=False)
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
