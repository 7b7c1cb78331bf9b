"""The policy as tepo trains it: a causal LM whose log-probs go through the kernel path.

The backbone returns hidden states; `LogprobHead` turns them into token log-probs (and
entropies) with the lm-head weight inside `token_logprobs`, chunk by chunk, only at response
positions — the full [tokens x vocab] logits are never built.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels import token_logprobs
from tepo_cli.train.sequences import SequenceBatch


class LogprobHead(nn.Module):
    """Token log-probs from hidden states through the lm-head weight.

    A module of its own that holds the lm-head Parameter (shared, not copied): under ZeRO-3 the
    engine gathers a module's partitioned parameters around its forward and its backward, which
    a bare `lm_head.weight` used outside the lm-head's own forward would not get.
    """

    def __init__(self, lm_head: nn.Module, kernel: KernelConfig) -> None:
        super().__init__()
        if getattr(lm_head, "bias", None) is not None:
            raise ValueError("the log-prob kernel path supports lm-heads without bias only")
        self.weight = lm_head.weight
        self.kernel = kernel

    def forward(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_logprobs(
            hidden,
            self.weight,
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_size=self.kernel.chunk_size,
            backend=self.kernel.backend,
        )


class Policy(nn.Module):
    """`lm` is the transformers model (generation, saving); `forward` scores completions."""

    def __init__(self, lm: PreTrainedModel, kernel: KernelConfig) -> None:
        super().__init__()
        # Sampling and training must see the same function (ratio = 1 on-policy): no dropout.
        self.lm = lm.eval()
        self.head = LogprobHead(lm.get_output_embeddings(), kernel)

    def forward(
        self, batch: SequenceBatch, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the completion tokens, zero on padding: [N, T] each."""
        hidden = self.lm.base_model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state
        width = batch.response_mask.shape[1]
        # The hidden state at column c predicts the token at column c + 1.
        response_hidden = hidden[:, batch.prompt_width - 1 : batch.prompt_width - 1 + width]
        valid = batch.response_mask
        logp_flat, entropy_flat = self.head(
            response_hidden[valid],
            batch.completion_ids[:, :width][valid],
            temperature,
            with_entropy,
        )
        logp = _scatter(valid, logp_flat)
        return logp, None if entropy_flat is None else _scatter(valid, entropy_flat)

    def hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This wrapper's state dict (e.g. ZeRO-3's consolidated one) with the LM's own keys."""
        return {key[3:]: value for key, value in state_dict.items() if key.startswith("lm.")}


def _scatter(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(valid.shape, dtype=values.dtype, device=valid.device)
    return out.masked_scatter(valid, values)
