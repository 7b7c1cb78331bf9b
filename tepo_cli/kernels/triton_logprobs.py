"""The CUDA path: cuBLAS matmuls per row chunk, the softmax work fused in two Triton kernels.

Importing this module imports triton; `tepo_cli.kernels.dispatch` imports it lazily and falls
back to the torch path when that fails. For each chunk of `rows` tokens the logits
[rows, V] (float32) come from one matmul; then

* `_row_stats_kernel` (forward) reads each row once, tile by tile over the vocabulary, with an
  online max / sum-exp (and sum p*z for the entropy), and writes lse, the target log-prob and
  the entropy: one pass instead of torch's several;
* `_grad_logits_kernel` (backward) recomputes p = exp(z/T - lse) and overwrites the chunk in
  place with d loss / d logits = (g * onehot - p * (g + g_H * (H + log p))) / T,
  after which two matmuls give the chunk's grad_hidden rows and its grad_weight contribution
  (accumulated in float32).

Only the per-row lse (and entropy) is saved for backward; peak extra memory is one
[rows, V] float32 chunk (plus its half-precision copy for the gradient matmuls with bf16
weights) and the float32 grad_weight accumulator. Float64 inputs never come here (the dispatcher
sends them to the torch path). The kernels run on CPU tensors under TRITON_INTERPRET=1, which is
how they are tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from tepo_cli.kernels.active_rows import ActiveRows, Grads, Wanted, row_outputs

MAX_BLOCK_V = 4096


@triton.jit
def _row_stats_kernel(
    logits_ptr,
    stride_row,
    targets_ptr,
    lse_ptr,
    logp_ptr,
    ent_ptr,
    inv_t,
    V,
    BLOCK_V: tl.constexpr,
    WITH_ENTROPY: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    offs = tl.arange(0, BLOCK_V)
    # First tile peeled off so the running max is finite from the start (V >= 1).
    mask = offs < V
    z = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
    m = tl.max(z, axis=0)
    e = tl.where(mask, tl.exp(z - m), 0.0)
    s = tl.sum(e, axis=0)
    d = tl.sum(e * tl.where(mask, z - m, 0.0), axis=0)  # sum exp(z - m) * (z - m)
    for start in range(BLOCK_V, V, BLOCK_V):
        cols = start + offs
        mask = cols < V
        z = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.max(z, axis=0))
        scale = tl.exp(m - m_new)
        e = tl.where(mask, tl.exp(z - m_new), 0.0)
        if WITH_ENTROPY:
            tile_d = tl.sum(e * tl.where(mask, z - m_new, 0.0), axis=0)
            d = scale * (d + (m - m_new) * s) + tile_d
        s = s * scale + tl.sum(e, axis=0)
        m = m_new
    log_s = tl.log(s)
    lse = m + log_s
    target = tl.load(targets_ptr + row)
    z_target = tl.load(base + target).to(tl.float32) * inv_t
    tl.store(lse_ptr + row, lse)
    tl.store(logp_ptr + row, tl.minimum(z_target - lse, 0.0))
    if WITH_ENTROPY:
        tl.store(ent_ptr + row, log_s - d / s)


@triton.jit
def _grad_logits_kernel(
    logits_ptr,
    stride_row,
    targets_ptr,
    lse_ptr,
    ent_ptr,
    g_ptr,
    g_ent_ptr,
    inv_t,
    V,
    BLOCK_V: tl.constexpr,
    ENT_GRAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    offs = tl.arange(0, BLOCK_V)
    g = tl.load(g_ptr + row)
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + row)
    g_ent = tl.load(g_ent_ptr + row)  # a dummy row of g when ENT_GRAD is off
    row_factor = g + g_ent * tl.load(ent_ptr + row)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        mask = cols < V
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32) * inv_t
        logp = z - lse
        p = tl.exp(logp)
        if ENT_GRAD:  # noqa: SIM108 (a static branch: triton resolves it at compile time)
            grad = -p * (row_factor + g_ent * logp)
        else:
            grad = -p * g
        grad = tl.where(cols == target, grad + g, grad) * inv_t
        tl.store(base + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


def _block_v(vocab: int) -> int:
    return min(MAX_BLOCK_V, triton.next_power_of_2(vocab))


def _num_warps(block_v: int) -> int:
    return 8 if block_v >= 2048 else 4


def _mm_f32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out (float32) = a @ b, half-precision operands accumulated into a float32 result."""
    if a.dtype == out.dtype and b.dtype == out.dtype:
        torch.mm(a, b, out=out)
        return
    try:
        torch.ops.aten.mm.dtype_out(a, b, out.dtype, out=out)
    except (RuntimeError, NotImplementedError):  # no fp32-output kernel: round then widen
        out.copy_(torch.mm(a, b))


