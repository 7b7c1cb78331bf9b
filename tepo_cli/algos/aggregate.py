"""Loss aggregation with global normalisers (docs/objectives.md §0.5).

Each mode is a sum over the rows passed divided by a normaliser. When the caller passes the
normaliser of the whole optimizer step (`num_tokens`, `num_seqs`), summing the losses of the
micro-batches (and ranks) gives exactly the loss of one big batch: gradient accumulation and data
parallelism do not change the objective.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
Count = int | float | Tensor


def aggregate(
    values: Tensor,
    mask: Tensor,
    loss_agg: LossAgg,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: Count | None = None,
) -> Tensor:
    """Reduce per-token values [B, T] (padding ignored) to a 0-dim loss.

    - `token-mean`: Σ over valid tokens / `num_tokens` (default: valid tokens here).
    - `seq-mean-token-mean`: Σ_i (row token mean) / `num_seqs` (default: B rows).
    - `seq-mean-token-sum`: Σ / `num_seqs`.
    - `seq-mean-token-sum-norm`: Σ / (`num_seqs` × `max_len`) (Dr. GRPO; default max_len: T).
    A row or batch without valid tokens contributes 0; nothing divides by zero.
    """
    mask = mask.bool()
    values = torch.where(mask, values, 0.0)
    rows, columns = mask.shape
    seqs = _count(num_seqs, rows, values)
    if loss_agg == "token-mean":
        tokens = _count(num_tokens, mask.sum(), values)
        return values.sum() / tokens
    if loss_agg == "seq-mean-token-mean":
        row_lengths = mask.sum(dim=1).clamp(min=1).to(values.dtype)
        return (values.sum(dim=1) / row_lengths).sum() / seqs
    if loss_agg == "seq-mean-token-sum":
        return values.sum() / seqs
    if loss_agg == "seq-mean-token-sum-norm":
        return values.sum() / (seqs * _count(max_len, columns, values))
    raise ValueError(
        f"unknown loss_agg {loss_agg!r}: expected token-mean, seq-mean-token-mean, "
        "seq-mean-token-sum or seq-mean-token-sum-norm"
    )


def _count(given: Count | None, default: Count, like: Tensor) -> Tensor:
    """A normaliser as a tensor of `like`'s dtype; the local default is at least 1 (so an empty
    batch gives loss 0), a given global count is used as is (the caller checks it is positive)."""
    if given is not None:
        return torch.as_tensor(given, dtype=like.dtype, device=like.device)
    return torch.as_tensor(default, dtype=like.dtype, device=like.device).clamp(min=1)
