"""Unit log-ratios, unit ratios and gradient routing (docs/objectives.md §0.2, §0.3, §1.5)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from tepo_cli.kernels.units import UnitKind, WindowTail, sliding_window_sum, unit_view

LOG_RATIO_CLAMP = 20.0


RATIO_KNOBS = ("unit", "k", "ratio_norm", "layout", "block_weights", "tail")
"""The algo knobs `unit_log_ratio` takes, under the same names."""


def unit_log_ratio(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    unit: UnitKind,
    k: int | None = None,
    ratio_norm: Literal["sum", "mean"] = "sum",
    layout: Literal["disjoint", "sliding"] = "disjoint",
    block_weights: str = "uniform",
    tail: WindowTail = "drop",
    future_log_ratio: Tensor | None = None,
    turns: Tensor | None = None,
) -> Tensor:
    """Per-token view [B, T] of Λ_u, the log-ratio of the unit each token belongs to (0 on padding).

    Disjoint units: Λ_u = Σ_{t∈u} (ℓ_t − ℓ^old_t), divided by |u| for `ratio_norm="mean"`.
    Sliding layout: each valid token anchors its own window (one unit per anchor token), and Λ is
    the weighted window sum Σ_n β_n d^(n) (`tail` handles windows cut by the response's end);
    `mean` divides by the window size. `future_log_ratio` [B, T, K−1] supplies d^(n), n ≥ 2, per
    anchor (MPO's prediction modules); without it d^(n) is the backbone's own d_{t+n−1} (exact).
    Padding entries of `logp` / `old_logp` must be finite (the public API zeroes them).
    `turns` (multi-turn episodes): blocks and windows stay inside one turn.
    """
    mask = mask.bool()
    diff = logp - old_logp
    if layout == "sliding":
        if k is None:
            raise ValueError("layout=sliding needs a window size k")
        log_ratio, sizes = sliding_window_sum(
            diff, mask, k, block_weights, tail=tail, future=future_log_ratio, turns=turns
        )
    elif future_log_ratio is not None:
        raise ValueError("future log-ratios need layout=sliding: they belong to window anchors")
    elif layout == "disjoint":
        view = unit_view(mask, unit, k, turns)
        log_ratio = view.broadcast(view.sum(diff))
        sizes = view.token_sizes()
    else:
        raise ValueError(f"unknown layout {layout!r}: expected disjoint or sliding")
    if ratio_norm == "mean":
        log_ratio = log_ratio / sizes.clamp(min=1).to(log_ratio.dtype)
    elif ratio_norm != "sum":
        raise ValueError(f"unknown ratio_norm {ratio_norm!r}: expected sum or mean")
    return torch.where(mask, log_ratio, 0.0)


def unit_ratio(log_ratio: Tensor) -> Tensor:
    """ρ_u = exp(clamp(Λ_u, −20, 20)): no overflow on a wildly off-policy unit."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def route_ratio(ratio: Tensor, logp: Tensor, route: Literal["unit", "token"]) -> Tensor:
    """The ratio each token's surrogate uses (§0.3).

    `unit`: ρ_u as is; its gradient reaches every token of the unit and the unit shares one clip
    decision. `token`: w_t = sg[ρ_u] · exp(ℓ_t − sg[ℓ_t]), equal to ρ_u in value but with the
    gradient of token t's own log-prob only (GSPO-token, TEPO).
    """
    if route == "unit":
        return ratio
    if route == "token":
        return ratio.detach() * torch.exp(logp - logp.detach())
    raise ValueError(f"unknown route {route!r}: expected unit or token")
