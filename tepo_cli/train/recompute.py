"""Gradient checkpointing per micro-batch (`model.gradient_checkpointing`).

The token budget (`trainer.micro_batch_tokens`, micro_batches.py) bounds a micro-batch's
activations, except for a single row longer than the budget, which runs alone: with 2,048-token
answers that row, not the budget, would set the update's peak memory. `auto` (the default)
checkpoints exactly those micro-batches (each layer keeps only its input and recomputes the rest
in backward), so memory follows the budget whatever the answer length, and micro-batches within
it pay nothing: on the long job, checkpointing every micro-batch at the default budget cost
update time and saved nothing at the peak (docs/guides/performance.md, "Long answers"). `true`
checkpoints every micro-batch (set once, at load), `false` none.

A prompt pass (the minibatch's prompts run once for all its micro-batches, models/prompt_pass.py)
is checkpointed under `auto` and `true` (`prompt_pass_checkpointed`).

Under ZeRO-3 a recomputed layer gathers its parameters again in backward, a collective: the ranks
agree which micro-batches are checkpointed (one all-reduce MAX per minibatch), so micro-batch i is
checkpointed on every rank or on none.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from tepo_cli.config.auto_bool import AutoBool
from tepo_cli.core import collective
from tepo_cli.models.lora import recompute_context
from tepo_cli.train.micro_batches import Plan


def over_budget(costs: list[int], mode: AutoBool, budget: int | None) -> list[bool]:
    """Which micro-batches (by their real-token `costs`, the same count on every rank) this step
    checkpoints on top of the load-time setting: with `auto`, those over `budget` on any rank."""
    own = [mode == "auto" and budget is not None and cost > budget for cost in costs]
    if not collective.multi_rank() or mode != "auto":
        return own
    flags = collective.all_max(torch.tensor(own, dtype=torch.int64, device="cpu"))
    return [bool(flag) for flag in flags.tolist()]


def checkpoint_plan(plan: Plan, mode: AutoBool, budget: int | None) -> list[bool]:
    """`over_budget` for the micro-batches of `plan` (by their real tokens as they run)."""
    if mode != "auto" or budget is None or plan.costs is None:
        return [False] * len(plan.rows)
    return over_budget(plan.costs, mode, budget)


def prompt_pass_checkpointed(mode: AutoBool) -> bool:
    """A prompt pass (models/prompt_pass.py) is kept from the first micro-batch of its minibatch
    to the last, beside each micro-batch's activations, which the budget alone should bound: its
    layers are checkpointed (recomputed once, in the last backward) unless checkpointing is off."""
    return mode is not False


@contextlib.contextmanager
def checkpointed(lm: PreTrainedModel, enabled: bool) -> Iterator[None]:
    """`lm`'s layers checkpointed (non-reentrant) for what runs inside — a micro-batch's forward
    and backward — and as they were after. The layers' own flags are set, as transformers'
    `gradient_checkpointing_enable` does, without its input-gradient hook, which would be added
    again at every call (non-reentrant checkpointing does not need it); a recomputed layer
    applies its dropout as in the forward (`recompute_context`, models/lora.py)."""
    if not enabled:
        yield
        return
    modules = [m for m in lm.modules() if hasattr(m, "gradient_checkpointing")]
    before = [
        (m.gradient_checkpointing, getattr(m, "_gradient_checkpointing_func", None))
        for m in modules
    ]
    recompute = functools.partial(checkpoint, use_reentrant=False, context_fn=recompute_context(lm))
    for module in modules:
        module._gradient_checkpointing_func = recompute
        module.gradient_checkpointing = True
    try:
        yield
    finally:
        for module, (flag, func) in zip(modules, before, strict=True):
            module.gradient_checkpointing = flag
            if func is None:
                del module._gradient_checkpointing_func
            else:
                module._gradient_checkpointing_func = func
