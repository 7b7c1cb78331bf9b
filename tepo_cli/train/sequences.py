"""Prompt + completion as one teacher-forced sequence, and the policy's log-probs on it.

Every log-prob goes through the kernel path: the backbone returns hidden states, and the lm-head
product happens inside `token_logprobs`, only at the response positions, chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels import token_logprobs
from tepo_cli.rollout.hf import Rollout


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor  # [N, P + T]
    attention_mask: torch.Tensor  # [N, P + T]
    position_ids: torch.Tensor  # [N, P + T]
    response_mask: torch.Tensor  # [N, T] bool
    prompt_width: int  # P: completions start at this column

    @classmethod
    def from_rollout(cls, rollout: Rollout) -> SequenceBatch:
        input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        attention_mask = torch.cat(
            [rollout.prompt_mask, rollout.completion_mask.to(rollout.prompt_mask.dtype)], dim=1
        )
        # Left-padded prompts: positions count real tokens only, as during generation.
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        return cls(
            input_ids,
            attention_mask,
            position_ids,
            rollout.completion_mask,
            rollout.prompt_ids.shape[1],
        )

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_width :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor) -> SequenceBatch:
        """Rows of the batch, cut to the longest completion among them (less work)."""
        response_mask = self.response_mask[rows]
        width = (
            int(response_mask.any(dim=0).nonzero().max().item()) + 1 if response_mask.any() else 1
        )
        stop = self.prompt_width + width
        return SequenceBatch(
            self.input_ids[rows, :stop],
            self.attention_mask[rows, :stop],
            self.position_ids[rows, :stop],
            response_mask[:, :width],
            self.prompt_width,
        )


def backbone(model: nn.Module) -> nn.Module:
    """The transformer without its lm-head (returns hidden states)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model.base_model


def response_logprobs(
    model: nn.Module,
    batch: SequenceBatch,
    temperature: float,
    kernel: KernelConfig,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the completion tokens under `model`, zero on padding. [N, T]."""
    hidden = backbone(model)(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    width = batch.response_mask.shape[1]
    # The hidden state at column c predicts the token at column c + 1.
    response_hidden = hidden[:, batch.prompt_width - 1 : batch.prompt_width - 1 + width]
    valid = batch.response_mask
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("the log-prob kernel path supports lm-heads without bias only")
    logp_flat, entropy_flat = token_logprobs(
        response_hidden[valid],
        head.weight,
        batch.completion_ids[:, :width][valid],
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_size=kernel.chunk_size,
        backend=kernel.backend,
    )
    logp = torch.zeros(valid.shape, dtype=logp_flat.dtype, device=valid.device)
    logp = logp.masked_scatter(valid, logp_flat)
    entropy = None
    if entropy_flat is not None:
        entropy = torch.zeros(valid.shape, dtype=entropy_flat.dtype, device=valid.device)
        entropy = entropy.masked_scatter(valid, entropy_flat)
    return logp, entropy
