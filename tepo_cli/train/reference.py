"""The frozen reference policy of the KL term (algo.beta > 0).

Full fine-tuning keeps a frozen copy of the LM as it was at the start. With LoRA the base weights
never change, so the reference is the policy itself with its adapters switched off: no second
copy of the weights (docs/objectives.md §0.6).
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.lora import adapters_off
from tepo_cli.train.policy import Policy, Scores


class Reference(Protocol):
    """Scores completions with the reference policy's log-probs (no gradient)."""

    def __call__(self, batch: SequenceBatch, temperature: float) -> Scores: ...


class AdaptersOff:
    """The LoRA policy's base model: the same modules, the adapters switched off for the call."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @torch.no_grad()
    def __call__(self, batch: SequenceBatch, temperature: float) -> Scores:
        with adapters_off(self.policy.lm):
            return self.policy(batch, temperature)


def build_reference(cfg: TrainConfig, policy: Policy) -> Reference | None:
    """None without a KL term to a reference (`algo.needs_ref`)."""
    if not cfg.algo.needs_ref:
        return None
    if policy.adapted:
        return AdaptersOff(policy)
    return frozen_copy(policy, cfg)


def frozen_copy(policy: Policy, cfg: TrainConfig) -> Policy:
    """A frozen copy of the policy's LM (never of its MTP modules)."""
    reference = Policy(
        copy.deepcopy(policy.lm),
        cfg.kernel,
        share_prompts=policy.share_prompts,
        packing=policy.packing,
    )
    reference.eval()
    reference.requires_grad_(False)
    return reference
