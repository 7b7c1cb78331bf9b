"""The unit view: token, K-block and sequence units as segment reductions (docs/objectives.md §0.2).

Every objective works on per-token tensors `[B, T]` with a response mask. An *action unit* is a
run of consecutive valid tokens of one row; this module turns token values into unit values and
back, with index operations only (no Python loop over tokens, blocks or rows):

- `valid_positions(mask)`: index of each token among its row's valid tokens. Units are cut on
  this index, so blocks start at the first valid token of each row whichever side the padding is
  on, and a mask with holes simply skips them.
- `unit_view(mask, unit, k)` → `UnitView`: one unit id per token (padding goes to a dump slot
  that every reduction drops), unit sizes, and `sum` / `mean` / `broadcast`.
- `segment_sum(values, ids, num_units)`: the one reduction everything is built on.
- `sliding_windows(mask, k)` and `sliding_window_sum(values, mask, k, weights, tail, future)`:
  the sliding layout of §1.5, one window of the next min(K, tokens left) valid tokens per anchor
  token, weighted by `decay:β₂,λ` (MPO's), `uniform` (joint), `future:p` or `geometric:γ`; the
  future slots read either the tokens' own values (exact) or given per-anchor values (MPO's prediction modules).

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


def turn_positions(mask: Tensor, turns: Tensor) -> tuple[Tensor, Tensor]:
    """(index of each valid token among its turn's valid tokens, -1 on padding; the number of
    valid tokens of the token's turn, 0 on padding). `turns` [B, T]: each token's turn index in
    its row, non-decreasing along the valid tokens (multi-turn episodes: core/sequences.py)."""
    mask = mask.bool()
    rows, columns = mask.shape
    positions = valid_positions(mask)
    per_row = int(turns.max().item()) + 1 if turns.numel() else 1
    key = torch.arange(rows, device=mask.device).unsqueeze(1) * per_row + turns.clamp(min=0)
    key = torch.where(mask, key, rows * per_row)  # padding lands in a dump slot
    first = torch.full((rows * per_row + 1,), columns, dtype=torch.long, device=mask.device)
    first = first.scatter_reduce(0, key.reshape(-1), positions.reshape(-1), "amin")
    counts = segment_sum(mask.long(), key, rows * per_row)
    within = torch.where(mask, positions - first[key], -1)
    return within, torch.where(mask, counts[key.clamp(max=rows * per_row - 1)], 0)


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


def unit_view(
    mask: Tensor, unit: UnitKind, k: int | None = None, turns: Tensor | None = None
) -> UnitView:
    """Cut each row's valid tokens into units: single tokens, disjoint K-blocks, or the whole row.

    Blocks start at the first valid token and the last block of a row may be shorter than K; a row
    shorter than K is one block. Token = block with K = 1, sequence = block with K >= row length.
    With `turns` (multi-turn episodes), blocks start again at each turn's first token, so no
    block spans an observation; a sequence is still the whole row (the episode).
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    mask = mask.bool()
    rows, columns = mask.shape
    size = block_length(unit, k, columns)
    if turns is not None and unit == "block" and size > 1:
        return _turn_blocks(mask, turns, size)
    per_row = max(1, math.ceil(columns / size))
    num_units = rows * per_row
    positions = valid_positions(mask)
    row_base = torch.arange(rows, device=mask.device).unsqueeze(1) * per_row
    ids = torch.where(mask, row_base + positions.clamp(min=0) // size, num_units)
    sizes = segment_sum(mask.long(), ids, num_units)
    return UnitView(ids=ids, num_units=num_units, sizes=sizes, mask=mask)


def _turn_blocks(mask: Tensor, turns: Tensor, size: int) -> UnitView:
    """K-blocks that start again at each turn: a turn of n tokens owns ceil(n / K) blocks, the
    turns' blocks one after another on the row's grid (at most ceil(T / K) + turns slots)."""
    rows, columns = mask.shape
    within, turn_tokens = turn_positions(mask, turns)
    turn_count = int(turns.max().item()) + 1 if turns.numel() else 1
    per_row = math.ceil(columns / size) + turn_count
    num_units = rows * per_row
    # blocks of each (row, turn), and the first block slot of each turn: the blocks of the turns
    # before it in its row
    key = torch.arange(rows, device=mask.device).unsqueeze(1) * turn_count + turns.clamp(min=0)
    blocks = torch.zeros(rows * turn_count, dtype=torch.long, device=mask.device)
    blocks = blocks.scatter_reduce(
        0, key[mask], (turn_tokens[mask] + size - 1) // size, "amax", include_self=True
    ).reshape(rows, turn_count)
    offsets = (blocks.cumsum(dim=1) - blocks).reshape(-1)
    row_base = torch.arange(rows, device=mask.device).unsqueeze(1) * per_row
    block = offsets[key] + within.clamp(min=0) // size
    ids = torch.where(mask, row_base + block, num_units)
    sizes = segment_sum(mask.long(), ids, num_units)
    return UnitView(ids=ids, num_units=num_units, sizes=sizes, mask=mask)


WindowTail = Literal["drop", "renormalise"]


def parse_block_weights(spec: str, k: int) -> tuple[Tensor, bool]:
    """Window weights β_1..β_K of the sliding layout (docs/objectives.md §1.5) and whether they are
    a normalised weighting (Σβ = 1 over the full window) rather than the plain joint sum.

    `uniform`: β_n = 1, not normalised (the joint ratio of Eq. 8, an ablation).
    `decay:b,l` (the paper's Eq. 10): β_n = b·l^(n−2) for n ≥ 2, β_1 = 1 − Σ_{n≥2} β_n, which must
    stay > 0. `future:p`: β_1 = 1 − p, β_{n>1} = p / (K − 1). `geometric:g`: β_n ∝ g^(n−1).
    With K = 1 every kind is β_1 = 1. Returns a float64 CPU tensor [K].
    """
    if k < 1:
        raise ValueError(f"block size k must be >= 1, got {k}")
    kind, _, arg = spec.partition(":")
    if kind == "uniform" and not arg:
        return torch.ones(k, dtype=torch.float64, device="cpu"), False
    try:
        values = [float(part) for part in arg.split(",")]
    except ValueError:
        raise ValueError(_weights_message(spec)) from None
    if kind == "decay" and len(values) == 2 and min(values) >= 0.0:
        return decay_weights(values[0], values[1], k), True
    if len(values) != 1:
        raise ValueError(_weights_message(spec))
    value = values[0]
    if kind == "future" and 0.0 <= value <= 1.0:
        if k == 1:
            return torch.ones(1, dtype=torch.float64, device="cpu"), True
        weights = torch.full((k,), value / (k - 1), dtype=torch.float64, device="cpu")
        weights[0] = 1.0 - value
        return weights, True
    if kind == "geometric" and value >= 0.0:
        exponents = torch.arange(k, device="cpu")
        weights = torch.pow(torch.tensor(value, dtype=torch.float64, device="cpu"), exponents)
        return weights / weights.sum(), True
    raise ValueError(_weights_message(spec))


def decay_weights(beta2: float, decay: float, k: int) -> Tensor:
    """MPO's Eq. 10: β_n = β₂·λ^(n−2) for n = 2..K and β_1 = 1 − Σ_{n≥2} β_n (float64 [K]).

    Raises ValueError when β_1 ≤ 0: the current token must keep a positive share of the window.
    """
    base = torch.tensor(decay, dtype=torch.float64, device="cpu")
    future = beta2 * torch.pow(base, torch.arange(k - 1, device="cpu"))
    first = 1.0 - float(future.sum())
    if first <= 0.0:
        raise ValueError(
            f"block_weights=decay:{beta2:g},{decay:g} with k={k} gives the future tokens a total "
            f"weight of {float(future.sum()):.4g}, so beta_1 = 1 - that = {first:.4g} <= 0; the "
            "current token must keep a positive share: lower beta_2 or lambda, or k (the paper "
            "keeps the future share below 0.3: k=5 with decay:0.06,0.8 gives 0.177)"
        )
    return torch.cat([torch.tensor([first], dtype=torch.float64, device="cpu"), future])


def _weights_message(spec: str) -> str:
    return (
        f"block_weights={spec!r}: expected 'uniform', 'decay:b,l' with b, l >= 0 (MPO's "
        "beta_2 and lambda), 'future:p' with 0 <= p <= 1, or 'geometric:g' with g >= 0"
    )


@dataclass(frozen=True)
class Windows:
    """The sliding layout of a `[B, T]` batch: anchor t's window holds its next K valid tokens.

    columns: [B, T, K] int64 column of slot n (n = 1..K) of each anchor's window; T where the
             slot is empty (past the row's last valid token, or a padding anchor).
    present: [B, T, K] bool, the slots that hold a token; slot 1 is present at every valid anchor.
    """

    columns: Tensor
    present: Tensor

    @property
    def sizes(self) -> Tensor:
        """[B, T] int64 tokens in each anchor's window, min(K, tokens left); 0 on padding."""
        return self.present.sum(dim=-1)

    def gather(self, values: Tensor) -> Tensor:
        """[B, T] token values → [B, T, K] window values (0 in empty slots)."""
        rows = values.shape[0]
        padded = torch.cat([values, values.new_zeros(rows, 1)], dim=1)
        flat = self.columns.reshape(rows, -1)
        gathered = padded.gather(1, flat).reshape(self.columns.shape)
        return torch.where(self.present, gathered, 0.0)


def sliding_windows(mask: Tensor, k: int, turns: Tensor | None = None) -> Windows:
    """One window of the next min(K, tokens left) valid tokens per valid anchor token, with index
    operations only (no loop over tokens). Valid tokens are counted, so holes in the mask are
    skipped and the padding may be on either side. With `turns` (multi-turn episodes) the tokens
    left are those of the anchor's own turn: no window spans an observation."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    if k < 1:
        raise ValueError(f"window size k must be >= 1, got {k}")
    mask = mask.bool()
    rows, columns = mask.shape
    device = mask.device
    positions = valid_positions(mask)
    lengths = mask.sum(dim=1, keepdim=True)  # [B, 1]
    # column_of[b, q] = column of the q-th valid token of row b; slot T stands for "empty",
    # slot T + 1 is where the padding tokens' writes land.
    column_of = torch.full((rows, columns + 2), columns, dtype=torch.long, device=device)
    source = torch.arange(columns, device=device).expand(rows, columns)
    column_of.scatter_(1, torch.where(mask, positions, columns + 1), source)
    targets = positions.unsqueeze(-1) + torch.arange(k, device=device)  # [B, T, K]
    if turns is None:
        present = mask.unsqueeze(-1) & (targets < lengths.unsqueeze(-1))
    else:
        within, turn_tokens = turn_positions(mask, turns)
        offsets = within.unsqueeze(-1) + torch.arange(k, device=device)
        present = mask.unsqueeze(-1) & (offsets < turn_tokens.unsqueeze(-1))
    targets = torch.where(present, targets, columns)
    window_columns = column_of.gather(1, targets.reshape(rows, -1)).reshape(rows, columns, k)
    return Windows(columns=window_columns, present=present)


def window_weights(
    present: Tensor, spec: str, k: int, tail: WindowTail = "drop", dtype: torch.dtype | None = None
) -> Tensor:
    """[B, T, K] weight of each window slot: β_n where the slot holds a token, 0 where it is empty.

    A window cut short by the end of the response (docs/objectives.md §1.5, tail):
    `drop` keeps β_n of the slots present, so the window's total weight is ≤ 1; `renormalise`
    divides them by their sum (a window whose present weights sum to 0 gets weight 0).
    `uniform` is the plain joint sum: its slots weigh 1 either way.
    """
    base, normalised = parse_block_weights(spec, k)
    weights = base.to(dtype=dtype or torch.float64, device=present.device).expand(present.shape)
    weights = torch.where(present, weights, 0.0)
    if normalised and tail == "renormalise":
        total = weights.sum(dim=-1, keepdim=True)
        weights = torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), 0.0)
    elif tail not in ("drop", "renormalise"):
        raise ValueError(f"unknown tail {tail!r}: expected drop or renormalise")
    return weights


def sliding_window_sum(
    values: Tensor,
    mask: Tensor,
    k: int,
    weights: str = "uniform",
    tail: WindowTail = "drop",
    future: Tensor | None = None,
    turns: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Σ_n β_n · d^(n) over each valid anchor's window (docs/objectives.md §1.5).

    values: [B, T] per-token values d_t (log-ratios). Slot n of anchor t holds d^(n)_t:
    - `future=None` (exact): the value of the window's n-th token, d_{t+n−1};
    - `future` given, [B, T, K−1]: slot 1 is still d_t, slots n ≥ 2 read future[b, t, n−2]
      (e.g. MPO's prediction modules' log-ratios for the n-th token, evaluated at the anchor's state).
    Returns (sums [B, T], window sizes [B, T] int64), both 0 on padding anchors. Memory is
    O(B·T·K): one gather of the windows. `turns`: as for `sliding_windows`.
    """
    if values.shape != mask.shape or values.dim() != 2:
        raise ValueError(
            f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    windows = sliding_windows(mask, k, turns)
    if future is None:
        slots = windows.gather(values)
    else:
        expected = (*values.shape, k - 1)
        if tuple(future.shape) != expected:
            raise ValueError(
                f"future must be [B, T, K-1] = {expected} for k={k}, got {tuple(future.shape)}"
            )
        slots = torch.cat([values.unsqueeze(-1), future.to(values.dtype)], dim=-1)
        slots = torch.where(windows.present, slots, 0.0)
    w = window_weights(windows.present, weights, k, tail, dtype=values.dtype)
    return (slots * w).sum(dim=-1), windows.sizes
