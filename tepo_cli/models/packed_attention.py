"""The packed row's attention (models/packing.py's layout): transformers' attention interface
routed through `packed_attention`, which runs each segment's queries against its keys —
FlashAttention's variable-length kernel on CUDA in half precision, scaled-dot-product attention
segment by segment elsewhere — and passes every call without a packed layout to the model's own
implementation.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from tepo_cli.kernels.lean_layers import SAVED_OUTPUTS

if TYPE_CHECKING:
    from tepo_cli.models.packing import PackedLayout


def supports_packing(model: PreTrainedModel) -> bool:
    """Decoders whose attention goes through transformers' attention interface with full causal
    attention on every layer (sliding windows and custom kernels keep the padded layout)."""
    config = model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if getattr(config, "attn_logit_softcapping", None):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(kind != "full_attention" for kind in layer_types):
        return False
    own = config._attn_implementation or "eager"
    return own.startswith(_ROUTE_PREFIX) or own in ("sdpa", "eager", "flash_attention_2")


def route_attention(model: PreTrainedModel) -> None:
    """Route the decoder's attention through `packed_attention` from now on (idempotent).

    Every call without a packed layout (generation, the padded paths) goes on to the model's own
    implementation with its own masks, so nothing else changes. The route is permanent, not
    switched for one pass: gradient checkpointing recomputes the layers in backward, after the
    forward has returned, and the recomputation must take the same path.
    """
    config = model.config
    own = config._attn_implementation or "eager"
    if own.startswith(_ROUTE_PREFIX):
        return
    name = _ROUTE_PREFIX + own
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, functools.partial(packed_attention, fallback=own))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[own])
    config._attn_implementation = name


_ROUTE_PREFIX = "tepo_packed_or_"


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_layout: PackedLayout | None = None,
    fallback: str = "sdpa",
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention over the segments of `packed_layout`; query [1, Hq, L, D], key/value
    [1, Hkv, L, D]. Returns [1, L, Hq, D] as transformers' attention functions do. Without a
    layout, the `fallback` implementation's attention."""
    if packed_layout is None:
        own = ALL_ATTENTION_FUNCTIONS.get_interface(fallback, eager_attention_forward)
        return own(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    layout = packed_layout
    if layout.capture is not None:  # the prompt pass: its keys and values serve later rows
        layout.capture.keep(_layer_index(module), key[0], value[0])
    if layout.prompts is not None:  # the row's answers attend to a prompt pass's prompts
        layer = _layer_index(module)
        key = torch.cat([layout.prompts.keys[layer][None], key], dim=2)
        value = torch.cat([layout.prompts.values[layer][None], value], dim=2)
    gqa = query.shape[1] != key.shape[1]
    if _flash_varlen_applies(query):
        from torch.nn.attention.varlen import varlen_attn

        keys = key[0].transpose(0, 1).index_select(0, layout.key_index)  # [K, Hkv, D]
        values = value[0].transpose(0, 1).index_select(0, layout.key_index)
        causal, takes_gqa = _varlen_signature()
        if gqa and not takes_gqa:  # torch before 2.13: as many key heads as query heads
            repeats = query.shape[1] // key.shape[1]
            keys, values = keys.repeat_interleave(repeats, 1), values.repeat_interleave(repeats, 1)
        gqa_option = {"enable_gqa": gqa} if takes_gqa else {}
        out = varlen_attn(
            query[0].transpose(0, 1),  # [L, Hq, D]
            keys,
            values,
            layout.cu_queries,
            layout.cu_keys,
            layout.max_queries,
            layout.max_keys,
            scale=scaling,
            **causal,
            **gqa_option,
        )
        return out[None], None
    parts = _segment_by_segment(query[0], key[0], value[0], layout, scaling, gqa)
    out = _token_major(parts)
    # o_proj keeps its input for backward: a copy of what the segments' attention keeps anyway.
    SAVED_OUTPUTS.register(out, lambda: _token_major(parts))  # lean_layers: kept as a recipe
    return out, None


@functools.cache
def _varlen_signature() -> tuple[dict[str, Any], bool]:
    """The causal mask in the installed torch's words (aligned to the bottom right: the answer's
    own tokens after a prompt pass's keys), and whether it takes fewer key heads than query heads.
    torch 2.10 knows `is_causal` only, 2.11 `window_size`, 2.13 also `enable_gqa`."""
    from torch.nn.attention.varlen import varlen_attn

    accepted = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in accepted else {"is_causal": True}
    return causal, "enable_gqa" in accepted


def _layer_index(module: torch.nn.Module) -> int:
    """The decoder layer an attention module belongs to (transformers' `layer_idx`)."""
    index = getattr(module, "layer_idx", None)
    if index is None:
        raise ValueError(
            f"{type(module).__name__} has no layer_idx: its keys cannot be matched to a prompt "
            "pass's (models/prompt_pass.py)"
        )
    return int(index)


def _flash_varlen_applies(queries: torch.Tensor) -> bool:
    """FlashAttention's variable-length kernel: CUDA, half precision, Ampere or newer."""
    if not (queries.is_cuda and queries.dtype in (torch.float16, torch.bfloat16)):
        return False
    return torch.cuda.get_device_capability(queries.device)[0] >= 8


def _token_major(parts: list[torch.Tensor]) -> torch.Tensor:
    """The segments' outputs [Hq, l, D] as one contiguous [1, L, Hq, D]: transformers' reshape
    for o_proj is then a view, not a copy of its own."""
    return torch.cat(parts, dim=1).transpose(0, 1).contiguous()[None]


def _segment_by_segment(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    layout: PackedLayout,
    scaling: float | None,
    gqa: bool,
) -> list[torch.Tensor]:
    """What varlen_attn computes, one segment at a time (CPU; float32/float64 on CUDA):
    queries [Hq, L, D], keys/values [Hkv, L, D] → each segment's output [Hq, l, D] (what
    scaled-dot-product attention keeps for its backward).

    The segments are `split` views, whose backward is one concatenation; slicing each segment
    would make its backward write a zero tensor of the whole row per segment.
    """
    query_parts = queries.split(_counts(layout.query_starts), dim=1)
    key_counts = _counts(layout.key_starts)
    key_parts = _segment_keys(keys, layout).split(key_counts, dim=1)
    value_parts = _segment_keys(values, layout).split(key_counts, dim=1)
    outputs = []
    for q, k, v in zip(query_parts, key_parts, value_parts, strict=True):
        square = q.shape[1] == k.shape[1]
        out = F.scaled_dot_product_attention(
            q[None],
            k[None],
            v[None],
            attn_mask=None if square else _lower_right(layout, q, k),
            is_causal=square,
            scale=scaling,
            enable_gqa=gqa,  # grouped key/value heads read in place, not copied per query head
        )
        outputs.append(out[0])
    return outputs


def _lower_right(layout: PackedLayout, queries: torch.Tensor, keys: torch.Tensor) -> Any:
    """The mask of an answer segment's queries [H, q, D] over its prompt's keys and its own
    [H, k, D]: causal, aligned to the bottom right.

    On CUDA, torch's `causal_lower_right`, which its memory-efficient kernel applies without a
    mask tensor. On the CPU torch would materialise that as a [q, k] additive mask in the
    queries' dtype at every call, and attention keeps its mask for backward: a [q, k] copy per
    layer, as large as a good share of what the answer's tokens keep otherwise. Here the same
    additive mask
    (0 where a query may attend, -inf elsewhere: the values torch builds, so the same outputs)
    is built once per shape for the layout and every layer is passed that one tensor.
    """
    count, width = queries.shape[1], keys.shape[1]
    if queries.is_cuda:
        return causal_lower_right(count, width)
    shape = (count, width, queries.dtype)
    mask = layout.masks.get(shape)
    if mask is None:  # -inf above the diagonal that ends at the last key, 0 elsewhere
        mask = torch.full((count, width), float("-inf"), dtype=queries.dtype, device=queries.device)
        mask = layout.masks[shape] = mask.triu_(diagonal=width - count + 1)
    return mask


def _segment_keys(rows: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
    """Each segment's keys (or values) side by side: an answer's prompt, then its own. With
    shared prompts a prompt is repeated for each of its answers, so attention would keep every
    copy for backward; it keeps a recipe instead (lean_layers), and the row's own keys."""
    selected = rows.index_select(1, layout.key_index)
    SAVED_OUTPUTS.register(selected, lambda: rows.index_select(1, layout.key_index))
    return selected


def _counts(starts: tuple[int, ...]) -> list[int]:
    return [stop - start for start, stop in itertools.pairwise(starts)]