def _addmm_f32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (float32) += a @ b."""
    if a.dtype == acc.dtype and b.dtype == acc.dtype:
        acc.addmm_(a, b)
        return
    try:
        torch.ops.aten.addmm.dtype_out(acc, a, b, acc.dtype, out=acc)
    except (RuntimeError, NotImplementedError):
        acc.add_(torch.mm(a, b))


def _logit_blocks(
    h: torch.Tensor, w: torch.Tensor, rows: int
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(r0, r1, float32 logits h[r0:r1] @ w.T) for blocks of `rows` rows, in one reused buffer."""
    n_rows = h.shape[0]
    buf = torch.empty(min(rows, n_rows), w.shape[0], dtype=torch.float32, device=h.device)
    for r0 in range(0, n_rows, rows):
        r1 = min(n_rows, r0 + rows)
        logits = buf[: r1 - r0]
        _mm_f32(h[r0:r1], w.t(), logits)
        yield r0, r1, logits


def _operands(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same-dtype matmul operands (the wider of the two when they differ)."""
    if hidden.dtype == weight.dtype:
        return hidden, weight
    common = torch.promote_types(hidden.dtype, weight.dtype)
    return hidden.to(common), weight.to(common)


def triton_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    n_rows, vocab = hidden.shape[0], weight.shape[0]
    device = hidden.device
    lse, logp, ent = row_outputs(n_rows, torch.float32, device, with_entropy)
    if n_rows == 0:
        return logp, ent, lse
    h, w = _operands(hidden, weight)
    block_v = _block_v(vocab)
    for r0, r1, logits in _logit_blocks(h, w, rows):
        _row_stats_kernel[(r1 - r0,)](
            logits,
            logits.stride(0),
            targets[r0:r1],
            lse[r0:r1],
            logp[r0:r1],
            ent[r0:r1] if ent is not None else lse[r0:r1],
            1.0 / temperature,
            vocab,
            BLOCK_V=block_v,
            WITH_ENTROPY=ent is not None,
            num_warps=_num_warps(block_v),
        )
    return logp, ent, lse


def triton_backward(
    active: ActiveRows, weight: torch.Tensor, temperature: float, rows: int, wanted: Wanted
) -> Grads:
    """Gradients w.r.t. hidden and weight of the active rows, one block of full-vocabulary
    logits at a time (the gradient of the logits computed in place by `_grad_logits_kernel`)."""
    hidden, targets, lse, ent, g, g_ent = active.tensors()
    need_hidden, need_weight = wanted
    n_active, width = hidden.shape
    vocab = weight.shape[0]
    device, out_dtype = hidden.device, hidden.dtype
    f32 = torch.float32
    acc_w = torch.zeros(vocab, width, dtype=f32, device=device) if need_weight else None
    h, w = _operands(hidden, weight)
    acc_h = torch.empty(n_active, width, dtype=f32, device=device) if need_hidden else None
    block_v = _block_v(vocab)
    for r0, r1, logits in _logit_blocks(h, w, rows):
        _grad_logits_kernel[(r1 - r0,)](
            logits,
            logits.stride(0),
            targets[r0:r1],
            lse[r0:r1],
            ent[r0:r1] if ent is not None else lse[r0:r1],
            g[r0:r1],
            g_ent[r0:r1] if g_ent is not None else g[r0:r1],
            1.0 / temperature,
            vocab,
            BLOCK_V=block_v,
            ENT_GRAD=g_ent is not None,
            num_warps=_num_warps(block_v),
        )
        grad_logits = logits if w.dtype == f32 else logits.to(w.dtype)
        if acc_h is not None:
            _mm_f32(grad_logits, w, acc_h[r0:r1])
        if acc_w is not None:
            _addmm_f32(acc_w, grad_logits.t(), h[r0:r1])
    grad_hidden = active.scatter(acc_h.to(out_dtype)) if acc_h is not None else None
    grad_weight = acc_w.to(weight.dtype) if acc_w is not None else None
    return grad_hidden, grad_weight
