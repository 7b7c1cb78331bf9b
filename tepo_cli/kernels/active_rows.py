"""The per-row tensors of the kernel back-ends: the forward's outputs, and the rows a backward
pass visits: those whose upstream gradient is not zero.

Masked tokens (padding, prompt) get a zero gradient from the loss; skipping their rows saves the
recomputation of their logits, the dominant cost of the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Wanted = tuple[bool, bool]  # (d hidden, d weight) needed
Grads = tuple[torch.Tensor | None, torch.Tensor | None]  # (d hidden, d weight), None if not wanted


@dataclass(frozen=True)
class ActiveRows:
    """The backward's inputs restricted to the active rows; `index` maps them back (None: all)."""

    hidden: torch.Tensor  # [n, H]
    targets: torch.Tensor  # [n]
    lse: torch.Tensor  # [n] the forward's log-sum-exp
    ent: torch.Tensor | None  # [n] the forward's entropies, when their gradient is used
    g: torch.Tensor  # [n] d loss / d logp, in the compute dtype
    g_ent: torch.Tensor | None  # [n] d loss / d entropy; None when it is zero everywhere
    index: torch.Tensor | None
    n_rows: int  # rows of the whole batch

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """hidden, targets, lse, ent, g, g_ent."""
        return self.hidden, self.targets, self.lse, self.ent, self.g, self.g_ent  # type: ignore[return-value]

    @property
    def count(self) -> int:
        return int(self.g.shape[0])

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """[n_rows, ...] with `values` on the active rows and zeros elsewhere."""
        if self.index is None:
            return values
        full = values.new_zeros((self.n_rows, *values.shape[1:]))
        full[self.index] = values
        return full


def row_outputs(
    n_rows: int, dtype: torch.dtype, device: torch.device, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The forward's empty per-row outputs: (lse, logp, entropy or None), [n_rows] each."""
    lse, logp = torch.empty(2, n_rows, dtype=dtype, device=device)
    return lse, logp, torch.empty(n_rows, dtype=dtype, device=device) if with_entropy else None


def active_rows(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    ent: torch.Tensor | None,
    grad_logp: torch.Tensor,
    grad_ent: torch.Tensor | None,
    dtype: torch.dtype,
) -> ActiveRows:
    """Upstream gradients in `dtype` (contiguous) and the rows where either is non-zero."""
    g = grad_logp.to(dtype).contiguous()
    ent_grad = ent is not None and grad_ent is not None and bool(grad_ent.ne(0).any())
    g_ent = grad_ent.to(dtype).contiguous() if ent_grad and grad_ent is not None else None
    active = g.ne(0) if g_ent is None else g.ne(0) | g_ent.ne(0)
    n_rows = int(hidden.shape[0])
    if bool(active.all()):
        used_ent = ent if g_ent is not None else None
        return ActiveRows(hidden, targets, lse, used_ent, g, g_ent, None, n_rows)
    index = active.nonzero().squeeze(1)
    return ActiveRows(
        hidden[index],
        targets[index],
        lse[index],
        ent[index] if ent is not None and g_ent is not None else None,
        g[index],
        g_ent[index] if g_ent is not None else None,
        index,
        n_rows,
    )
