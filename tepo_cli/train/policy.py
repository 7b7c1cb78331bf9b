"""The policy as tepo trains it: a causal LM whose log-probs go through the kernel path.

The backbone returns hidden states; `LogprobHead` turns them into token log-probs (and
entropies) with the lm-head weight inside `token_logprobs`, chunk by chunk, only at response
positions — the full [tokens x vocab] logits are never built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels import token_logprobs
from tepo_cli.models.shared_prompts import distinct_prompts, prefill
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

    def __init__(
        self, lm: PreTrainedModel, kernel: KernelConfig, share_prompts: bool = True
    ) -> None:
        super().__init__()
        # Sampling and training must see the same function (ratio = 1 on-policy): no dropout.
        self.lm = lm.eval()
        self.head = LogprobHead(lm.get_output_embeddings(), kernel)
        self.share_prompts = share_prompts

    def forward(
        self, batch: SequenceBatch, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the completion tokens, zero on padding: [N, T] each."""
        checkpointing = self.lm.is_activation_checkpointing and torch.is_grad_enabled()
        if self.share_prompts and not checkpointing:
            response_hidden = self._shared_prompt_hidden(batch)
        else:
            response_hidden = self._response_hidden(batch, checkpointing)
        valid = batch.response_mask
        width = valid.shape[1]
        logp_flat, entropy_flat = self.head(
            response_hidden[valid],
            batch.completion_ids[:, :width][valid],
            temperature,
            with_entropy,
        )
        logp = _scatter(valid, logp_flat)
        return logp, None if entropy_flat is None else _scatter(valid, entropy_flat)

    def _response_hidden(self, batch: SequenceBatch, checkpointing: bool) -> torch.Tensor:
        """Hidden states that predict each completion token: [N, T, H], one pass per row."""
        with _layers_in_train_mode(self.lm, checkpointing):
            hidden = self.lm.base_model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state
        width = batch.response_mask.shape[1]
        # The hidden state at column c predicts the token at column c + 1.
        return hidden[:, batch.prompt_width - 1 : batch.prompt_width - 1 + width]

    def _shared_prompt_hidden(self, batch: SequenceBatch) -> torch.Tensor:
        """As `_response_hidden`, with each distinct prompt run once (models/shared_prompts.py)."""
        prompt_width, width = batch.prompt_width, batch.response_mask.shape[1]
        first, owner = distinct_prompts(
            batch.input_ids[:, :prompt_width], batch.attention_mask[:, :prompt_width]
        )
        if len(first) == len(batch):
            return self._response_hidden(batch, checkpointing=False)
        prompt_hidden, cache = prefill(
            self.lm,
            batch.input_ids[first, :prompt_width],
            batch.attention_mask[first, :prompt_width],
            batch.position_ids[first, :prompt_width],
            owner,
        )
        parts = [prompt_hidden[owner, prompt_width - 1 :]]  # predicts the first completion token
        if width > 1:  # the last completion token predicts nothing that is scored
            stop = prompt_width + width - 1
            parts.append(
                self.lm.base_model(
                    input_ids=batch.input_ids[:, prompt_width:stop],
                    attention_mask=batch.attention_mask[:, :stop],
                    position_ids=batch.position_ids[:, prompt_width:stop],
                    past_key_values=cache,
                    use_cache=True,
                ).last_hidden_state
            )
        return torch.cat(parts, dim=1)

    def hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This wrapper's state dict (e.g. ZeRO-3's consolidated one) with the LM's own keys."""
        return {key[3:]: value for key, value in state_dict.items() if key.startswith("lm.")}


@contextlib.contextmanager
def _layers_in_train_mode(lm: PreTrainedModel, enabled: bool) -> Iterator[None]:
    """transformers recomputes a layer in backward only while that layer is in train mode; the
    policy stays in eval mode (no dropout), so only the layers' own flags flip, for this pass."""
    layers = (
        [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)] if enabled else []
    )
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def _scatter(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(valid.shape, dtype=values.dtype, device=valid.device)
    return out.masked_scatter(valid, values)
