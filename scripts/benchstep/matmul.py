"""This CPU's (or GPU's) fp32 matmul rate, measured in the benchmark's own invocation: the
reference the update's GFLOP/s on real answer tokens is compared against."""

from __future__ import annotations

import time

import torch


def matmul_gflops(
    rows: int,
    inner: int,
    cols: int,
    device: str = "cpu",
    repeats: int = 5,
    threads: int | None = None,
) -> dict[str, float | int | str]:
    """Best-of-`repeats` rate of torch.mm([rows, inner] @ [inner, cols]) in float32, 2·r·i·c
    FLOPs per call, after one warm-up call."""
    if threads is not None:
        torch.set_num_threads(threads)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(rows, inner, generator=generator, device=device, dtype=torch.float32)
    b = torch.randn(inner, cols, generator=generator, device=device, dtype=torch.float32)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return {
        "shape": f"[{rows}, {inner}] @ [{inner}, {cols}]",
        "seconds": best,
        "gflops": 2.0 * rows * inner * cols / best / 1e9,
        "threads": torch.get_num_threads(),
    }
