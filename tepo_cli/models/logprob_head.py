"""`LogprobHead`: token log-probs from hidden states through an lm-head weight (the kernel path).

A module of its own that holds the lm-head Parameter: under ZeRO-3 the engine gathers a module's
partitioned parameters around its forward and its backward, which a bare `lm_head.weight` used
outside the lm-head's own forward would not get.
"""

from __future__ import annotations

import torch
from torch import nn

from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels import token_entropy_terms, token_logprobs
from tepo_cli.kernels.truncated import Truncation, truncated_entropy_terms, truncated_token_logprobs


class LogprobHead(nn.Module):
    """log softmax(hidden @ weight.T / T)[target], chunk by chunk (never the [N, V] logits).

    With an active `truncation` (rollout.truncated_sampling=renormalise) the softmax is the
    sampler's: over the tokens its top-k and top-p keep (kernels/truncated.py)."""

    def __init__(self, weight: nn.Parameter, kernel: KernelConfig) -> None:
        super().__init__()
        self.weight = weight
        self.kernel = kernel
        self.truncation = Truncation()

    @classmethod
    def of(cls, lm_head: nn.Module, kernel: KernelConfig) -> LogprobHead:
        """Shares `lm_head`'s weight (the same Parameter, trained once)."""
        return cls(_weight_of(lm_head), kernel)

    @classmethod
    def copy_of(cls, lm_head: nn.Module, kernel: KernelConfig) -> LogprobHead:
        """A head of its own, initialised as a copy of `lm_head`'s weight."""
        return cls(nn.Parameter(_weight_of(lm_head).detach().clone()), kernel)

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        weight_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`weight_grad=False` keeps the weight out of the graph (e.g. the backbone's own head
        scoring attached modules' terms that must not train the backbone)."""
        weight = self.weight if weight_grad else self.weight.detach()
        if self.truncation.active:
            return truncated_token_logprobs(
                hidden,
                weight,
                targets,
                temperature,
                with_entropy,
                self.truncation,
                chunk_size=self.kernel.chunk_size,
            )
        return token_logprobs(
            hidden,
            weight,
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_size=self.kernel.chunk_size,
            backend=self.kernel.backend,
        )

    def entropy_terms(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """[N] S = Σ_j p_j²(log p_j + H) of the head's distribution, no grad (TEPO's
        first_order mask, kernels/entropy_terms.py)."""
        hidden, weight = hidden.detach(), self.weight.detach()
        chunk = self.kernel.chunk_size
        if self.truncation.active:
            terms = truncated_entropy_terms(hidden, weight, targets, temperature, self.truncation)
        else:
            terms = token_entropy_terms(hidden, weight, targets, temperature, chunk_size=chunk)
        return terms[2]


def _weight_of(lm_head: nn.Module) -> nn.Parameter:
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError("the log-prob kernel path supports lm-heads without bias only")
    return lm_head.weight
