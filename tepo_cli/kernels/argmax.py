"""`token_argmax`: the most likely token per row without materialising the [N, V] logits."""

from __future__ import annotations

import torch

# Rows per chunk are chosen so one chunk's logits hold about this many entries (64 MB in float32).
_CHUNK_ENTRIES = 1 << 24


@torch.no_grad()
def token_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """argmax_v (hidden @ weight.T)[n, v] for hidden [N, H], weight [V, H]: [N] int64.

    Temperature does not change an argmax. Rows are taken a chunk at a time, so the extra memory
    is O(chunk × V), never O(N × V).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [N, H] and weight [V, H] must share H, got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    rows = max(1, _CHUNK_ENTRIES // max(1, weight.shape[0]))
    out = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        stop = start + rows
        out[start:stop] = (hidden[start:stop] @ weight.t()).argmax(dim=1)
    return out
