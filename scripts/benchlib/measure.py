"""What the benchmarks measure besides wall time: this machine's fp32 matmul rate (timed in the
benchmark's own invocation, the reference an update's GFLOP/s is compared against) and where a
profiled forward/backward's time goes (operators' own CPU time: matmuls, attention, the rest)."""

from __future__ import annotations

from typing import Any

from benchlib.runner import best_seconds

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm"}


def op_kind(name: str) -> str:
    """matmul (the projections, MLPs and lm-head blocks), attention (the scaled-dot-product
    and variable-length kernels, forward and backward) or other (norms, activations, copies,
    fills, the log-prob arithmetic)."""
    if name in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in name or "varlen_attn" in name:
        return "attention"
    return "other"


def op_shares(profile: Any, top: int = 0) -> dict[str, Any]:
    """`{matmul,attention,other}_share` of the operators' self CPU time, and with `top` the
    largest operators other than matmuls and attention as `top_other`: [(name, share), ...]."""
    times = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    others: list[tuple[str, float]] = []
    for event in profile.key_averages():
        kind = op_kind(event.key)
        times[kind] += event.self_cpu_time_total
        if kind == "other":
            others.append((event.key, event.self_cpu_time_total))
    total = sum(times.values()) or 1.0
    shares: dict[str, Any] = {f"{kind}_share": value / total for kind, value in times.items()}
    if top:
        others.sort(key=lambda item: -item[1])
        shares["top_other"] = [(name, value / total) for name, value in others[:top]]
    return shares


def profiled_shares(step: Any, top: int = 0) -> dict[str, Any]:
    """op_shares of one more call of `step` under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return op_shares(prof, top)


def op_line(run: dict[str, Any]) -> str:
    """The shares as one report line, with the largest other operators when profiled with top."""
    line = (
        f"time in matmuls {run['matmul_share']:.0%}, attention {run['attention_share']:.0%}, "
        f"other {run['other_share']:.0%}"
    )
    top = run.get("top_other")
    return line + (" (" + ", ".join(f"{op} {share:.1%}" for op, share in top) + ")" if top else "")


def matmul_gflops(
    rows: int,
    inner: int,
    cols: int,
    device: str = "cpu",
    repeats: int = 5,
    threads: int | None = None,
    dtype: str = "float32",
) -> dict[str, float | int | str]:
    """Best-of-`repeats` rate of torch.mm([rows, inner] @ [inner, cols]) in `dtype`, 2·r·i·c
    FLOPs per call, after one warm-up call."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(rows, inner, generator=generator, device=device).to(getattr(torch, dtype))
    b = torch.randn(inner, cols, generator=generator, device=device).to(getattr(torch, dtype))
    sync = torch.cuda.synchronize if device == "cuda" else None
    best = best_seconds(lambda: torch.mm(a, b), repeats, warmup=1, sync=sync)
    return {
        "shape": f"[{rows}, {inner}] @ [{inner}, {cols}]",
        "seconds": best,
        "gflops": 2.0 * rows * inner * cols / best / 1e9,
        "threads": torch.get_num_threads(),
        "dtype": dtype,
    }
