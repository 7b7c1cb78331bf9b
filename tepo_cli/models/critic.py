"""The critic of PPO (`advantage=gae`, docs/objectives.md §0.1): the policy's architecture with a
scalar value head.

V(s_t) is read at the same position as the policy's log-prob of completion token t — the state
that emits it — from the decoder's final hidden state through a linear head. The decoder starts as
a copy of the policy's (or is loaded from `advantage.critic_path`); the head is a
token-classification-style linear layer initialised N(0, initializer_range) with a zero bias, as
verl's value model (a `...ForTokenClassification` with one label). Saved as a Hugging Face
decoder directory plus `value_head.safetensors`, which `from_path` reads back.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, overload

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from tepo_cli.models.packing import ExternalPrompts
from tepo_cli.models.prompt_pass import PromptPass, run_prompt_pass
from tepo_cli.models.sequence_hidden import sequence_hidden

if TYPE_CHECKING:
    from tepo_cli.core.sequences import SequenceBatch

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueHead(nn.Linear):
    """The value head, computed in float32 (at least) whatever the decoder's dtype.

    A bf16 V would carry 8 significant bits into the value loss and GAE's temporal differences
    (V ≈ 0.5 is known to ±0.002). In a bf16 DeepSpeed engine the stored weights are bf16 (the
    engine casts the whole module) with float32 master weights and moments; the product itself
    is float32 here. Called as a module, so ZeRO-3 gathers its weights as for any layer.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(self.weight.dtype, torch.float32)
        bias = None if self.bias is None else self.bias.to(dtype)
        return nn.functional.linear(hidden.to(dtype), self.weight.to(dtype), bias)


class Critic(nn.Module):
    """`backbone` is a decoder (a transformers base model); `forward` returns values [N, T]."""

    def __init__(
        self, backbone: PreTrainedModel, share_prompts: bool = True, packing: bool = False
    ) -> None:
        super().__init__()
        self.backbone = backbone.eval()  # no dropout: V_old and V see the same function
        self.share_prompts = share_prompts
        self.packing = packing  # real tokens only, in one row (models/packing.py)
        reference = next(backbone.parameters())
        self.value_head = ValueHead(
            backbone.config.hidden_size,
            1,
            dtype=torch.promote_types(reference.dtype, torch.float32),
            device=reference.device,
        )
        std = getattr(backbone.config, "initializer_range", 0.02)
        with torch.no_grad():
            self.value_head.weight.normal_(0.0, std)
            self.value_head.bias.zero_()

    @property
    def decoder(self) -> PreTrainedModel:
        """The transformers model whose decoder stack runs the sequences."""
        return self.backbone

    @classmethod
    def from_policy(
        cls, lm: PreTrainedModel, share_prompts: bool = True, packing: bool = False
    ) -> Critic:
        """A critic whose decoder is a copy of the policy's (its LM head is not copied)."""
        return cls(copy.deepcopy(lm.base_model), share_prompts, packing)

    @classmethod
    def from_path(
        cls,
        path: str,
        dtype: torch.dtype,
        device: torch.device,
        share_prompts: bool = True,
        trust_remote_code: bool = False,
        packing: bool = False,
    ) -> Critic:
        """A decoder from a saved model (a causal LM's or a critic's directory, or a hub id), and
        the value head saved beside it when there is one (a fresh head otherwise)."""
        backbone = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        critic = cls(backbone.to(device), share_prompts, packing)
        head = Path(path) / VALUE_HEAD_FILE
        if head.is_file():
            critic.value_head.load_state_dict(load_file(head, device=str(device)))
        return critic

    def prompt_pass(self, batch: SequenceBatch, rows: torch.Tensor) -> PromptPass:
        """The distinct prompts of `rows` run once, for the micro-batches that read them
        (models/prompt_pass.py)."""
        return self(batch, prompt_pass_rows=rows)

    @overload
    def forward(
        self, batch: SequenceBatch, prompts: ExternalPrompts | None = None
    ) -> torch.Tensor: ...

    @overload
    def forward(self, batch: SequenceBatch, *, prompt_pass_rows: torch.Tensor) -> PromptPass: ...

    def forward(
        self,
        batch: SequenceBatch,
        prompts: ExternalPrompts | None = None,
        prompt_pass_rows: torch.Tensor | None = None,
    ) -> torch.Tensor | PromptPass:
        """V at every completion position, [N, T] float32 (0 on padding). `prompts`: the rows'
        prompts from a prompt pass; `prompt_pass_rows` is `prompt_pass`'s way in, a call of the
        module as DeepSpeed's engine expects of every forward (models/prompt_pass.py)."""
        embedding = self.backbone.get_input_embeddings()
        if prompt_pass_rows is not None:
            return run_prompt_pass(self.backbone, batch, prompt_pass_rows, embedding)
        hidden = sequence_hidden(
            self.backbone,
            batch,
            embedding(batch.input_ids),
            self.share_prompts,
            full=False,
            packing=self.packing,
            prompts=prompts,
        )
        values = self.value_head(hidden).squeeze(-1).float()
        return torch.where(batch.completion_mask, values, 0.0)

    def save(self, target: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """The decoder with save_pretrained and the head beside it (`state_dict`: this module's,
        e.g. ZeRO-3's consolidated one; None reads the parameters)."""
        state = state_dict if state_dict is not None else self.state_dict()
        backbone = {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}
        head = {
            k[len("value_head.") :]: v.detach().cpu().contiguous()
            for k, v in state.items()
            if k.startswith("value_head.")
        }
        self.backbone.save_pretrained(target, state_dict=backbone)
        save_file(head, target / VALUE_HEAD_FILE)
