"""The chunked torch path: token log-probs without materialising the [N, V] logits.

Logits are produced one block of `rows x vocab_tile` at a time (blocking.py) into one reused
buffer. The forward pass keeps, per row, only a running log-sum-exp (and entropy) and saves the
per-row lse; the backward pass recomputes each block and turns it into the softmax gradient in
place. That is four big matmuls against naive's three, so every block is touched as few times
as possible:

* forward: `mm`, then `exp2_` and `sum` straight on the (log2 e-scaled) logits, with no max
  pass, accepted when the row totals are well inside float range (always, for a real model's
  logits); otherwise, and with entropy, the rows are redone max-shifted: one in-place fused
  `log_softmax` per block, tiles merged with `logaddexp`. The target logit is a row-wise dot
  product with the gathered target embedding, not a gather from the block;
* backward: `mm` and one `exp2_` give P * e^lse in place (a shifted `addmm` when |lse| is
  large), and that block feeds both gradient matmuls as is: the per-row factors (g, e^-lse,
  1/T) are folded into the small [rows, H] operands, and the one-hot part of `onehot - P` is
  subtracted in place at the few (row, target) entries of each tile (no one-hot tensor, no
  scatter into the [V, H] gradient).

Tiling the vocabulary (rather than only the rows) writes each grad_weight tile once per row chunk
instead of accumulating the whole [V, H] gradient once per chunk. Rows whose upstream gradients
are all zero (padding) are dropped before the backward pass, so they cost nothing and their
gradient is exactly zero.
"""

from __future__ import annotations

from typing import Any

import torch

from tepo_cli.kernels.active_rows import ActiveRows, Grads, Wanted, row_outputs
from tepo_cli.kernels.blocking import Blocking

LOG2E = 1.4426950408889634  # log2(e)


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 statistics run in float32)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """bfloat16 where a bf16 policy is scored on the CPU, else None (the compute dtype).

    A CPU with AVX-512 BF16 or AMX multiplies bf16 matrices several times faster than float32
    (docs/guides/performance.md, "bf16 on the CPU"), and oneDNN accumulates each product in
    float32; only the block it writes is rounded to bf16, as a bf16 model's own logits are. The
    block is then widened to float32, where every exponent, sum and softmax of this path runs.
    On CUDA the tiles stay float32 in TF32 (kernels/tf32.py), measured there.
    """
    both = hidden.dtype == weight.dtype == torch.bfloat16
    return torch.bfloat16 if both and hidden.device.type == "cpu" else None


def _tile_mm(
    a: torch.Tensor,
    w_tile: torch.Tensor,
    out: torch.Tensor,
    scratch: torch.Tensor | None,
    scale: float = 1.0,
) -> None:
    """out = a @ w_tile^T, straight into `out` (`a` already scaled); or, with a bf16 `scratch`,
    the raw bf16 product widened into `out` times `scale`: the operands stay the exact bf16
    values, so the block is rounded once (as a bf16 model's logits are), not twice."""
    if scratch is None:
        torch.mm(a, w_tile.to(out.dtype).t(), out=out)
        return
    low = scratch[: out.numel()].view(out.shape)
    torch.mm(a, w_tile.t(), out=low)
    torch.mul(low, scale, out=out)


def _merge_tile(
    lse: torch.Tensor,
    ent: torch.Tensor | None,
    tile_lse: torch.Tensor,
    tile_ent: torch.Tensor | None,
) -> None:
    """Fold one vocabulary tile's (lse, entropy) into the running row statistics, in place.

    With w_a = exp(lse_a - lse), the entropy of the union is
    sum_a w_a * (H_a + lse - lse_a), an exact identity.
    """
    new_lse = torch.logaddexp(lse, tile_lse)
    if ent is not None and tile_ent is not None:
        w_run = torch.exp(lse - new_lse)
        w_tile = torch.exp(tile_lse - new_lse)
        merged = w_run * (ent + (new_lse - lse)) + w_tile * (tile_ent + (new_lse - tile_lse))
        ent.copy_(merged)
    lse.copy_(new_lse)


