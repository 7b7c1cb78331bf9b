"""The prompt pass: each distinct prompt of a minibatch computed once for all its micro-batches.

Token-budget micro-batches (train/micro_batches.py) spread a group's answers over several
forward/backward passes, and the packed forward (models/packing.py) computes each distinct prompt
once in every micro-batch that holds one of its answers. On long prompts that is a large share of
the update's token slots (the long-answer job's: docs/results/bench_update/results.md). With a prompt pass the minibatch's distinct prompts run once, in
one packed row; each layer's keys and values (after the rotary embedding) and the prompt tokens'
final hidden states are kept, and every micro-batch packs its answers only, which attend to their
prompt's keys and values (`ExternalPrompts`). The same attention over the same keys and values:
the same log-probs and gradients, up to float rounding (tests/test_prompt_pass.py, float64).

Gradient. The prompt pass's outputs reach the objective through every micro-batch, and each
micro-batch has a backward of its own (gradient accumulation). Every micro-batch but the last
reads detached copies of them (the leaves), whose gradients accumulate; the last reads the prompt
pass's outputs themselves, and its loss carries the leaves' gradients into them (`with_grads`),
so the prompt pass's own backward runs once, inside the last micro-batch's backward. Each
parameter thus gets its gradient in one backward per micro-batch, as DeepSpeed's gradient hooks
expect (ZeRO-1/2 reduce every parameter once, at the accumulation boundary), and on every rank
the prompt pass's backward runs exactly once (a zero gradient where no micro-batch read it), so
ZeRO-3's re-gathers in backward are entered the same number of times everywhere.

Memory. Its activations would be kept from the first micro-batch to the last, beside each
micro-batch's own; the caller checkpoints its layers instead (each keeps its input and runs again
in the last backward: one more forward of the prompts per minibatch), unless gradient
checkpointing is off. What stays is small: each layer's keys and values of the prompt tokens.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from tepo_cli.models.packing import (
    ExternalPrompts,
    KeyCapture,
    pack,
    packed_forward,
    supports_packing,
)
from tepo_cli.models.sequence_hidden import checkpointing_on, layers_in_train_mode

if TYPE_CHECKING:
    from tepo_cli.core.sequences import SequenceBatch


@dataclass
class PromptPass:
    """The distinct prompts of some rows of a batch, run once: `outputs` (each layer's keys and
    values [Hkv, Lp, D], then the final hidden states [Lp, H]) and where each row's prompt starts
    in the prompt row. `leaves` are the outputs' detached copies that all micro-batches but the
    last read (None when no gradient is recorded); `sums` the gradients they received, summed
    over those micro-batches in at least float32 (a bf16 sum of several micro-batches would round
    at each one, where DeepSpeed accumulates parameter gradients in float32)."""

    outputs: tuple[torch.Tensor, ...]
    layers: int
    start_of_row: dict[int, int]
    leaves: tuple[torch.Tensor, ...] | None
    sums: list[torch.Tensor | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.leaves is None:
            return
        self.sums = [None] * len(self.leaves)
        for index, leaf in enumerate(self.leaves):
            if leaf.requires_grad:
                # The hook holds the list, not this object: no reference cycle through the
                # leaves, so the prompt pass is freed as soon as its minibatch is done.
                leaf.register_post_accumulate_grad_hook(
                    functools.partial(_add_to, self.sums, index)
                )

    @property
    def tokens(self) -> int:
        """The prompt tokens it ran: each distinct prompt once."""
        return int(self.outputs[-1].shape[0])

    def for_rows(self, rows: torch.Tensor, last: bool) -> ExternalPrompts:
        """What the micro-batch of these batch rows reads: the outputs themselves in the last
        micro-batch of the minibatch (and without gradient), the leaves before it."""
        tensors = self.outputs if last or self.leaves is None else self.leaves
        return ExternalPrompts(
            keys=tensors[: self.layers],
            values=tensors[self.layers : 2 * self.layers],
            hidden=tensors[-1],
            row_starts=tuple(self.start_of_row[row] for row in rows.tolist()),
        )

    def with_grads(self, loss: torch.Tensor) -> torch.Tensor:
        """The last micro-batch's loss (same value), whose backward also carries the gradients
        the earlier micro-batches left on the leaves into the prompt pass (zero where none)."""
        if self.leaves is None:
            return loss
        grads = tuple(
            torch.zeros_like(output) if total is None else total.to(output.dtype)
            for output, total in zip(self.outputs, self.sums, strict=True)
        )
        return _AddGradients.apply(loss, grads, *self.outputs)


def _add_to(sums: list[torch.Tensor | None], index: int, leaf: torch.Tensor) -> None:
    """After a micro-batch's backward: the leaf's gradient into `sums[index]` (at least float32),
    the leaf's own freed."""
    assert leaf.grad is not None
    if sums[index] is None:
        sums[index] = leaf.grad.to(torch.promote_types(leaf.dtype, torch.float32), copy=True)
    else:
        sums[index].add_(leaf.grad)
    leaf.grad = None


