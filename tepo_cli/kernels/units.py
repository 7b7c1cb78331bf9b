"""The unit view: token, K-block and sequence units as segment reductions (ALGORITHMS.md §0.2).

Every objective works on per-token tensors `[B, T]` with a response mask. An *action unit* is a
run of consecutive valid tokens of one row; this module turns token values into unit values and
back, with index operations only (no Python loop over tokens, blocks or rows):

- `valid_positions(mask)`: index of each token among its row's valid tokens. Units are cut on
  this index, so blocks start at the first valid token of each row whichever side the padding is
  on, and a mask with holes simply skips them.
- `unit_view(mask, unit, k)` → `UnitView`: one unit id per token (padding goes to a dump slot
  that every reduction drops), unit sizes, and `sum` / `mean` / `broadcast`.
- `segment_sum(values, ids, num_units)`: the one reduction everything is built on.
- `sliding_window_sum(values, mask, k, weights)`: the sliding layout of §1.5, one window of the
  next min(K, tokens left) valid tokens per anchor token, with `uniform`, `future:p` or
  `geometric:γ` weights renormalised over the tokens present.

Unit ids live on a fixed grid: row b owns slots `b * U … b * U + U - 1` with U = ceil(T / K)
(U = T for tokens, 1 for sequences). Slots past the end of a short row are empty (size 0); they
cost memory only, never a wrong value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

UnitKind = Literal["token", "block", "sequence"]


def valid_positions(mask: Tensor) -> Tensor:
    """Index of each token among the valid tokens of its row (0 at the first one); -1 on padding."""
    mask = mask.bool()
    positions = torch.cumsum(mask.long(), dim=1) - 1
    return torch.where(mask, positions, -1)


def segment_sum(values: Tensor, ids: Tensor, num_units: int) -> Tensor:
    """Sum `values` into `num_units` slots by `ids` (same shape); the id `num_units` is dropped.

    Differentiable w.r.t. `values` (the backward pass is a gather), any dtype, any device.
    """
    if values.shape != ids.shape:
        raise ValueError(f"values {tuple(values.shape)} and ids {tuple(ids.shape)} differ in shape")
    out = values.new_zeros(num_units + 1)
    out = out.index_add(0, ids.reshape(-1), values.reshape(-1))
    return out[:num_units]


def broadcast_units(unit_values: Tensor, ids: Tensor, fill: float = 0.0) -> Tensor:
    """Every token takes its unit's value; tokens with the dump id `len(unit_values)` get `fill`."""
    padded = torch.cat([unit_values, unit_values.new_full((1,), fill)])
    return padded[ids]


def block_length(unit: UnitKind, k: int | None, num_columns: int) -> int:
    """Tokens per unit on the grid: 1, K, or the row width for a whole-sequence unit."""
    if unit == "token":
        return 1
    if unit == "block":
        if k is None or k < 1:
            raise ValueError(f"unit=block needs a block size k >= 1, got k={k}")
        return k
    if unit == "sequence":
        return max(num_columns, 1)
    raise ValueError(f"unknown unit {unit!r}: expected token, block or sequence")


@dataclass(frozen=True)
class UnitView:
    """Disjoint action units of a `[B, T]` batch.

    ids:       [B, T] int64 unit id of each token; padding tokens hold `num_units` (the dump slot).
    num_units: number of unit slots, B × units per row (some may be empty).
    sizes:     [num_units] int64 valid tokens per unit (0 for an empty slot).
    mask:      [B, T] bool response mask.
    """

    ids: Tensor
    num_units: int
    sizes: Tensor
    mask: Tensor

    def sum(self, values: Tensor) -> Tensor:
        """[B, T] token values → [num_units] unit sums (padding values are ignored)."""
        return segment_sum(values, self.ids, self.num_units)

    def mean(self, values: Tensor) -> Tensor:
        """[B, T] token values → [num_units] unit means (0 for an empty slot)."""
        sums = self.sum(values)
        return sums / self.sizes.clamp(min=1).to(sums.dtype)

    def broadcast(self, unit_values: Tensor, fill: float = 0.0) -> Tensor:
        """[num_units] unit values → [B, T], by unit id (`fill` on padding)."""
        return broadcast_units(unit_values, self.ids, fill)

    def token_sizes(self) -> Tensor:
        """[B, T] int64 size of the unit each token belongs to (0 on padding)."""
        return broadcast_units(self.sizes, self.ids, 0)


