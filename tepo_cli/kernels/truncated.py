"""Log-probs of the distribution a truncated sampler draws from (top-k, top-p), for
`rollout.truncated_sampling=renormalise` (docs/objectives.md §0.9).

The sampler scales the logits by 1/T, keeps S — the tokens that survive top-k, then top-p over
what top-k kept — and draws from the softmax over S. Its log-prob of token y is
z_y − logsumexp_{v∈S} z_v; this module returns that, its entropy over S and, for TEPO's
`first_order` mask, S's entropy terms. S is chosen as transformers' `TopKLogitsWarper` and
`TopPLogitsWarper` and vLLM's sampler choose it (ties at the k-th value kept; top-p drops the
lowest tokens whose cumulative probability stays at or below 1 − p, never the top one), so with
the same logits the trainer's log-prob is the sampler's.

S needs each row's whole vocabulary (top-p sorts it), so the path computes one chunk of
`rows × V` logits at a time (`full_vocab_rows`, as the triton path) and, under autograd,
recomputes the chunk in backward instead of keeping it (activation checkpointing): the memory of
one chunk, never [N, V].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tepo_cli.kernels.blocking import full_vocab_rows
from tepo_cli.kernels.chunked import compute_dtype


@dataclass(frozen=True)
class Truncation:
    """The sampler's truncation: `top_k` > 0 keeps the k largest logits, `top_p` < 1 the nucleus."""

    top_k: int = 0
    top_p: float = 1.0

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


def kept_set(scaled: Tensor, truncation: Truncation, targets: Tensor) -> Tensor:
    """[rows, V] bool: S for each row of temperature-scaled logits, widened by the row's target.

    S is the scored policy's own kept set, chosen without gradient (a sampler's choice is not
    differentiable). The scored token is always in it [our reading]: the policy that drew it kept
    it; another one (θ after an update, the KL reference) might not, and its log-prob stays finite.
    """
    with torch.no_grad():
        keep = torch.ones_like(scaled, dtype=torch.bool)
        if 0 < truncation.top_k < scaled.shape[-1]:
            kth = scaled.topk(truncation.top_k, dim=-1).values[:, -1:]
            keep = scaled >= kth
        if truncation.top_p < 1.0:
            ascending, order = scaled.masked_fill(~keep, float("-inf")).sort(dim=-1)
            dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - truncation.top_p
            dropped[:, -1] = False
            keep &= ~torch.zeros_like(keep).scatter(-1, order, dropped)
        keep[torch.arange(keep.shape[0], device=keep.device), targets] = True
    return keep


def truncated_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float,
    with_entropy: bool,
    truncation: Truncation,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`token_logprobs` (kernels/dispatch.py) of the truncated, renormalised distribution:
    log-probs [N] and, with `with_entropy`, its entropy [N]; differentiable in hidden and weight."""
    rows = full_vocab_rows(hidden.shape[0], weight.shape[0], hidden.device, chunk_size)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], rows):
        part = (hidden[start : start + rows], weight, targets[start : start + rows])
        if grad:
            logp, entropy = checkpoint(_chunk, *part, temperature, truncation, use_reentrant=False)
        else:
            logp, entropy = _chunk(*part, temperature, truncation)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:
        empty = hidden.new_zeros(0, dtype=compute_dtype(hidden.dtype, weight.dtype))
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def truncated_entropy_terms(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float,
    truncation: Truncation,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`token_entropy_terms` (kernels/entropy_terms.py) of the truncated distribution:
    (log p_target, H, S = Σ_{j∈S} p_j²(log p_j + H)), no grad."""
    rows = full_vocab_rows(hidden.shape[0], weight.shape[0], hidden.device, chunk_size)
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    with torch.no_grad():
        for start in range(0, hidden.shape[0], rows):
            chunk = hidden[start : start + rows].detach()
            logprobs, probs = _kept_logprobs(
                chunk, weight.detach(), targets[start : start + rows], temperature, truncation
            )
            entropy = -(probs * logprobs).sum(dim=-1)
            term = (probs * probs * (logprobs + entropy[:, None])).sum(dim=-1)
            logp = logprobs.gather(1, targets[start : start + rows, None]).squeeze(1)
            parts.append((logp, entropy, term))
    if not parts:
        empty = hidden.new_zeros(0, dtype=compute_dtype(hidden.dtype, weight.dtype))
        return empty, empty, empty
    logp, entropy, term = (torch.cat(column) for column in zip(*parts, strict=True))
    return logp, entropy, term


def _chunk(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, truncation: Truncation
) -> tuple[Tensor, Tensor]:
    logprobs, probs = _kept_logprobs(hidden, weight, targets, temperature, truncation)
    logp = logprobs.gather(1, targets[:, None]).squeeze(1)
    entropy = -(probs * logprobs).sum(dim=-1)
    return logp, entropy


def _kept_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, truncation: Truncation
) -> tuple[Tensor, Tensor]:
    """[rows, V] log-probs and probabilities over S. Outside S the probability is 0 and the
    log-prob is written as 0, not −inf, so that p·log p and its gradient are 0 there, not NaN."""
    cd = compute_dtype(hidden.dtype, weight.dtype)
    if hidden.dtype == weight.dtype:  # the same product as kernels/naive.py's
        logits = (hidden @ weight.t()).to(cd)
    else:
        logits = hidden.to(cd) @ weight.to(cd).t()
    scaled = logits / temperature
    keep = kept_set(scaled.detach(), truncation, targets)
    logprobs = torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
    return logprobs.masked_fill(~keep, 0.0), logprobs.exp()
