"""MPO's multi-token-prediction (MTP) modules, DeepSeek-V3 style (docs/objectives.md §1.5).

Depth n ≥ 2 predicts, from the state of anchor position i, the token n positions ahead:
  h^n_i = L_n( M_n [ RMSNorm(h^(n-1)_i) ; RMSNorm(Emb(x_(i+n-1))) ] ),   p^n_i = head_n(norm_n(h^n_i))
where h^1 is the backbone's final hidden state (it predicts x_(i+1)), Emb is the backbone's own
input embedding, L_n a causal transformer block over the positions (a copy of the backbone's last
decoder layer), M_n a projection 2H → H, norm_n + head_n a copy of the backbone's final norm and
LM head (or the backbone's head itself with `head=shared`). [our reading] M_n starts as
[I, 0] — the identity on the hidden part, zero on the embedding part (the paper does not say) —
and the two input norms start with unit weights.

Any Llama-style decoder from transformers carries them: the model types in `SUPPORTED`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from tepo_cli.config.schema import KernelConfig
from tepo_cli.models.logprob_head import LogprobHead

# Decoder-only models whose layers take (hidden, attention mask, position embeddings) and whose
# backbone exposes embed_tokens, layers, norm and rotary_emb, as Llama's does.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_BACKBONE_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def mtp_support_problem(model_type: str | None, lm: PreTrainedModel | None = None) -> str | None:
    """Why this model cannot carry MTP modules, or None when it can."""
    if model_type not in SUPPORTED:
        return (
            f"its architecture is '{model_type}', and tepo builds MTP modules for Llama-style "
            f"decoders only: {', '.join(SUPPORTED)} (SmolLM2, Llama 3, Mistral, Qwen2/2.5, Qwen3)"
        )
    if lm is not None:
        backbone = lm.base_model
        missing = [part for part in _BACKBONE_PARTS if not hasattr(backbone, part)]
        if missing or lm.get_output_embeddings() is None:
            parts = ", ".join(missing) or "an output embedding (lm_head)"
            return f"its backbone has no {parts}, which MTP modules are built from"
    return None


class MtpDepth(nn.Module):
    """One MTP module: h^n from h^(n-1) and the embedding of the token before its target."""

    def __init__(self, lm: PreTrainedModel, head: LogprobHead | None) -> None:
        super().__init__()
        backbone = lm.base_model
        size = lm.config.hidden_size
        reference = next(backbone.parameters())
        self.hidden_norm = _fresh_norm(backbone.norm)
        self.embed_norm = _fresh_norm(backbone.norm)
        self.project = nn.Linear(
            2 * size, size, bias=False, dtype=reference.dtype, device=reference.device
        )
        with torch.no_grad():
            self.project.weight.zero_()
            self.project.weight[:, :size].copy_(torch.eye(size))
        self.block = copy.deepcopy(backbone.layers[-1])
        self.final_norm = copy.deepcopy(backbone.norm)
        self.head = head  # None: the policy's own head scores this depth (head=shared)

    def forward(
        self,
        previous: torch.Tensor,
        embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        combined = torch.cat([self.hidden_norm(previous), self.embed_norm(embeds)], dim=-1)
        return self.block(
            self.project(combined),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_ids=position_ids,
        )


class MtpStack(nn.Module):
    """Depths 2..K on top of a backbone; `forward` returns each depth's hidden states [N, S, H]."""

    def __init__(self, lm: PreTrainedModel, depths: int, head: str, kernel: KernelConfig) -> None:
        super().__init__()
        problem = mtp_support_problem(getattr(lm.config, "model_type", None), lm)
        if problem is not None:
            raise ValueError(problem)
        if depths < 1:
            raise ValueError(f"an MTP stack needs at least one depth, got {depths}")
        lm_head = lm.get_output_embeddings()
        self.head_mode = head
        self.depths = nn.ModuleList(
            MtpDepth(lm, LogprobHead.copy_of(lm_head, kernel) if head == "copy" else None)
            for _ in range(depths)
        )

    def forward(
        self,
        lm: PreTrainedModel,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        backbone_grad: bool = True,
    ) -> list[torch.Tensor]:
        """hidden: [N, S, H] the backbone's final hidden states at positions 0..S-1 (position i
        predicts input_ids[:, i + 1]); input_ids, attention_mask, position_ids: [N, >= S + 1].
        Returns [h^2, ..., h^K], each [N, S, H]: h^n at position i predicts input_ids[:, i + n].
        Positions whose inputs run past the sequence read a filler token; causal attention keeps
        them from every earlier position, and they predict nothing that exists.
        `backbone_grad=False` detaches the backbone's hidden states and embeddings, so the
        modules' outputs send no gradient into the backbone.
        """
        backbone = lm.base_model
        width = hidden.shape[1]
        mask = attention_mask[:, :width]
        positions = position_ids[:, :width]
        previous = hidden if backbone_grad else hidden.detach()
        position_embeddings = backbone.rotary_emb(previous, position_ids=positions)
        masks: dict[str, torch.Tensor | None] = {}
        outputs = []
        for offset, depth in enumerate(self.depths, start=1):
            tokens = input_ids[:, offset : offset + width]
            if tokens.shape[1] < width:
                filler = tokens.new_zeros(tokens.shape[0], width - tokens.shape[1])
                tokens = torch.cat([tokens, filler], dim=1)
            embeds = backbone.embed_tokens(tokens)
            if not backbone_grad:
                embeds = embeds.detach()
            kind = getattr(depth.block, "attention_type", "full_attention")
            if kind not in masks:
                make = (
                    create_sliding_window_causal_mask
                    if kind == "sliding_attention"
                    else create_causal_mask
                )
                masks[kind] = make(
                    config=lm.config,
                    inputs_embeds=previous,
                    attention_mask=mask,
                    past_key_values=None,
                    position_ids=positions,
                )
            previous = depth(previous, embeds, masks[kind], position_embeddings, positions)
            outputs.append(previous)
        return outputs

    def parameter_count(self) -> int:
        """Parameters of the modules (their full size also while ZeRO-3 partitions them)."""
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.parameters())


def _fresh_norm(norm: nn.Module) -> nn.Module:
    """A copy of the backbone's RMSNorm class and epsilon, with unit weights."""
    fresh = copy.deepcopy(norm)
    with torch.no_grad():
        fresh.weight.fill_(1.0)
    return fresh