def unit_view(mask: Tensor, unit: UnitKind, k: int | None = None) -> UnitView:
    """Cut each row's valid tokens into units: single tokens, disjoint K-blocks, or the whole row.

    Blocks start at the first valid token and the last block of a row may be shorter than K; a row
    shorter than K is one block. Token = block with K = 1, sequence = block with K >= row length.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    mask = mask.bool()
    rows, columns = mask.shape
    size = block_length(unit, k, columns)
    per_row = max(1, math.ceil(columns / size))
    num_units = rows * per_row
    positions = valid_positions(mask)
    row_base = torch.arange(rows, device=mask.device).unsqueeze(1) * per_row
    ids = torch.where(mask, row_base + positions.clamp(min=0) // size, num_units)
    sizes = segment_sum(mask.long(), ids, num_units)
    return UnitView(ids=ids, num_units=num_units, sizes=sizes, mask=mask)


def parse_block_weights(spec: str, k: int) -> tuple[Tensor, bool]:
    """Window weights w_1..w_K of the sliding layout (§1.5) and whether they are renormalised.

    `uniform`: w_n = 1, not renormalised (a shorter window simply has fewer terms: the joint ratio).
    `future:p`: w_1 = 1 - p, w_{n>1} = p / (K - 1); `geometric:g`: w_n = g^(n-1). Both are
    normalised to sum 1 over the tokens present in the window. With K = 1 every kind is w_1 = 1.
    Returns a float64 CPU tensor [K].
    """
    if k < 1:
        raise ValueError(f"block size k must be >= 1, got {k}")
    kind, _, arg = spec.partition(":")
    if kind == "uniform" and not arg:
        return torch.ones(k, dtype=torch.float64), False
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(_weights_message(spec)) from None
    if kind == "future" and 0.0 <= value <= 1.0:
        if k == 1:
            return torch.ones(1, dtype=torch.float64), True
        weights = torch.full((k,), value / (k - 1), dtype=torch.float64)
        weights[0] = 1.0 - value
        return weights, True
    if kind == "geometric" and value >= 0.0:
        exponents = torch.arange(k, dtype=torch.float64)
        return torch.pow(torch.tensor(value, dtype=torch.float64), exponents), True
    raise ValueError(_weights_message(spec))


def _weights_message(spec: str) -> str:
    return (
        f"block_weights={spec!r}: expected 'uniform', 'future:p' with 0 <= p <= 1, "
        "or 'geometric:g' with g >= 0"
    )


def sliding_window_sum(
    values: Tensor, mask: Tensor, k: int, weights: str = "uniform"
) -> tuple[Tensor, Tensor]:
    """Weighted sum over each valid token's window of the next min(K, tokens left) valid tokens.

    Returns (sums [B, T], window sizes [B, T] int64), both 0 on padding anchors:
    sums_t = Σ_{n=1..n_t} w̃_n · values_{t+n-1} (ALGORITHMS.md §1.5). For the normalised kinds,
    w̃_n = w_n / Σ_{m ≤ n_t} w_m; a window whose present weights sum to 0 (`future:1` at the last
    token, which has no future) gets the sum 0. Memory is O(B·T·K): one gather of the windows.
    """
    if values.shape != mask.shape or values.dim() != 2:
        raise ValueError(
            f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    mask = mask.bool()
    rows, columns = mask.shape
    base, normalised = parse_block_weights(weights, k)
    device = values.device
    positions = valid_positions(mask)
    lengths = mask.sum(dim=1, keepdim=True)  # [B, 1]

    # column_of[b, q] = column of the q-th valid token of row b; slot T reads the zero column
    # appended to `values` below, slot T + 1 is where the padding tokens' writes land.
    column_of = torch.full((rows, columns + 2), columns, dtype=torch.long, device=device)
    source = torch.arange(columns, device=device).expand(rows, columns)
    column_of.scatter_(1, torch.where(mask, positions, columns + 1), source)

    offsets = torch.arange(k, device=device)
    targets = positions.unsqueeze(-1) + offsets  # [B, T, K] valid-token index of each window slot
    present = mask.unsqueeze(-1) & (targets < lengths.unsqueeze(-1))
    targets = torch.where(present, targets, columns)
    window_columns = column_of.gather(1, targets.reshape(rows, -1))
    padded = torch.cat([values, values.new_zeros(rows, 1)], dim=1)
    window_values = padded.gather(1, window_columns).reshape(rows, columns, k)

    w = base.to(dtype=values.dtype, device=device).expand_as(window_values)
    w = torch.where(present, w, 0.0)
    if normalised:
        total = w.sum(dim=-1, keepdim=True)
        w = torch.where(total > 0, w / torch.where(total > 0, total, 1.0), 0.0)
    return (window_values * w).sum(dim=-1), present.sum(dim=-1)
