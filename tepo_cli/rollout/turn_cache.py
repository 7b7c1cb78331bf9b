"""Multi-turn episodes on the trainer's own model (rollout=hf): each conversation's KV cache kept
from one turn to the next, so a turn runs only the tokens it adds (the observation, the next
message's header), not the whole conversation again.

The back-end's interface stays as it is, contexts of token ids in and turns out: a context that
begins with tokens a kept cache holds starts from that cache, up to where the two part, and runs
the rest. Keys and values depend on the weights: the back-end drops every kept cache when the
weights change (its `sync`), and each call keeps only its own rows' caches, so memory holds one
conversation per episode at most.

Layout of a batch that reuses caches, row r with p_r kept tokens and n_r new ones, C = max p,
N = max n: columns [0, C) hold the kept keys and values right-aligned (left padding masked),
columns [C, C + N) the new tokens right-aligned (the gap masked). generate() runs columns C on;
positions come from the attention mask (real tokens counted), as the kept keys' were.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass
class Kept:
    """One conversation's cache: the tokens it holds (the context it was asked for, then the
    turn), and per layer their keys and values [heads, tokens, head dim]."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    context: int  # how many of `tokens` were the context


class TurnCache:
    """The kept conversations of the last call (module docstring)."""

    def __init__(self) -> None:
        self.kept: list[Kept] = []

    def clear(self) -> None:
        self.kept = []

    def reuse(self, context: list[int]) -> tuple[Kept | None, int]:
        """The kept conversation that `context` continues (it begins with that conversation's
        whole context) and how many tokens of it to reuse: as far as the turn is kept (an
        environment may cut it), never the context's last token, whose logits start the turn.
        Another conversation that merely shares a chat template's header is never reused, so
        whether a turn reuses anything does not depend on what ran before this episode."""
        best, length = None, 0
        for kept in self.kept:
            shared = _common_prefix(kept.tokens, context)
            if shared >= kept.context and shared > length:
                best, length = kept, shared
        length = min(length, len(context) - 1)
        return (best, length) if length > 0 else (None, 0)


@dataclass
class Batch:
    """generate()'s inputs for rows that reuse kept caches (module docstring's layout)."""

    input_ids: torch.Tensor  # [B, C + N]: pad ids over the kept columns and the gaps
    attention_mask: torch.Tensor  # [B, C + N]
    cache: DynamicCache | None  # C columns; None when no row reuses anything
    kept_width: int  # C
    tokens: list[list[int]]  # each row's tokens in its real columns, in order


def build_batch(
    model: PreTrainedModel,
    contexts: list[list[int]],
    reused: list[tuple[Kept | None, int]],
    pad_id: int,
    least_width: int = 0,
) -> Batch:
    """`least_width`: the new tokens' columns at least (a call without reuse pads every chunk
    to its longest context, as generation always did)."""
    device = next(model.parameters()).device
    kept_width = max(length for _, length in reused)
    new = [len(context) - length for context, (_, length) in zip(contexts, reused, strict=True)]
    new_width = max(max(new), least_width if not kept_width else 0)
    rows, width = len(contexts), kept_width + new_width
    ids = torch.full((rows, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    for row, (context, (_, length)) in enumerate(zip(contexts, reused, strict=True)):
        new = context[length:]
        ids[row, width - len(new) :] = torch.tensor(new, dtype=torch.long, device=device)
        mask[row, width - len(new) :] = 1
        mask[row, kept_width - length : kept_width] = 1
    cache = _kept_cache(model, reused, kept_width) if kept_width else None
    return Batch(ids, mask, cache, kept_width, [list(context) for context in contexts])


def _kept_cache(
    model: PreTrainedModel, reused: list[tuple[Kept | None, int]], width: int
) -> DynamicCache:
    """The rows' kept keys and values, each cut to its reused length and left-padded to `width`."""
    cache = DynamicCache(config=model.config)
    layers = next(kept for kept, _ in reused if kept is not None).layers
    for layer, (keys, _) in enumerate(layers):
        shape = (len(reused), keys.shape[0], width, keys.shape[2])
        batch_keys = keys.new_zeros(shape)
        batch_values = keys.new_zeros(shape)
        for row, (kept, length) in enumerate(reused):
            if kept is not None and length:
                row_keys, row_values = kept.layers[layer]
                batch_keys[row, :, width - length :] = row_keys[:, :length]
                batch_values[row, :, width - length :] = row_values[:, :length]
        cache.update(batch_keys, batch_values, layer)
    return cache


def keep(
    batch: Batch, cache: DynamicCache, generated: torch.Tensor, attention_mask: torch.Tensor
) -> list[Kept]:
    """Each row's conversation as the returned cache holds it: its real columns (the mask
    generate() extended over the generated tokens), every generated token but the last (never
    fed back)."""
    columns = cache.layers[0].keys.shape[2]
    mask = attention_mask[:, :columns].bool()
    kept = []
    for row in range(mask.shape[0]):
        real = mask[row].nonzero().squeeze(1)
        fed = generated[row, : columns - batch.input_ids.shape[1]].tolist()
        layers = [
            (
                layer.keys[row].index_select(1, real).clone(),
                layer.values[row].index_select(1, real).clone(),
            )
            for layer in cache.layers
        ]
        kept.append(Kept(batch.tokens[row] + fed, layers, len(batch.tokens[row])))
    return kept


def _common_prefix(a: list[int], b: list[int]) -> int:
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length