def chunked_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    blocking: Blocking,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(logp [N], entropy [N] or None, lse [N]) in the compute dtype; nothing saved."""
    cd = compute_dtype(hidden.dtype, weight.dtype)
    n_rows, vocab = hidden.shape[0], weight.shape[0]
    device = hidden.device
    lse, logp, ent = row_outputs(n_rows, cd, device, with_entropy)
    if n_rows == 0:
        return logp, ent, lse
    rows, tile = blocking.rows, blocking.vocab_tile
    scaled = _scaled_hidden(hidden, cd, temperature)
    base2 = None if with_entropy else scaled * LOG2E
    low = matmul_dtype(hidden, weight)
    # bf16 tiles multiply the raw bf16 rows; 1/T (and log2 e) are applied to the widened block.
    mm_scaled = scaled if low is None else hidden
    mm_base2 = base2 if low is None or base2 is None else hidden
    buf = torch.empty(min(rows, n_rows) * min(tile, vocab), dtype=cd, device=device)
    buf2 = torch.empty_like(buf) if with_entropy else None
    scratch = None if low is None else torch.empty(buf.numel(), dtype=low, device=device)
    for r0 in range(0, n_rows, rows):
        r1 = min(n_rows, r0 + rows)
        h_rows = scaled[r0:r1]
        if mm_base2 is None or not _lse_unshifted(
            mm_base2[r0:r1], weight, tile, buf, lse[r0:r1], scratch, LOG2E / temperature
        ):
            _lse_and_entropy(
                mm_scaled[r0:r1],
                weight,
                tile,
                buf,
                buf2,
                lse[r0:r1],
                ent[r0:r1] if ent is not None else None,
                scratch,
                1.0 / temperature,
            )
        target_w = weight[targets[r0:r1]].to(cd)
        target_logit = torch.linalg.vecdot(h_rows, target_w, dim=1)
        # The target logit comes from a dot product, the lse from the matmul: their rounding
        # differs by an ulp or so, which must not make a certain token's log-prob positive.
        torch.sub(target_logit, lse[r0:r1], out=logp[r0:r1]).clamp_(max=0.0)
    return logp, ent, lse


def _lse_unshifted(
    h_base2: torch.Tensor,
    weight: torch.Tensor,
    tile: int,
    buf: torch.Tensor,
    out: torch.Tensor,
    scratch: torch.Tensor | None = None,
    scale: float = 1.0,
) -> bool:
    """lse = ln(sum_v 2^(z_v log2 e)) with no max pass and no shift: `exp2_` and `sum` per tile.

    Exact whenever the total lies well inside the dtype's range (logits of a real model do:
    |z| of a few tens); returns False otherwise (an overflow, an underflow that could lose
    mass, or a NaN) and the caller redoes the rows with the shifted path.
    """
    n, vocab = h_base2.shape[0], weight.shape[0]
    total = torch.zeros(n, dtype=buf.dtype, device=buf.device)
    for v0 in range(0, vocab, tile):
        v1 = min(vocab, v0 + tile)
        z = buf[: n * (v1 - v0)].view(n, v1 - v0)
        _tile_mm(h_base2, weight[v0:v1], z, scratch, scale)
        total += z.exp2_().sum(dim=1)
    # Below `low` the entries lost to underflow (< 2^-126 each, float32) could matter.
    low, high = (2.0**-900, 2.0**900) if buf.dtype == torch.float64 else (2.0**-70, 2.0**100)
    if not bool(((total >= low) & (total <= high)).all()):
        return False
    torch.log(total, out=out)
    return True


def _lse_and_entropy(
    h_rows: torch.Tensor,
    weight: torch.Tensor,
    tile: int,
    buf: torch.Tensor,
    buf2: torch.Tensor | None,
    run_lse: torch.Tensor,
    run_ent: torch.Tensor | None,
    scratch: torch.Tensor | None = None,
    scale: float = 1.0,
) -> None:
    """Per-row lse (and entropy) over vocabulary tiles, max-shifted: any logits, any range."""
    n, vocab = h_rows.shape[0], weight.shape[0]
    for v0 in range(0, vocab, tile):
        v1 = min(vocab, v0 + tile)
        z = buf[: n * (v1 - v0)].view(n, v1 - v0)
        _tile_mm(h_rows, weight[v0:v1], z, scratch, scale)
        # One fused pass (max, sum-exp, write) turns the block into the tile's log-softmax in
        # place; the tile's lse is then z - log_softmax(z) at any column (the first here:
        # its rounding error, eps * |log p|, is that of a float32 log_softmax itself).
        first = z[:, 0].clone()
        torch.log_softmax(z, dim=1, out=z)
        tile_lse = first.sub_(z[:, 0])
        tile_ent = None
        if buf2 is not None:
            p = buf2[: z.numel()].view_as(z)
            torch.exp(z, out=p)
            tile_ent = p.mul_(z).sum(dim=1).neg_()  # -sum p log p within the tile
        if v0 == 0:
            run_lse.copy_(tile_lse)
            if run_ent is not None and tile_ent is not None:
                run_ent.copy_(tile_ent)
        else:
            _merge_tile(run_lse, run_ent, tile_lse, tile_ent)


def _scaled_hidden(hidden: torch.Tensor, cd: torch.dtype, temperature: float) -> torch.Tensor:
    scaled = hidden.to(cd)
    if temperature != 1.0:
        scaled = scaled * (1.0 / temperature)
    return scaled


def chunked_backward(
    active: ActiveRows, weight: torch.Tensor, temperature: float, blocking: Blocking, wanted: Wanted
) -> Grads:
    """Gradients w.r.t. hidden and weight, recomputing each block of logits of the active rows."""
    hidden, targets, lse, ent, g, g_ent = active.tensors()
    need_hidden, need_weight = wanted
    cd = g.dtype
    n_active, width = hidden.shape
    vocab = weight.shape[0]
    device, out_dtype = hidden.device, hidden.dtype
    acc_h = torch.zeros(n_active, width, dtype=cd, device=device) if need_hidden else None
    acc_w = torch.empty(vocab, width, dtype=cd, device=device) if need_weight else None
    h, lse, inv_t = hidden.to(cd), lse.to(cd), 1.0 / temperature
    mm_scale, shift, row_factor, one_hot, h_factor = _backward_operands(
        h, lse, g, g_ent, ent, inv_t
    )
    w_operand = h * h_factor if need_weight else None  # grad_W = (block)^T (h_factor h)
    low = matmul_dtype(hidden, weight)
    if low is None:
        mm_operand = h * mm_scale
    else:  # every matmul in bf16 (float32 accumulation), the rest in float32
        mm_operand = hidden
        w_operand = w_operand.to(low) if w_operand is not None else None
    rows, tile = blocking.rows, blocking.vocab_tile
    buf = torch.empty(min(rows, n_active) * min(tile, vocab), dtype=cd, device=device)
    p_buf = torch.empty_like(buf) if g_ent is not None else None
    scratch = None if low is None else torch.empty(buf.numel(), dtype=low, device=device)
    for r0 in range(0, n_active, rows):
        r1 = min(n_active, r0 + rows)
        n = r1 - r0
        for v0 in range(0, vocab, tile):
            v1 = min(vocab, v0 + tile)
            w_tile = weight[v0:v1].to(cd if low is None else low)
            block = buf[: n * (v1 - v0)].view(n, v1 - v0)
            if shift is not None and low is None:  # float32: the shift fused into the matmul
                bias = shift[r0:r1].unsqueeze(1).expand(n, v1 - v0)
                torch.addmm(bias, mm_operand[r0:r1], w_tile.t(), out=block)
            else:
                _tile_mm(mm_operand[r0:r1], w_tile, block, scratch, mm_scale)
                if shift is not None:
                    block.add_(shift[r0:r1].unsqueeze(1))
            _logit_grads(block, p_buf, g_ent, row_factor, r0, r1)
            _subtract_one_hot(block, targets[r0:r1], one_hot[r0:r1], v0)
            if low is not None:
                _accumulate_low(block, w_tile, w_operand, acc_h, acc_w, r0, r1, v0, v1, scratch)
            else:
                _accumulate(block, w_tile, w_operand, acc_h, acc_w, r0, r1, v0, v1)
    grad_hidden = grad_weight = None
    if acc_h is not None:
        acc_h.mul_(h_factor)  # grad_hidden = (Y - M) W g / T, or (g Y - M) W / T
        grad_hidden = active.scatter(acc_h.to(out_dtype))
    if acc_w is not None:
        grad_weight = acc_w.to(weight.dtype)
    return grad_hidden, grad_weight


def _logit_grads(
    block: torch.Tensor,
    p_buf: torch.Tensor | None,
    g_ent: torch.Tensor | None,
    row_factor: torch.Tensor | None,
    r0: int,
    r1: int,
) -> None:
    """The block's shifted logits into their gradient (before the target's one-hot): the
    log-prob's alone by one exp2, or with the entropy's term through the probabilities."""
    if p_buf is None or g_ent is None or row_factor is None:
        block.exp2_()
        return
    p = p_buf[: block.numel()].view_as(block)
    torch.exp(block, out=p)
    block.mul_(g_ent[r0:r1].unsqueeze(1)).add_(row_factor[r0:r1].unsqueeze(1))
    block.mul_(p)


def _accumulate(
    block: torch.Tensor,
    w_tile: torch.Tensor,
    w_operand: torch.Tensor | None,
    acc_h: torch.Tensor | None,
    acc_w: torch.Tensor | None,
    r0: int,
    r1: int,
    v0: int,
    v1: int,
) -> None:
    """float32: the block's part of grad_hidden (block W_tile) and of grad_W's tile rows (the
    first row block writes them, the others add)."""
    if acc_h is not None:
        acc_h[r0:r1].addmm_(block, w_tile)
    if acc_w is not None and w_operand is not None:
        if r0 == 0:
            torch.mm(block.t(), w_operand[r0:r1], out=acc_w[v0:v1])
        else:
            acc_w[v0:v1].addmm_(block.t(), w_operand[r0:r1])


def _accumulate_low(
    block: torch.Tensor,
    w_tile: torch.Tensor,
    w_operand: torch.Tensor | None,
    acc_h: torch.Tensor | None,
    acc_w: torch.Tensor | None,
    r0: int,
    r1: int,
    v0: int,
    v1: int,
    scratch: torch.Tensor | None,
) -> None:
    """The two gradient matmuls of one float32 block in bf16, summed into float32 accumulators:
    the block is rounded to bf16 once (as a bf16 model's own softmax gradient would be), each
    product accumulates in float32 inside the matmul, and the sums over tiles and row chunks stay
    float32."""
    assert scratch is not None
    low = scratch[: block.numel()].view(block.shape)
    low.copy_(block)
    if acc_h is not None:
        acc_h[r0:r1] += torch.mm(low, w_tile)
    if acc_w is not None and w_operand is not None:
        if r0 == 0:
            acc_w[v0:v1] = torch.mm(low.t(), w_operand[r0:r1])
        else:
            acc_w[v0:v1] += torch.mm(low.t(), w_operand[r0:r1])


def _subtract_one_hot(
    block: torch.Tensor, targets: torch.Tensor, one_hot: torch.Tensor, v0: int
) -> None:
    """block[i, targets[i] - v0] -= one_hot[i] where that target lies in the block's tile
    (vocabulary entries v0 ..): the block becomes M - Y in its scaling, with no one-hot tensor.
    A row whose target lies outside the tile adds -0.0 to a clamped column, which leaves every
    value as it was; no host sync (a `.nonzero()` here stalled the GPU's queue once per tile)."""
    width = block.shape[1]
    in_tile = (targets >= v0) & (targets < v0 + width)
    columns = (targets - v0).clamp_(0, width - 1).unsqueeze(1)
    block.scatter_add_(1, columns, torch.where(in_tile, one_hot, 0.0).neg_().unsqueeze(1))


def _backward_operands(
    h: torch.Tensor,
    lse: torch.Tensor,
    g: torch.Tensor,
    g_ent: torch.Tensor | None,
    ent: torch.Tensor | None,
    inv_t: float,
) -> tuple[float, torch.Tensor | None, torch.Tensor | None, torch.Tensor, Any]:
    """(mm_scale, shift, row_factor, one_hot, h_factor) of the backward's logit blocks: each
    block is (h @ W^T) * mm_scale (+ shift)."""
    if g_ent is None or ent is None:
        # d loss / d z = g (Y - P), z = logits / T. Blocks are built in base 2 (exp2 is cheaper
        # than exp): block = 2^(z log2(e) - shift). When |lse| is moderate the shift is 0 and
        # block = P e^lse: the per-row factor e^-lse joins g on the small operands and the block
        # needs no bias pass (z <= lse <= limit cannot overflow; an entry that underflows,
        # z < -87 in float32, has p = e^(z - lse) < e^(limit - 87)).
        limit = 300.0 if lse.dtype == torch.float64 else 40.0
        unshifted = bool(lse.abs().max() <= limit)
        shift = None if unshifted else lse * -LOG2E
        row_g = g * torch.exp(-lse) if unshifted else g
        one_hot = torch.exp(lse) if unshifted else torch.ones_like(lse)
        # grad_W = (P - Y)^T (-g h / T)
        return LOG2E * inv_t, shift, None, one_hot, (row_g * -inv_t).unsqueeze(1)
    # d loss / d z = g Y - M with M = P * (g + g_H * (H + log P)) per element;
    # grad_W = (M - g Y)^T (-h / T). Natural log here: log P is needed itself.
    return inv_t, lse.neg(), g + g_ent * ent, g, -inv_t
