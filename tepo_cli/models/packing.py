"""Padding-free packing: a micro-batch's real tokens in one row, each prompt computed once.

The padded layout runs every row of a micro-batch at the width of its longest answer: on long,
ragged answers (mean about half the cap) most of the decoder's work goes into padding. Here the
real tokens of a micro-batch are laid out in one row,

    [prompt_1, answer_1a, answer_1b, ..., prompt_2, answer_2a, ...]

with each distinct prompt once (the shared-prompt saving of models/shared_prompts.py) and each
answer's positions continuing its prompt's. Projections, MLPs and norms then see real tokens only.
Attention keeps the padded layout's semantics by segments: a prompt attends causally to itself; an
answer attends to its whole prompt and causally to itself, never to the other answers. The keys
and values of each segment are gathered into one buffer (an answer's segment is its prompt's keys
followed by its own), which is exactly the input of a variable-length attention kernel:
`torch.nn.attention.varlen.varlen_attn` (FlashAttention, bottom-right causal) on CUDA in bf16/fp16,
and segment by segment through `scaled_dot_product_attention` with a lower-right causal mask
elsewhere (CPU, float32 or float64). The same keys and values meet the same queries, so log-probs
and gradients equal the padded path's up to float rounding (tests/test_packing.py, float64).
The attention itself is models/packed_attention.py; this module builds the layout it reads.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from tepo_cli.models.packed_attention import route_attention, supports_packing

__all__ = [
    "ExternalPrompts",
    "KeyCapture",
    "PackedLayout",
    "pack",
    "packed_forward",
    "supports_packing",
]


@dataclass(frozen=True)
class PackedLayout:
    """Where each token of the packed row comes from, and how its attention is cut.

    source:     [L] index of each packed token in the flattened [N * (P + T)] padded batch.
    positions:  [L] its position id (an answer's continue its prompt's).
    key_index:  [K] packed index of each key of the segments' gathered key buffer.
    cu_queries: [S + 1] int32 segment starts in the packed row (segments are contiguous there).
    cu_keys:    [S + 1] int32 segment starts in the gathered key buffer.
    query_starts, key_starts: the same on the host (the segment-by-segment path slices by them).
    max_queries, max_keys: the longest segment's query and key counts.
    answer_state: [N, T] packed index of the state that predicts each completion token, L where
                  there is no token (a zero row is appended there).
    column_state: [N, P + T − 1] packed index of the state at every column but the last (the
                  state at column c predicts token c + 1), L on padding.
    prompts:      the prompts' keys, values and states when a prompt pass computed them
                  (`ExternalPrompts`): the row then holds answers only, key indices and state
                  indices count the prompt pass's Lp tokens first (states: [Lp prompt states,
                  L row states, zero row], the zero row at Lp + L).
    capture:      where each layer's keys and values are kept (the prompt pass), or None.
    masks:        the segment-by-segment path's attention masks, built once for all layers
                  (models/packed_attention.py), by (queries, keys, dtype).
    """

    source: torch.Tensor
    positions: torch.Tensor
    key_index: torch.Tensor
    cu_queries: torch.Tensor
    cu_keys: torch.Tensor
    query_starts: tuple[int, ...]
    key_starts: tuple[int, ...]
    max_queries: int
    max_keys: int
    answer_state: torch.Tensor
    column_state: torch.Tensor
    prompts: ExternalPrompts | None = None
    capture: KeyCapture | None = None
    masks: dict[tuple[int, int, torch.dtype], torch.Tensor] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def length(self) -> int:
        return int(self.source.numel())


@dataclass(frozen=True)
class ExternalPrompts:
    """Prompts computed outside the packed row, once for several micro-batches (a prompt pass,
    models/prompt_pass.py): each layer's keys and values over the prompt pass's row
    [Hkv, Lp, D] (after the rotary embedding), its final hidden states [Lp, H], and where each
    row of the micro-batch finds its prompt in that row (`row_starts`, host ints)."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    hidden: torch.Tensor
    row_starts: tuple[int, ...]

    @property
    def length(self) -> int:
        return int(self.hidden.shape[0])


