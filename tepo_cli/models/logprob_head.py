"""`LogprobHead`: token log-probs from hidden states through an lm-head weight (the kernel path).

A module of its own that holds the lm-head Parameter: under ZeRO-3 the engine gathers a module's
partitioned parameters around its forward and its backward, which a bare `lm_head.weight` used
outside the lm-head's own forward would not get.
"""

from __future__ import annotations

import torch
from torch import nn

from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels import token_logprobs


class LogprobHead(nn.Module):
    """log softmax(hidden @ weight.T / T)[target], chunk by chunk (never the [N, V] logits)."""

    def __init__(self, weight: nn.Parameter, kernel: KernelConfig) -> None:
        super().__init__()
        self.weight = weight
        self.kernel = kernel

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
        scoring MTP terms that must not train the backbone)."""
        return token_logprobs(
            hidden,
            self.weight if weight_grad else self.weight.detach(),
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_size=self.kernel.chunk_size,
            backend=self.kernel.backend,
        )


def _weight_of(lm_head: nn.Module) -> nn.Parameter:
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError("the log-prob kernel path supports lm-heads without bias only")
    return lm_head.weight
