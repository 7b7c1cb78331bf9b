"""Each distinct prompt goes through the model once per batch, not once per sample.

A GRPO batch holds n samples of every prompt, and on short-answer tasks the prompt is most of each
sequence (SmolLM2's chat prompt for "What is 3+5?" is 44 tokens, the answer under 16), so most of
the rollout's prefill and of the training forward and backward is the same prompt again. Here the
distinct prompts run once and fill a KV cache, the cache is gathered to every row, and the rows'
completions attend to it: the same attention over the same keys and values, hence the same
log-probs up to float rounding. With autograd on, gradients flow back through the gather into the
one prompt pass — the sum over the n rows that n separate prompt passes would have produced.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from tepo_cli.models.cache_key import with_cache


def prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    owner: torch.Tensor,
    inputs_embeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, DynamicCache]:
    """Run the distinct prompts [U, P] through the model's backbone; returns their last hidden
    states [U, P, H] and a KV cache gathered to the rows (`owner`: each row's prompt, [N]).
    `inputs_embeds` [U, P, H], when given, replaces the embedding of `input_ids`."""
    cache = DynamicCache(config=model.config)
    hidden = model.base_model(
        input_ids=None if inputs_embeds is not None else input_ids,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        position_ids=position_ids,
        **with_cache(cache),
        use_cache=True,
    ).last_hidden_state
    gather_rows(cache, owner)
    return hidden, cache


def gather_rows(cache: DynamicCache, owner: torch.Tensor) -> None:
    """Row i of every layer's keys and values becomes prompt owner[i]'s.

    Not `cache.batch_select_indices`: its advanced indexing has a backward that, on CPU, adds a
    prompt's rows with parallel atomics once a layer's keys pass 32,768 entries, so the gradient's
    rounding changed with thread timing and a resumed run could not match the uninterrupted one
    bit for bit. index_select's backward adds them in a fixed order.
    """
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel() > 0:
            layer.keys = layer.keys.index_select(0, owner)
            layer.values = layer.values.index_select(0, owner)
