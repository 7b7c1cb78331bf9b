"""A float64 off-policy batch for the objectives' hand references (tests/test_cispo.py,
tests/test_sapo.py): ratios from ~0.3 to ~3, both paddings, one row of length 1; and the check
that an objective's loss and gradient equal its reference's on it."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tepo_cli.algos import load_preset, policy_loss

F64 = torch.float64


def off_policy_batch(seed: int, rows: int = 6, columns: int = 8):
    """(logp with grad, old_logp, advantages [rows], mask, ref_logp, mismatch weights)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 3 - 0.05
    spread = torch.tensor([0.0, 0.05, 0.4, 1.0, 0.2, 0.6], dtype=F64)[:rows, None]
    old = logp + spread * torch.randn(shape, generator=gen, dtype=F64)
    ref = logp + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    adv = torch.randn(rows, generator=gen, dtype=F64)
    mask = torch.zeros(shape, dtype=torch.bool)
    lengths = torch.randint(1, columns + 1, (rows,), generator=gen).tolist()
    lengths[1] = 1
    for b, n in enumerate(lengths):
        if b % 2:
            mask[b, columns - n :] = True  # left padding
        else:
            mask[b, :n] = True
    weights = 0.5 + torch.rand(shape, generator=gen, dtype=F64)
    return logp.requires_grad_(True), old, adv, mask, ref, weights


def hand_loss(
    knobs: dict, logp, mask, ref, policy_term: Callable[[int, int], torch.Tensor]
) -> torch.Tensor:
    """Σ over each row's valid tokens of policy_term(row, token) + β·k3(ref, logp), then
    token-mean or seq-mean-token-mean as `knobs["loss_agg"]` says: plain loops, no tepo code."""
    rows, columns = logp.shape
    per_row, count, total = [], 0, torch.zeros((), dtype=F64)
    for b in range(rows):
        cols = [t for t in range(columns) if mask[b, t]]
        row = torch.zeros((), dtype=F64)
        for t in cols:
            term = policy_term(b, t)
            if knobs["beta"]:
                x = ref[b, t] - logp[b, t]
                term = term + knobs["beta"] * (torch.exp(x) - x - 1)
            row = row + term
        per_row.append(row / len(cols))
        total, count = total + row, count + len(cols)
    if knobs["loss_agg"] == "token-mean":
        return total / count
    assert knobs["loss_agg"] == "seq-mean-token-mean"
    return sum(per_row) / rows


def assert_matches_reference(
    objective: str, knobs: dict, seed: int, reference: Callable[..., torch.Tensor]
) -> dict[str, float]:
    """`objective` with `knobs` on `off_policy_batch(seed)`: loss and gradient equal (1e-12)
    `reference(knobs, logp, old, adv, mask, ref)`'s, padding gets none; returns its metrics."""
    logp, old, adv, mask, ref, _ = off_policy_batch(seed)
    loss, metrics = policy_loss(objective, logp, old, adv, mask, ref_logp=ref, **knobs)
    expected = reference({**load_preset(objective), **knobs}, logp, old, adv, mask, ref)
    (grad,) = torch.autograd.grad(loss, logp)
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert loss.dtype == F64 and math.isclose(loss.item(), expected.item(), abs_tol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)
    assert grad.abs().sum() > 0 and grad[~mask].abs().sum() == 0
    assert math.isclose(metrics["pg_loss"] + metrics["kl_loss"], loss.item(), abs_tol=1e-12)
    return metrics


def assert_same_on_policy_gradient(objective: str, other: str, **other_knobs) -> None:
    """On `off_policy_batch(3)` made on-policy (π_old = π), `objective`'s gradient is `other`'s."""
    logp, _, adv, mask, _, _ = off_policy_batch(3)
    old = logp.detach()
    first, _ = policy_loss(objective, logp, old, adv, mask)
    second, _ = policy_loss(other, logp, old, adv, mask, **other_knobs)
    torch.testing.assert_close(
        torch.autograd.grad(first, logp)[0],
        torch.autograd.grad(second, logp)[0],
        rtol=0,
        atol=1e-15,
    )
