"""Where a profiled forward/backward's time goes: the operators' own CPU time split into matmuls,
attention and everything else (torch.profiler's key averages)."""

from __future__ import annotations

from typing import Any

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
