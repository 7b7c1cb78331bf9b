"""The reference path: full [N, V] logits, log_softmax, gather. For tests and benchmarks only.

It is the one place allowed to run log_softmax over the whole vocabulary; it materialises
O(N x V) memory (logits, log-probs and, in backward, their gradients). Inputs of the same dtype
are multiplied in that dtype (bf16 logits, as a plain `lm_head(hidden).float()` would give),
then the softmax statistics run in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.kernels.chunked import compute_dtype


def naive_token_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """`token_logprobs` (kernels/dispatch.py) computed the plain way, for reference."""
    cd = compute_dtype(hidden.dtype, weight.dtype)
    if hidden.dtype == weight.dtype:
        logits = (hidden @ weight.t()).to(cd)
    else:
        logits = hidden.to(cd) @ weight.to(cd).t()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    logp = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
    entropy = None
    if with_entropy:
        entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return logp, entropy


def naive_entropy_terms(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p_target, H, S = sum_j p_j^2 (log p_j + H)) from the full [N, V] log-softmax."""
    cd = compute_dtype(hidden.dtype, weight.dtype)
    with torch.no_grad():
        logits = hidden.detach().to(cd) @ weight.detach().to(cd).t() / temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        probs = logprobs.exp()
        entropy = -(probs * logprobs).sum(dim=-1)
        vocab_term = (probs * probs * (logprobs + entropy.unsqueeze(1))).sum(dim=-1)
        logp = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
    return logp, entropy, vocab_term
