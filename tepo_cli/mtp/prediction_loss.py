"""What the MTP modules are trained and judged on (docs/objectives.md §1.5).

`mtp_prediction_loss` is L_MTP = Σ_n α_n · NLL_n, the modules' next-n-token prediction loss, used by
the warm-up and by the optional auxiliary term during RL (`mtp.aux_coef`). `mtp_metrics` compares
each depth's log-probs with the backbone's exact teacher-forced log-probs of the same tokens.
All inputs follow the policy's layout: `mtp_logp` [N, T, K−1], entry [b, t, n−2] scores
completion token t + n − 1 from anchor t; `mask` [N, T] marks the completion tokens (a
contiguous run from column 0, as the rollout makes them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


def mtp_present(mask: Tensor, depths: int) -> Tensor:
    """[N, T, depths] bool: depth n at anchor t has a target (tokens t and t + n − 1 both exist)."""
    mask = mask.bool()
    width = mask.shape[1]
    present = torch.zeros((*mask.shape, depths), dtype=torch.bool, device=mask.device)
    for offset in range(1, depths + 1):
        if offset < width:
            present[:, : width - offset, offset - 1] = mask[:, : width - offset] & mask[:, offset:]
    return present


def alpha_weights(depths: int, decay: float, dtype: torch.dtype = torch.float64) -> Tensor:
    """α_n ∝ decay^(n−2) for n = 2..K, summing to 1 ([our reading]: the paper's α_n decay)."""
    base = torch.tensor(decay, dtype=torch.float64, device="cpu")
    weights = torch.pow(base, torch.arange(depths, device="cpu"))
    return (weights / weights.sum()).to(dtype)


def mtp_prediction_loss(
    mtp_logp: Tensor, mask: Tensor, alpha_decay: float, num_tokens: float | None = None
) -> Tensor:
    """Σ_n α_n · (−Σ_present log p^(n)) / count_n.

    count_n is depth n's number of targets in these rows, or `num_tokens` for every depth when
    given (the optimizer step's global token count, so that micro-batches add up to the step).
    A depth without targets adds 0.
    """
    depths = mtp_logp.shape[-1]
    present = mtp_present(mask, depths)
    nll = torch.where(present, -mtp_logp, 0.0).sum(dim=(0, 1))
    if num_tokens is None:
        counts = present.sum(dim=(0, 1)).clamp(min=1).to(nll.dtype)
    else:
        counts = torch.full_like(nll, float(num_tokens))
    alpha = alpha_weights(depths, alpha_decay, nll.dtype).to(nll.device)
    return (alpha * nll / counts).sum()


@torch.no_grad()
def mtp_metrics(mtp_logp: Tensor, logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Per depth n: `mtp_nll_d{n}`, the modules' mean negative log-prob of their targets, and
    `mtp_exact_nll_d{n}`, the backbone's teacher-forced one for the same tokens (the gap is what
    the MTP approximation costs). Means over the targets present; depths without any are left out.
    """
    depths = mtp_logp.shape[-1]
    present = mtp_present(mask, depths)
    metrics: dict[str, float] = {}
    for offset in range(1, depths + 1):
        here = present[..., offset - 1]
        count = int(here.sum())
        if count == 0:
            continue
        exact = torch.zeros_like(logp)
        exact[:, : logp.shape[1] - offset] = logp[:, offset:]
        metrics[f"mtp_nll_d{offset + 1}"] = float(-mtp_logp[..., offset - 1][here].sum() / count)
        metrics[f"mtp_exact_nll_d{offset + 1}"] = float(-exact[here].sum() / count)
    return metrics


def worse_than_uniform(record: Mapping[str, Any], vocab: int) -> dict[int, float]:
    """{depth n: `mtp_nll_d{n}`} for the depths of a step's record whose modules gave the
    policy's own tokens a mean negative log-likelihood above ln V, a uniform guess's over the V
    tokens: confidently wrong, their log-ratios are noise rather than the tokens'."""
    bound = math.log(vocab)
    prefix = "mtp_nll_d"
    return {
        int(key[len(prefix) :]): float(value)
        for key, value in record.items()
        if key.startswith(prefix) and isinstance(value, int | float) and value > bound
    }
