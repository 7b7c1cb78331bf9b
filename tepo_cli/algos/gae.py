"""PPO's learned-critic advantages (docs/objectives.md §0.1, `gae`): the pure parts.

- `token_rewards`: the sequence reward on each response's last valid token, 0 elsewhere.
- `gae`: δ_t = r_t + γ·V_{t+1} − V_t (V past the last valid token is 0),
  Â_t = Σ_l (γλ)^l δ_{t+l}, returns G_t = Â_t + V_t.
- `whiten`: (Â − mean)·(var + ε)^−½ over every valid token of the optimizer step — on all ranks,
  through `sums` that a caller all-reduces — as verl's `masked_whiten` (unbiased variance).
- `value_loss`: ½·max((V − G)², (V_old + clip(V − V_old, ±ε_v) − G)²) per token, PPO's
  value-clipped critic loss, and the share of tokens where the clipped branch is the larger.

Rows are responses, columns completion tokens; `mask` marks the valid ones (any padding side, a
contiguous run per row). No function here reads a model: the critic that produces V is
train-time machinery, these are its arithmetic.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: each row's reward [B] on its last valid token, 0 elsewhere (and on empty rows)."""
    mask = mask.bool()
    columns = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask, columns, -1).max(dim=1).values  # -1 for a row without tokens
    placed = (columns == last.unsqueeze(1)) & mask
    return torch.where(
        placed, rewards.unsqueeze(1), torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    )


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """(advantages, returns), both [B, T] and 0 on padding, from per-token rewards and values.

    One reverse pass over the columns (the recursion Â_t = δ_t + γλ·Â_{t+1} is sequential in t,
    vectorised over rows); padding columns inside a row's span are skipped, so either padding
    side works.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, T]"
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    mask = mask.bool()
    values = torch.where(mask, values, 0.0)
    rewards = torch.where(mask, rewards, 0.0)
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    for t in range(values.shape[1] - 1, -1, -1):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(valid, here, 0.0)
        next_value = torch.where(valid, values[:, t], next_value)
        next_advantage = torch.where(valid, here, next_advantage)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def whiten_sums(values: Tensor, mask: Tensor) -> Tensor:
    """[3] float64 (count, Σx, Σx²) over the valid entries: all-reduce these across ranks (and add
    them over micro-batches) before `whiten`, and the statistics are those of one big batch."""
    mask = mask.bool()
    x = values.double()[mask]
    return torch.stack([x.new_tensor(float(x.numel())), x.sum(), (x * x).sum()])


def whiten(
    values: Tensor, mask: Tensor, sums: Tensor | None = None, eps: float = 1e-8, shift: bool = True
) -> Tensor:
    """(x − mean)·(var + eps)^−½ on the valid entries (0 on padding), the statistics from `sums`
    (`whiten_sums`, possibly all-reduced) or from these entries; var is the Bessel-corrected
    variance over all valid tokens (verl's `masked_whiten`). `shift=False` keeps the mean."""
    mask = mask.bool()
    count, total, squares = (sums if sums is not None else whiten_sums(values, mask)).tolist()
    if count == 0:
        return torch.zeros_like(values)
    mean = total / count
    variance = max(squares - count * mean * mean, 0.0) / max(count - 1.0, 1.0)
    scaled = values - mean if shift else values
    return torch.where(mask, scaled / (variance + eps) ** 0.5, 0.0)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: float | None
) -> tuple[Tensor, Tensor]:
    """Per-token ½·max((V − G)², (V_old + clip(V − V_old, ±clip) − G)²) and whether the clipped
    branch was the larger (a [B, T] bool); `clip=None` is the plain ½(V − G)². Aggregate the
    first with the policy's `aggregate` and the step's global normalisers."""
    plain = (values - returns).square()
    if clip is None:
        return 0.5 * plain, torch.zeros_like(plain, dtype=torch.bool)
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns).square()
    return 0.5 * torch.maximum(plain, clipped), clipped > plain
