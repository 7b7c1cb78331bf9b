"""A float64 off-policy batch for the objectives' hand references (tests/test_cispo.py,
tests/test_sapo.py): ratios from ~0.3 to ~3, both paddings, one row of length 1."""

from __future__ import annotations

import torch

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
