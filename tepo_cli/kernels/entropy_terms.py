"""Per-token terms of the first-order entropy change, chunked (TEPO's `first_order` KL mask).

For p = softmax(z), H = -sum_j p_j log p_j and dH/dz_j = -p_j (log p_j + H). A policy-gradient
step on the sampled token a moves z by eta A (e_a - p), so to first order

    dH = -eta A [p_a (log p_a + H) - S],   S = sum_j p_j^2 (log p_j + H).

`token_entropy_terms` returns (log p_a, H, S) per row. S needs the whole vocabulary, so it is
accumulated over vocabulary tiles like the entropy in chunked.py: each tile is max-shifted on
its own (its local softmax q, its lse_t) and folded into running per-row statistics with an
exact rescaling, so no [N, V] tensor is ever held.
"""

from __future__ import annotations

import torch

from tepo_cli.kernels.blocking import choose_blocking
from tepo_cli.kernels.chunked import compute_dtype
from tepo_cli.kernels.dispatch import validate


def _merge_terms(
    lse: torch.Tensor,
    ent: torch.Tensor,
    sq: torch.Tensor,
    sq_log: torch.Tensor,
    tile: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """Fold one tile's (lse, entropy, sum q^2, sum q^2 log q) into the running rows, in place.

    A part with log-sum-exp lse_a holds p_j = w_a q_j, w_a = exp(lse_a - lse), so
    log p_j = log q_j + (lse_a - lse) and, exactly,
      H             = sum_a w_a (H_a + lse - lse_a),
      sum p^2       = sum_a w_a^2 Q_a,
      sum p^2 log p = sum_a w_a^2 (R_a + (lse_a - lse) Q_a),
    with Q_a = sum q^2 and R_a = sum q^2 log q of the part. Both weights are <= 1: no overflow.
    """
    t_lse, t_ent, t_sq, t_sq_log = tile
    new_lse = torch.logaddexp(lse, t_lse)
    d_run, d_tile = lse - new_lse, t_lse - new_lse  # both <= 0
    w_run, w_tile = torch.exp(d_run), torch.exp(d_tile)
    w2_run, w2_tile = w_run * w_run, w_tile * w_tile
    ent.copy_(w_run * (ent - d_run) + w_tile * (t_ent - d_tile))
    sq_log.copy_(w2_run * (sq_log + d_run * sq) + w2_tile * (t_sq_log + d_tile * t_sq))
    sq.copy_(w2_run * sq + w2_tile * t_sq)
    lse.copy_(new_lse)


def _tile_terms(
    z: torch.Tensor, q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse, entropy, sum q^2, sum q^2 log q) of one block of logits, within the tile.

    `z` becomes the tile's log-softmax in place; `q` (same shape) is scratch space.
    """
    t_lse = torch.logsumexp(z, dim=1)
    z.sub_(t_lse.unsqueeze(1))
    torch.exp(z, out=q)
    t_ent = torch.linalg.vecdot(q, z, dim=1).neg_()
    q.mul_(q)
    return t_lse, t_ent, q.sum(dim=1), torch.linalg.vecdot(q, z, dim=1)


def token_entropy_terms(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    *,
    vocab_chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp [N], entropy [N], vocab_term [N]) of softmax(hidden @ weight.T / temperature).

    logp = log p_target, entropy = H, vocab_term = S = sum_j p_j^2 (log p_j + H). No autograd
    (they feed a detached mask); float64 if an input is float64, else float32. Rows and
    vocabulary are blocked as in `token_logprobs` (blocking.py): peak extra memory is
    O(rows x vocab tile), never O(N x V). Any device.
    """
    validate(hidden, weight, targets, temperature, chunk_size, "torch", vocab_chunk_size)
    temperature = float(temperature)
    cd = compute_dtype(hidden.dtype, weight.dtype)
    n_rows, vocab = hidden.shape[0], weight.shape[0]
    device = hidden.device
    blocking = choose_blocking(n_rows, vocab, device, chunk_size, vocab_chunk_size)
    logp, ent, sq, sq_log, lse = (torch.empty(n_rows, dtype=cd, device=device) for _ in range(5))
    if n_rows == 0:
        return logp, ent, sq
    rows, tile = blocking.rows, blocking.vocab_tile
    with torch.no_grad():
        scaled = hidden.detach().to(cd) * (1.0 / temperature)
        w = weight.detach()
        buf = torch.empty(min(rows, n_rows) * min(tile, vocab), dtype=cd, device=device)
        buf2 = torch.empty_like(buf)
        for r0 in range(0, n_rows, rows):
            r1 = min(n_rows, r0 + rows)
            h_rows, n = scaled[r0:r1], r1 - r0
            run = (lse[r0:r1], ent[r0:r1], sq[r0:r1], sq_log[r0:r1])
            for v0 in range(0, vocab, tile):
                v1 = min(vocab, v0 + tile)
                z = buf[: n * (v1 - v0)].view(n, v1 - v0)
                torch.mm(h_rows, w[v0:v1].to(cd).t(), out=z)
                terms = _tile_terms(z, buf2[: z.numel()].view_as(z))
                if v0 == 0:
                    for dst, src in zip(run, terms, strict=True):
                        dst.copy_(src)
                else:
                    _merge_terms(*run, terms)
            target_logit = torch.linalg.vecdot(h_rows, w[targets[r0:r1]].to(cd), dim=1)
            # Dot product and matmul round differently: keep a certain token's log-prob <= 0.
            torch.sub(target_logit, lse[r0:r1], out=logp[r0:r1]).clamp_(max=0.0)
        # S = sum p^2 log p + H sum p^2, reusing `sq` as the output.
        vocab_term = sq.mul_(ent).add_(sq_log)
    return logp, ent, vocab_term
