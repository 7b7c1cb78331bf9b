"""The frozen reference policy of the KL term (algo.beta > 0).

Full fine-tuning keeps a frozen copy of the LM as it was at the start; under ZeRO-3
(`deepspeed=zero3`) that copy is a partitioned inference engine (DeepSpeed stage 3 without an
optimizer, as verl and OpenRLHF keep theirs), so each rank holds 1/world of its weights and the
engine gathers a layer's around its forward. With LoRA the base weights never change, so the
reference is the policy itself with its adapters switched off: no second copy of the weights
(docs/objectives.md §0.6).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.library_warnings import library_prints_to_log
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.lora import adapters_off
from tepo_cli.models.packing import ExternalPrompts
from tepo_cli.models.policy import Policy, Scores
from tepo_cli.models.prompt_pass import PromptPass, through_engine


class Reference(Protocol):
    """Scores completions with the reference policy's log-probs (no gradient); `prompts` and
    `prompt_pass` as for `Policy` (a prompt pass of the reference's own)."""

    def __call__(
        self,
        batch: SequenceBatch,
        temperature: float = 1.0,
        prompts: ExternalPrompts | None = None,
    ) -> Scores: ...

    def prompt_pass(self, batch: SequenceBatch, rows: torch.Tensor) -> PromptPass: ...


class AdaptersOff:
    """The LoRA policy's base model: the same modules, the adapters switched off for the call."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @torch.no_grad()
    def __call__(
        self,
        batch: SequenceBatch,
        temperature: float = 1.0,
        prompts: ExternalPrompts | None = None,
    ) -> Scores:
        with adapters_off(self.policy.lm):
            return self.policy(batch, temperature, prompts=prompts)

    @torch.no_grad()
    def prompt_pass(self, batch: SequenceBatch, rows: torch.Tensor) -> PromptPass:
        with adapters_off(self.policy.lm):
            return self.policy.prompt_pass(batch, rows)


class PartitionedReference:
    """A frozen copy of the policy under a ZeRO-3 inference engine: each rank keeps its slice of
    every weight, gathered layer by layer around the forward (a collective: every rank scores
    the same number of micro-batches, as for the policy)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @torch.no_grad()
    def __call__(
        self,
        batch: SequenceBatch,
        temperature: float = 1.0,
        prompts: ExternalPrompts | None = None,
    ) -> Scores:
        return self.engine(batch, temperature, prompts=prompts)

    @torch.no_grad()
    def prompt_pass(self, batch: SequenceBatch, rows: torch.Tensor) -> PromptPass:
        return through_engine(self.engine)(batch, rows)


def build_reference(
    cfg: TrainConfig,
    policy: Policy,
    world: int = 1,
    load_lm: Callable[[], PreTrainedModel | None] | None = None,
) -> Reference | None:
    """None without a KL term to a reference (`algo.needs_ref`). `load_lm` loads the reference's
    LM anew (already partitioned under ZeRO-3) when the policy's cannot be copied whole; when it
    returns None (or is not given), the reference is a copy of the policy's LM."""
    if not cfg.algo.needs_ref:
        return None
    if policy.adapted:
        return AdaptersOff(policy)
    lm = load_lm() if load_lm is not None else None
    frozen = frozen_copy(policy, cfg) if lm is None else _frozen(lm, policy, cfg)
    if cfg.deepspeed.stage == 3:
        return PartitionedReference(partitioned_engine(frozen, cfg, world))
    return frozen


def partitioned_engine(module: torch.nn.Module, cfg: TrainConfig, world: int) -> Any:
    """`module` under a ZeRO-3 engine with no optimizer (DeepSpeed's ZeRO inference): its
    parameters are partitioned over the ranks when this returns."""
    from tepo_cli.core.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()

    dtype = next(module.parameters()).dtype
    zero: dict[str, Any] = {"stage": 3}
    if cfg.deepspeed.offload_param != "none":
        zero["offload_param"] = {"device": cfg.deepspeed.offload_param}
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16},
        "steps_per_print": 10**9,
    }
    with library_prints_to_log():
        engine, *_ = deepspeed.initialize(model=module, config=config)
    return engine


def frozen_copy(policy: Policy, cfg: TrainConfig) -> Policy:
    """A frozen copy of the policy's LM (never of its attached modules)."""
    return _frozen(copy.deepcopy(policy.lm), policy, cfg)


def _frozen(lm: PreTrainedModel, policy: Policy, cfg: TrainConfig) -> Policy:
    reference = Policy(
        lm,
        cfg.kernel,
        share_prompts=policy.share_prompts,
        packing=policy.packing,
        truncation=policy.truncation,
    )
    reference.eval()
    reference.requires_grad_(False)
    return reference