class KeyCapture:
    """Each layer's keys and values of one packed forward, [Hkv, L, D], by layer index.

    A checkpointed layer runs again in backward; the forward's tensors (the ones in the graph)
    are the ones kept."""

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def keep(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        if layer not in self.keys:
            self.keys[layer], self.values[layer] = key, value


def pack(
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_width: int,
    owners: tuple[torch.Tensor, torch.Tensor] | None,
    prompts: ExternalPrompts | None = None,
) -> PackedLayout:
    """The layout of a left-padded-prompt, right-padded-completion batch [N, P + T]; with
    `owners` (`SequenceBatch.distinct_prompts`), each distinct prompt once; with `prompts` (a
    prompt pass's, and its `owners`), of its answers only, attending to those prompts.

    One host synchronisation (the rows' token counts and prompt owners); the index tensors are
    built on the host, where they are small, and cross to the batch's device once.
    """
    device = attention_mask.device
    rows, width = attention_mask.shape
    prompt_mask = attention_mask[:, :prompt_width]
    if owners is not None:  # (first row of each distinct prompt, each row's): shared prompts
        first, owner = owners
    else:
        first = owner = torch.arange(rows, device=device)
    lengths = torch.stack([prompt_mask.sum(dim=1), attention_mask[:, prompt_width:].sum(dim=1)])
    prompt_lengths, answer_lengths, first_rows, owners = _on_host(lengths, first, owner)
    external = None if prompts is None else (prompts.row_starts, prompts.length)
    segments = _segments(
        first_rows, owners, prompt_lengths, answer_lengths, width, prompt_width, external
    )
    sources, keys, prompt_start, answer_start, zero_row = segments
    query_counts = [len(part) for part in sources]
    key_counts = [len(k) if isinstance(k, range) else len(k[0]) + len(k[1]) for k in keys]
    key_index = [i for k in keys for part in ((k,) if isinstance(k, range) else k) for i in part]
    source = torch.tensor([i for part in sources for i in part], dtype=torch.long, device="cpu")
    query_starts = tuple(itertools.accumulate(query_counts, initial=0))
    key_starts = tuple(itertools.accumulate(key_counts, initial=0))
    column_state, answer_state = _state_columns(
        owners,
        prompt_start,
        answer_start,
        prompt_lengths,
        answer_lengths,
        prompt_width,
        width,
        zero_row,
    )
    moved = functools.partial(_to_device, device=device)
    source = moved(source)
    return PackedLayout(
        source=source,
        positions=position_ids.reshape(-1).index_select(0, source),
        key_index=moved(key_index),
        cu_queries=moved(query_starts, torch.int32),
        cu_keys=moved(key_starts, torch.int32),
        query_starts=query_starts,
        key_starts=key_starts,
        max_queries=max(query_counts, default=0),
        max_keys=max(key_counts, default=0),
        answer_state=moved(answer_state),
        column_state=moved(column_state),
        prompts=prompts,
    )


def _to_device(
    values: list[int] | tuple[int, ...] | torch.Tensor,
    dtype: torch.dtype = torch.long,
    *,
    device: torch.device,
) -> torch.Tensor:
    """Index values built on the host, to the batch's device (one copy, not blocking)."""
    return torch.as_tensor(values, dtype=dtype, device="cpu").to(device, non_blocking=True)


def _on_host(
    lengths: torch.Tensor, first: torch.Tensor, owner: torch.Tensor
) -> tuple[list[int], list[int], list[int], list[int]]:
    """The rows' prompt and answer lengths ([2, N]), each distinct prompt's first row and each
    row's prompt owner, read to the host in one synchronisation."""
    rows = lengths.shape[1]
    host = torch.cat([lengths.reshape(-1), first, owner]).tolist()
    split = 2 * rows + len(first)
    return host[:rows], host[rows : 2 * rows], host[2 * rows : split], host[split:]


Segments = tuple[list[range], list[range | tuple[range, range]], list[int], list[int], int]


def _segments(
    first_rows: list[int],
    owners: list[int],
    prompt_lengths: list[int],
    answer_lengths: list[int],
    width: int,
    prompt_width: int,
    external: tuple[tuple[int, ...], int] | None = None,
) -> Segments:
    """The packed row's segments in order (each distinct prompt, then its rows' answers in row
    order): each segment's flat padded indices, its keys' indices (an answer's: its prompt's,
    then its own), each prompt's and answer's state index, and the zero row's index.

    With `external` (each row's prompt start in a prompt pass's row, and that row's length Lp)
    the prompts are not in this row: their keys and states are the prompt pass's, indexed first,
    and the row's own follow from Lp on."""
    members: list[list[int]] = [[] for _ in first_rows]
    for row, prompt in enumerate(owners):
        members[prompt].append(row)
    offset = 0 if external is None else external[1]
    prompt_start, answer_start = [0] * len(first_rows), [0] * len(owners)
    sources: list[range] = []  # flat padded index of each packed token, segment by segment
    keys: list[range | tuple[range, range]] = []
    cursor = 0  # packed tokens of this row so far
    for prompt, row in enumerate(first_rows):
        length = prompt_lengths[row]
        if external is None:
            prompt_start[prompt] = cursor
            sources.append(range(row * width + prompt_width - length, row * width + prompt_width))
            keys.append(range(cursor, cursor + length))
            cursor += length
        else:
            prompt_start[prompt] = external[0][row]
        own_prompt = range(prompt_start[prompt], prompt_start[prompt] + length)
        for member in members[prompt]:
            length = answer_lengths[member]
            begin = offset + cursor
            answer_start[member] = begin
            if length:
                sources.append(
                    range(member * width + prompt_width, member * width + prompt_width + length)
                )
                keys.append((own_prompt, range(begin, begin + length)))
            cursor += length
    return sources, keys, prompt_start, answer_start, offset + cursor


def _state_columns(
    owners: list[int],
    prompt_start: list[int],
    answer_start: list[int],
    prompt_lengths: list[int],
    answer_lengths: list[int],
    prompt_width: int,
    width: int,
    zero_row: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each padded column's state lies in the packed row (`zero_row` on padding): at every
    column but the last, [N, P + T − 1] (the state at column c predicts token c + 1), and at the
    columns that predict the completion tokens, [N, T]."""
    states = torch.full((len(owners), width), zero_row, dtype=torch.long, device="cpu")
    for row, prompt in enumerate(owners):
        _place(states[row, :prompt_width], prompt_start[prompt], prompt_lengths[row], right=True)
        _place(states[row, prompt_width:], answer_start[row], answer_lengths[row], right=False)
    column_state = states[:, : width - 1]
    answer_state = column_state[:, prompt_width - 1 :].clone()
    # A state past an answer's end predicts nothing scored: the zero row.
    answer_state[
        torch.arange(width - prompt_width, device="cpu")
        >= torch.tensor(answer_lengths, device="cpu")[:, None]
    ] = zero_row
    return column_state, answer_state


def _place(columns: torch.Tensor, begin: int, length: int, right: bool) -> None:
    """Packed indices begin .. begin + length into the last (`right`, a left-padded prompt) or
    first (a right-padded answer) `length` of these columns."""
    where = slice(columns.shape[0] - length, None) if right else slice(0, length)
    columns[where] = torch.arange(begin, begin + length, device="cpu")


def packed_forward(
    model: PreTrainedModel, layout: PackedLayout, embedded: torch.Tensor
) -> torch.Tensor:
    """The decoder's final hidden states of the packed row, [L + 1, H]: row L is zeros (the state
    gathered for padding). `embedded` is the padded batch's input embedding [N, P + T, H]."""
    route_attention(model)
    flat = embedded.reshape(-1, embedded.shape[-1]).index_select(0, layout.source)
    hidden = model.base_model(
        inputs_embeds=flat[None],
        position_ids=layout.positions[None],
        # A 4D mask is passed through untouched: transformers builds none (for a packed row it
        # would build a dense [L, L] one), and the packed attention reads the layout instead.
        attention_mask=_NO_MASK.to(flat.device),
        use_cache=False,
        packed_layout=layout,
    ).last_hidden_state[0]
    return torch.cat([hidden, hidden.new_zeros(1, hidden.shape[-1])])


_NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool, device="cpu")
