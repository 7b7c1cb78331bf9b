"""How big a block of logits the chunked paths compute at a time.

The chunked paths never hold more than one block of `rows x vocab_tile` logits (plus, for the
entropy paths, one more of the same size). By default a block has a fixed vocabulary width
and as many rows as a byte budget allows (the constants below): on CPU the
narrower tiles and smaller blocks that MKL ran fastest on the SmolLM2 and Qwen2.5 heads (wide
enough for efficient matmuls, small enough to stay in cache and keep few rows' partial gradients
live; docs/guides/performance.md, "Figures behind the code"); on CUDA blocks large enough that each
matmul fills the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CPU_BLOCK_BYTES = 16 * 2**20
CUDA_BLOCK_BYTES = 256 * 2**20
CPU_VOCAB_TILE = 2048
CUDA_VOCAB_TILE = 8192
MIN_VOCAB_TILE = 256


@dataclass(frozen=True)
class Blocking:
    rows: int  # tokens per row chunk
    vocab_tile: int  # vocabulary entries per tile


def block_bytes(device: torch.device) -> int:
    return CUDA_BLOCK_BYTES if device.type == "cuda" else CPU_BLOCK_BYTES


def choose_blocking(
    num_rows: int,
    vocab: int,
    device: torch.device,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    elem_bytes: int = 4,
) -> Blocking:
    """Rows per chunk and vocabulary entries per tile.

    `chunk_size` (rows) and `vocab_chunk_size` override the defaults. With only `chunk_size`
    given, the tile covers as much of the vocabulary as the budget allows (the whole of it for
    small chunks). Either way `rows x vocab_tile <= rows x V`: peak extra memory is
    O(chunk_size x V), never O(N x V).
    """
    budget = block_bytes(device) // elem_bytes
    if vocab_chunk_size is not None:
        tile = vocab_chunk_size
    elif chunk_size is not None:
        tile = budget // chunk_size
        if tile < vocab:
            # Multiples of 256 keep every tile's columns aligned for the matmul kernels.
            tile = max(MIN_VOCAB_TILE, tile // MIN_VOCAB_TILE * MIN_VOCAB_TILE)
    else:
        tile = CUDA_VOCAB_TILE if device.type == "cuda" else CPU_VOCAB_TILE
    tile = max(1, min(tile, vocab))
    rows = chunk_size if chunk_size is not None else max(1, budget // tile)
    return Blocking(rows=max(1, min(rows, max(num_rows, 1))), vocab_tile=tile)


def full_vocab_rows(
    num_rows: int, vocab: int, device: torch.device, chunk_size: int | None = None
) -> int:
    """Rows per chunk for a path that holds whole vocabulary rows (the triton path)."""
    if chunk_size is None:
        chunk_size = max(1, block_bytes(device) // (4 * vocab))
    return max(1, min(chunk_size, max(num_rows, 1)))
