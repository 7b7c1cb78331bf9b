"""DAPO's soft overlong punishment (docs/objectives.md §1.2), added to the reward by the loop."""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """Reward term per response length |o|, with L_max = `max_len` and L_cache = `cache_len`.

    0 if |o| <= L_max − L_cache; ((L_max − L_cache) − |o|) / L_cache in between (0 down to −1);
    −1 beyond L_max. Returns a float tensor shaped like `lengths`.
    """
    if cache_len < 1 or cache_len >= max_len:
        raise ValueError(
            f"overlong punishment needs 1 <= cache_len < max_len, got cache_len={cache_len}, "
            f"max_len={max_len}"
        )
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    lengths = lengths.to(dtype)
    expected = max_len - cache_len
    ramp = (expected - lengths) / cache_len
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)


def resolve_overlong_lengths(
    max_len: int | None, cache_len: int | None, max_new_tokens: int
) -> tuple[int, int]:
    """(L_max, L_cache) from the algo knobs, defaulting to the rollout's generation budget.

    `overlong_max_len: null` means the rollout's `max_new_tokens`; `overlong_cache_len: null`
    means L_max // 5 (DAPO's 4096 of 20480), at least 1.
    """
    resolved_max = max_new_tokens if max_len is None else max_len
    resolved_cache = max(1, resolved_max // 5) if cache_len is None else cache_len
    if resolved_cache >= resolved_max:
        raise ValueError(
            f"overlong punishment: overlong_cache_len ({resolved_cache}) must be smaller than "
            f"overlong_max_len ({resolved_max}, the rollout's max_new_tokens when unset)"
        )
    return resolved_max, resolved_cache