class _AddGradients(torch.autograd.Function):
    """Identity on the loss; in backward, fixed gradients for the other inputs. They were
    computed by earlier backward passes of the same accumulation cycle (the same loss scale),
    so they are added as they are, whatever gradient reaches the loss."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, grads: tuple[torch.Tensor, ...], *outputs: Any):
        ctx.grads = grads
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grads, ctx.grads = ctx.grads, None
        return (grad, None, *grads)


PassOf = Callable[["SequenceBatch", torch.Tensor], PromptPass]
"""A model's prompt pass of some rows of a batch: `Policy.prompt_pass`, `Critic.prompt_pass`, a
reference's, or the same through a DeepSpeed engine (`through_engine`)."""


class MinibatchPrompts:
    """One minibatch's prompt pass as its micro-batches read it, the one object every caller uses
    (scoring, the reference, the critic's values, the update's policy and critic): the pass itself
    (none when the plan has none), the micro-batches in plan order, which of them is last, and
    the gradients the earlier ones leave for the last one's backward to carry."""

    def __init__(self, prompt_pass: PromptPass | None, micro_batch_rows: list[torch.Tensor]):
        self.prompt_pass = prompt_pass
        self.micro_batch_rows = micro_batch_rows

    @classmethod
    def run(
        cls,
        pass_of: PassOf,
        batch: SequenceBatch,
        rows: torch.Tensor,
        micro_batch_rows: list[torch.Tensor],
        enabled: bool,
    ) -> MinibatchPrompts:
        """The distinct prompts of `rows` run once through `pass_of` when `enabled` (the plan
        has a prompt pass and the model reads one); otherwise every micro-batch keeps its
        prompts in its own rows."""
        prompt_pass = pass_of(batch, rows) if enabled else None
        return cls(prompt_pass, micro_batch_rows)

    @property
    def tokens(self) -> int:
        """The prompt tokens the pass ran (0 without one)."""
        return 0 if self.prompt_pass is None else self.prompt_pass.tokens

    def last(self, index: int) -> bool:
        """Whether micro-batch `index` is the minibatch's last: the one that reads the pass's
        outputs themselves, and whose backward runs the pass's."""
        return index == len(self.micro_batch_rows) - 1

    def read(self, index: int) -> ExternalPrompts | None:
        """What micro-batch `index` reads (None: no pass, its prompts are in its rows)."""
        if self.prompt_pass is None:
            return None
        return self.prompt_pass.for_rows(self.micro_batch_rows[index], self.last(index))

    def carry_grads(self, index: int, loss: torch.Tensor) -> torch.Tensor:
        """Micro-batch `index`'s loss, the same value; on the last micro-batch its backward also
        carries the earlier micro-batches' gradients into the prompt pass."""
        if self.prompt_pass is None or not self.last(index):
            return loss
        return self.prompt_pass.with_grads(loss)


def through_engine(engine: Any) -> PassOf:
    """The prompt pass of the model a DeepSpeed engine wraps, as a call of the engine: the engine's
    forward and ZeRO-3's hooks see it as they see every forward (so the module's `forward` takes
    `prompt_pass_rows` besides scoring)."""
    return lambda batch, rows: engine(batch, prompt_pass_rows=rows)


def reads_prompt_pass(module: torch.nn.Module) -> bool:
    """Whether `module` (a policy or a critic) can read a prompt pass: its `decoder` packs
    sequences (model.packing, a decoder that supports it) with shared prompts."""
    decoder = getattr(module, "decoder", None)
    return bool(
        getattr(module, "packing", False)
        and getattr(module, "share_prompts", False)
        and decoder is not None
        and supports_packing(decoder)
    )


def run_prompt_pass(
    model: PreTrainedModel, batch: SequenceBatch, rows: torch.Tensor, embedding: torch.nn.Module
) -> PromptPass:
    """The distinct prompts of `rows` (host indices into `batch`) through `model`'s decoder,
    one packed row; `embedding` is its input embedding. With gradient recording on, the result
    has leaves for the micro-batches before the last. Checkpointing is the caller's (the layers'
    own flags, as for any forward)."""
    width = batch.prompt_width
    device = batch.input_ids.device
    index = rows.to(device)
    ids = batch.input_ids.index_select(0, index)[:, :width]
    mask = batch.attention_mask.index_select(0, index)[:, :width]
    first, owner = batch.distinct_prompts(rows)
    ids, mask = ids.index_select(0, first), mask.index_select(0, first)
    positions = batch.position_ids.index_select(0, index)[:, :width].index_select(0, first)
    layout = pack(mask, positions, width, owners=None)
    capture = KeyCapture()
    layout = dataclasses.replace(layout, capture=capture)
    grad = torch.is_grad_enabled()
    with layers_in_train_mode(model, checkpointing_on(model) and grad):
        hidden = packed_forward(model, layout, embedding(ids))[:-1]  # without the zero row
    layers = len(capture.keys)
    outputs = (
        *(capture.keys[layer] for layer in range(layers)),
        *(capture.values[layer] for layer in range(layers)),
        hidden,
    )
    host = torch.cat([mask.sum(dim=1), owner]).tolist()  # one host sync
    starts = list(itertools.accumulate(host[: len(first)], initial=0))
    start_of_row = {
        row: starts[prompt] for row, prompt in zip(rows.tolist(), host[len(first) :], strict=True)
    }
    leaves = None
    if grad:
        leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in outputs)
    return PromptPass(outputs, layers, start_of_row, leaves)
