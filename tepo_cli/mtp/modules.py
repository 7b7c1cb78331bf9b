"""MPO's multi-token-prediction (MTP) modules, DeepSeek-V3 style (docs/objectives.md §1.5).

Depth n ≥ 2 predicts, from the state of anchor position i, the token n positions ahead:
  h^n_i = L_n( M_n [ RMSNorm(h^(n-1)_i) ; RMSNorm(Emb(x_(i+n-1))) ] ),   p^n_i = head_n(norm_n(h^n_i))
where h^1 is the backbone's final hidden state (it predicts x_(i+1)), Emb is the backbone's own
input embedding, L_n a causal transformer block over the positions (a copy of the backbone's last
decoder layer), M_n a projection 2H → H, norm_n + head_n a copy of the backbone's final norm and
LM head (or the backbone's head itself with `head=shared`). [our reading] M_n starts as
[I, 0] — the identity on the hidden part, zero on the embedding part (the paper does not say) —
and the two input norms start with unit weights.

Any Llama-style decoder from transformers carries them: the model types in `support.py`'s `SUPPORTED`. The
policy holds the stack as its attached modules (models/policy.py): it calls `score` for the
quantity the stack names (`mtp_logp`), and the stack's weights keep the `mtp.` prefix in every
checkpoint and state dict.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from tepo_cli.algos.algo_config import MtpConfig
from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.cache_key import with_cache
from tepo_cli.models.logprob_head import LogprobHead
from tepo_cli.models.policy import scatter_valid
from tepo_cli.models.shared_prompts import gather_rows
from tepo_cli.mtp.files import FILE, save_mtp_modules
from tepo_cli.mtp.prediction_loss import mtp_metrics, mtp_prediction_loss, mtp_present
from tepo_cli.mtp.support import mtp_support_problem


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
            self.project.weight[:, :size].copy_(torch.eye(size, device=self.project.weight.device))
        self.block = copy.deepcopy(backbone.layers[-1])
        self.block.self_attn.layer_idx = 0  # the only layer of its own KV cache (shared prompts)
        self.final_norm = copy.deepcopy(backbone.norm)
        self.head = head  # None: the policy's own head scores this depth (head=shared)

    @property
    def attention_type(self) -> str:
        return getattr(self.block, "attention_type", "full_attention")

    def combine(self, previous: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """M_n [RMSNorm(h^(n-1)); RMSNorm(Emb(x))]: the block's input."""
        return self.project(
            torch.cat([self.hidden_norm(previous), self.embed_norm(embeds)], dim=-1)
        )

    def forward(
        self,
        previous: torch.Tensor,
        embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        position_ids: torch.Tensor,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        return self.block(
            self.combine(previous, embeds),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_ids=position_ids,
            **with_cache(cache),
            use_cache=cache is not None,
        )


class MtpStack(nn.Module):
    """Depths 2..K on top of a backbone; `forward` returns each depth's hidden states [N, S, H],
    `score` their log-probs of the completion tokens. `config` (algo.mtp) says how they train."""

    state_prefix = "mtp"  # the policy's attribute, so every checkpoint's keys are `mtp.*`
    scores = "mtp_logp"  # what `score` makes, by the name the objective reads it

    def __init__(
        self,
        lm: PreTrainedModel,
        depths: int,
        head: str,
        kernel: KernelConfig,
        config: MtpConfig | None = None,
    ) -> None:
        super().__init__()
        self.config = config or MtpConfig()
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
        prompts: SharedPrompts | None = None,
        embedded: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """hidden: [N, S, H] the backbone's final hidden states at positions 0..S-1 (position i
        predicts input_ids[:, i + 1]); input_ids, attention_mask, position_ids: [N, >= S + 1].
        Returns [h^2, ..., h^K], each [N, S, H]: h^n at position i predicts input_ids[:, i + n].
        Positions whose inputs run past the sequence read a filler token; causal attention keeps
        them from every earlier position, and they predict nothing that exists.
        `backbone_grad=False` detaches the backbone's hidden states and embeddings, so the
        modules' outputs send no gradient into the backbone. `prompts` (rows that repeat a
        prompt): depth n's first P − n + 1 positions see only prompt tokens, so they run once per
        distinct prompt, as the backbone's prompts do (models/shared_prompts.py). `embedded`
        [N, >= S + 1, H]: the sequence's input embeddings when the caller has them already.
        """
        backbone = lm.base_model
        width = hidden.shape[1]
        inputs = _DepthInputs(lm, attention_mask[:, :width], position_ids[:, :width], prompts)
        previous = hidden if backbone_grad else hidden.detach()
        # One embedding lookup serves every depth (each reads a shifted slice): each lookup's
        # backward is a dense [vocab, hidden] gradient, the largest tensor of a small model.
        depths = len(self.depths)
        if embedded is None:
            embedded = backbone.embed_tokens(input_ids)
        embedded = embedded[:, 1 : width + depths]  # depth n at position i reads x[i + n - 1]
        missing = width + depths - 1 - embedded.shape[1]
        if missing > 0:  # past the sequence's end: a filler nothing reads
            filler = embedded.new_zeros(embedded.shape[0], missing, embedded.shape[2])
            embedded = torch.cat([embedded, filler], dim=1)
        if not backbone_grad:
            embedded = embedded.detach()
        outputs = []
        for offset, depth in enumerate(self.depths, start=1):
            embeds = embedded[:, offset - 1 : offset - 1 + width]
            previous = inputs.run(depth, previous, embeds, shared=inputs.shared_width(offset))
            outputs.append(previous)
        return outputs

    def parameter_count(self) -> int:
        """Parameters of the modules (their full size also while ZeRO-3 partitions them)."""
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.parameters())

    def work(self, lm: PreTrainedModel) -> tuple[int, int, float]:
        """What the modules add to a step's FLOPs (train/flops.py): (matmul weights a position
        multiplies by, decoder layers, FLOPs per weight and position). Each depth runs every
        position again: its decoder layer, input projection and LM head (its own copy, or the
        backbone's with mtp.head=shared, counted once per depth); 6 when the modules train, 4
        when they are frozen but pass the gradient to the backbone, 2 when nothing flows back."""
        depths = len(self.depths)
        params = self.parameter_count()
        if self.head_mode == "shared":  # the backbone's head, applied once more per depth
            weight = lm.get_output_embeddings().weight
            params += depths * int(getattr(weight, "ds_numel", weight.numel()))
        if any(p.requires_grad for p in self.parameters()):
            passes = 6.0
        else:
            passes = 4.0 if self.config.backbone_grad else 2.0
        return params, depths, passes

    @property
    def trainable(self) -> bool:
        """Whether the RL steps train the modules (`mtp.trainable`); frozen ones are warmed up
        once, and a checkpoint keeps them like any weight."""
        return self.config.trainable

    def score(
        self,
        policy: Any,
        batch: SequenceBatch,
        hidden: torch.Tensor,
        temperature: float,
        backbone_grad: bool | None = None,
        embedded: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """[N, T, K−1] depth n's log-prob of completion token t + n − 1 at anchor column t, and
        each depth's hidden states; `hidden` from the policy's `backbone_hidden`, scored by its
        head (a shared one) or each depth's own. `backbone_grad` overrides
        `mtp.backbone_grad` (the warm-up keeps the backbone out of the graph)."""
        if backbone_grad is None:
            backbone_grad = self.config.backbone_grad
        prompts = None
        if policy.share_prompts:
            width = batch.prompt_width
            first, owner = batch.distinct_prompts()
            prompts = SharedPrompts(first, owner, width)
        depth_hidden = self(
            policy.lm,
            hidden,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            backbone_grad=backbone_grad,
            prompts=prompts,
            embedded=embedded,
        )
        valid = batch.completion_mask
        width = valid.shape[1]
        completion = batch.completion_ids[:, :width]
        columns = []
        present_all = mtp_present(valid, len(self.depths))
        pairs = zip(self.depths, depth_hidden, strict=True)
        for offset, (depth, states) in enumerate(pairs, start=1):
            # Anchor column t scores completion token t + offset, present only if that token is.
            present = present_all[..., offset - 1]
            targets = torch.zeros_like(completion)
            targets[:, : width - offset] = completion[:, offset:]
            anchors = states[:, batch.prompt_width - 1 :]
            # A shared head is the backbone's own: it learns from the MTP terms only with them.
            shared = depth.head is None
            head = policy.head if shared else depth.head
            logp, _ = head(
                depth.final_norm(anchors[present]),
                targets[present],
                temperature,
                False,
                weight_grad=backbone_grad or not shared,
            )
            columns.append(scatter_valid(present, logp))
        return torch.stack(columns, dim=-1), depth_hidden

    def save_beside_final(self, engine: Any, cfg: Any, run_dir: Any, topo: Any) -> dict[str, str]:
        """At the end of a run, beside final/ (files.py); their path for the summary. Collective:
        every rank calls it."""
        save_mtp_modules(engine, cfg, run_dir / FILE, topo)
        return {"mtp_modules": str(run_dir / FILE)}

    def objective_terms(
        self, loss: torch.Tensor, metrics: dict[str, float], scores: Any, batch: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """A micro-batch's objective with the modules' metrics from the forward's `scores`, and
        their auxiliary prediction loss over the step's tokens when `mtp.aux_coef` > 0."""
        mtp_logp, settings = scores[self.scores], self.config
        metrics = {**metrics, **mtp_metrics(mtp_logp.detach(), scores.logp.detach(), batch.mask)}
        if settings.aux_coef <= 0:
            return loss, metrics
        alpha_decay = settings.warmup.alpha_decay
        aux = mtp_prediction_loss(mtp_logp, batch.mask, alpha_decay, batch.num_tokens)
        metrics["mtp_aux_loss"] = float(aux.detach())
        return loss + settings.aux_coef * aux, metrics


def attach(depths: int, config: MtpConfig) -> Callable[[PreTrainedModel, KernelConfig], MtpStack]:
    """What the policy calls, as it is built, to attach `depths` MTP modules (`Policy(attach=)`):
    after its own head, so the modules' weights follow it in every parameter order."""

    def build(lm: PreTrainedModel, kernel: KernelConfig) -> MtpStack:
        stack = MtpStack(lm, depths, config.head, kernel, config).eval()
        if not config.trainable:
            stack.requires_grad_(False)
        return stack

    return build


@dataclass(frozen=True)
class SharedPrompts:
    """Rows that repeat a prompt: `first` row of each distinct prompt, each row's `owner`, and
    the prompt width P (prompts left-padded to it)."""

    first: torch.Tensor
    owner: torch.Tensor
    width: int


class _DepthInputs:
    """Masks and rotary embeddings of the depths' positions, built once per call and shared."""

    def __init__(
        self,
        lm: PreTrainedModel,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        prompts: SharedPrompts | None,
    ) -> None:
        self.lm, self.mask, self.positions, self.prompts = lm, attention_mask, position_ids, prompts
        self._masks: dict[str, torch.Tensor | None] = {}

    def shared_width(self, offset: int) -> int:
        """Positions of depth offset + 1 that depend on prompt tokens only: P − offset."""
        if self.prompts is None or len(self.prompts.first) == len(self.prompts.owner):
            return 0
        return max(0, self.prompts.width - offset)

    def run(
        self, depth: MtpDepth, previous: torch.Tensor, embeds: torch.Tensor, shared: int
    ) -> torch.Tensor:
        if shared == 0 or depth.attention_type != "full_attention":
            return depth(
                previous,
                embeds,
                self._mask(depth.attention_type, previous),
                self._rotary(previous, self.positions),
                self.positions,
            )
        assert self.prompts is not None
        first, owner = self.prompts.first, self.prompts.owner
        cache = DynamicCache(config=self.lm.config)
        head_positions = self.positions[first, :shared]
        head_in = previous[first, :shared]
        head = depth(
            head_in,
            embeds[first, :shared],
            create_causal_mask(
                config=self.lm.config,
                inputs_embeds=head_in,
                attention_mask=self.mask[first, :shared],
                **with_cache(None),
                position_ids=head_positions,
            ),
            self._rotary(head_in, head_positions),
            head_positions,
            cache=cache,
        )
        gather_rows(cache, owner)
        tail_positions = self.positions[:, shared:]
        tail_in = previous[:, shared:]
        tail = depth(
            tail_in,
            embeds[:, shared:],
            create_causal_mask(
                config=self.lm.config,
                inputs_embeds=tail_in,
                attention_mask=self.mask,
                **with_cache(cache),
                position_ids=tail_positions,
            ),
            self._rotary(tail_in, tail_positions),
            tail_positions,
            cache=cache,
        )
        return torch.cat([head.index_select(0, owner), tail], dim=1)

    def _rotary(self, like: torch.Tensor, positions: torch.Tensor):
        return self.lm.base_model.rotary_emb(like, position_ids=positions)

    def _mask(self, kind: str, like: torch.Tensor) -> torch.Tensor | None:
        if kind not in self._masks:
            make = (
                create_sliding_window_causal_mask
                if kind == "sliding_attention"
                else create_causal_mask
            )
            self._masks[kind] = make(
                config=self.lm.config,
                inputs_embeds=like,
                attention_mask=self.mask,
                **with_cache(None),
                position_ids=self.positions,
            )
        return self._masks[kind]


def _fresh_norm(norm: nn.Module) -> nn.Module:
    """A copy of the backbone's RMSNorm class and epsilon, with unit weights."""
    fresh = copy.deepcopy(norm)
    with torch.no_grad():
        fresh.weight.fill_(1.0)
    return fresh
