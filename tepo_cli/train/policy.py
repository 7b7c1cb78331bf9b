"""The policy as tepo trains it: a causal LM whose log-probs go through the kernel path.

The backbone returns hidden states; `LogprobHead` turns them into token log-probs (and
entropies) with the lm-head weight inside `token_logprobs`, chunk by chunk, only at response
positions — the full [tokens x vocab] logits are never built. With MPO's `future=mtp` the policy
also carries the MTP modules (models/mtp.py), scored through the same kernel path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from tepo_cli.algos.config import MtpConfig
from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels import token_entropy_terms
from tepo_cli.models.logprob_head import LogprobHead
from tepo_cli.models.mtp import MtpStack, SharedPrompts
from tepo_cli.models.mtp_loss import mtp_present
from tepo_cli.models.shared_prompts import distinct_prompts, prefill
from tepo_cli.train.sequences import SequenceBatch

MTP_PREFIX = "mtp."


@dataclass
class Scores:
    """What one scoring pass returns for N completions (all zero on padding).

    logp:         [N, T] log-probs of the completion tokens (with grad when enabled).
    entropy:      [N, T] entropies of the next-token distributions, or None.
    entropy_term: [N, T] S = Σ_j p_j²(log p_j + H), no grad (TEPO's first_order mask), or None.
    mtp_logp:     [N, T, K−1] MTP depth n's log-prob, at anchor column t, of completion token
                  t + n − 1 (0 where it does not exist), or None.
    """

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    entropy_term: torch.Tensor | None = None
    mtp_logp: torch.Tensor | None = None


class Policy(nn.Module):
    """`lm` is the transformers model (generation, saving); `forward` scores completions."""

    def __init__(
        self,
        lm: PreTrainedModel,
        kernel: KernelConfig,
        share_prompts: bool = True,
        mtp_depths: int = 0,
        mtp: MtpConfig | None = None,
    ) -> None:
        super().__init__()
        # Sampling and training must see the same function (ratio = 1 on-policy): no dropout.
        self.lm = lm.eval()
        self.head = LogprobHead.of(lm.get_output_embeddings(), kernel)
        self.share_prompts = share_prompts
        self.mtp_config = mtp or MtpConfig()
        self.mtp = (
            MtpStack(lm, mtp_depths, self.mtp_config.head, kernel).eval() if mtp_depths else None
        )
        if self.mtp is not None and not self.mtp_config.trainable:
            self.mtp.requires_grad_(False)

    def forward(
        self,
        batch: SequenceBatch,
        temperature: float,
        with_entropy: bool = False,
        with_entropy_term: bool = False,
        with_mtp: bool = False,
    ) -> Scores:
        """Score the completions of `batch` (see `Scores`); `with_mtp` needs the MTP modules."""
        if with_mtp and self.mtp is None:
            raise ValueError("with_mtp=True needs a policy built with MTP modules (mtp_depths)")
        checkpointing = self.lm.is_activation_checkpointing and torch.is_grad_enabled()
        # The sequence is embedded once for the backbone and the MTP modules: every lookup's
        # backward is a dense [vocab, hidden] gradient, the largest tensor of a small model.
        embedded = self.lm.get_input_embeddings()(batch.input_ids)
        if self.share_prompts and not checkpointing:
            hidden = self._shared_prompt_hidden(batch, embedded, full=with_mtp)
        else:
            hidden = self._hidden(batch, embedded, checkpointing, full=with_mtp)
        valid = batch.response_mask
        width = valid.shape[1]
        response_hidden = hidden[:, batch.prompt_width - 1 :] if with_mtp else hidden
        targets = batch.completion_ids[:, :width][valid]
        logp_flat, entropy_flat = self.head(
            response_hidden[valid], targets, temperature, with_entropy
        )
        scores = Scores(_scatter(valid, logp_flat))
        if entropy_flat is not None:
            scores.entropy = _scatter(valid, entropy_flat)
        if with_entropy_term:
            with torch.no_grad():
                _, _, term = token_entropy_terms(
                    response_hidden[valid].detach(),
                    self.head.weight.detach(),
                    targets,
                    temperature,
                    chunk_size=self.head.kernel.chunk_size,
                )
            scores.entropy_term = _scatter(valid, term)
        if with_mtp:
            scores.mtp_logp, _ = self.mtp_logprobs(batch, hidden, temperature, embedded=embedded)
        return scores

    def mtp_logprobs(
        self,
        batch: SequenceBatch,
        hidden: torch.Tensor,
        temperature: float,
        backbone_grad: bool | None = None,
        embedded: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """[N, T, K−1] depth n's log-prob of completion token t + n − 1 at anchor column t, and
        each depth's hidden states; `hidden` from `backbone_hidden`. `backbone_grad` overrides
        `mtp.backbone_grad` (the warm-up keeps the backbone out of the graph)."""
        assert self.mtp is not None
        if backbone_grad is None:
            backbone_grad = self.mtp_config.backbone_grad
        prompts = None
        if self.share_prompts:
            width = batch.prompt_width
            first, owner = distinct_prompts(
                batch.input_ids[:, :width], batch.attention_mask[:, :width]
            )
            prompts = SharedPrompts(first, owner, width)
        depth_hidden = self.mtp(
            self.lm,
            hidden,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            backbone_grad=backbone_grad,
            prompts=prompts,
            embedded=embedded,
        )
        valid = batch.response_mask
        width = valid.shape[1]
        completion = batch.completion_ids[:, :width]
        columns = []
        present_all = mtp_present(valid, len(self.mtp.depths))
        pairs = zip(self.mtp.depths, depth_hidden, strict=True)
        for offset, (depth, states) in enumerate(pairs, start=1):
            # Anchor column t scores completion token t + offset, present only if that token is.
            present = present_all[..., offset - 1]
            targets = torch.zeros_like(completion)
            targets[:, : width - offset] = completion[:, offset:]
            anchors = states[:, batch.prompt_width - 1 :]
            # A shared head is the backbone's own: it learns from the MTP terms only with them.
            shared = depth.head is None
            head = self.head if shared else depth.head
            logp, _ = head(
                depth.final_norm(anchors[present]),
                targets[present],
                temperature,
                False,
                weight_grad=backbone_grad or not shared,
            )
            columns.append(_scatter(present, logp))
        return torch.stack(columns, dim=-1), depth_hidden

    def backbone_hidden(self, batch: SequenceBatch) -> torch.Tensor:
        """[N, P + T − 1, H] the backbone's final hidden states at every position that predicts
        a token of the sequence (what the MTP modules read)."""
        embedded = self.lm.get_input_embeddings()(batch.input_ids)
        if self.share_prompts:
            return self._shared_prompt_hidden(batch, embedded, full=True)
        return self._hidden(batch, embedded, checkpointing=False, full=True)

    def _hidden(
        self, batch: SequenceBatch, embedded: torch.Tensor, checkpointing: bool, full: bool
    ) -> torch.Tensor:
        """Hidden states that predict each completion token, [N, T, H] (or, `full`, every
        position's but the last, [N, P + T − 1, H]); one pass per row."""
        with _layers_in_train_mode(self.lm, checkpointing):
            hidden = self.lm.base_model(
                inputs_embeds=embedded,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state
        width = batch.response_mask.shape[1]
        # The hidden state at column c predicts the token at column c + 1.
        start = 0 if full else batch.prompt_width - 1
        return hidden[:, start : batch.prompt_width - 1 + width]

    def _shared_prompt_hidden(
        self, batch: SequenceBatch, embedded: torch.Tensor, full: bool
    ) -> torch.Tensor:
        """As `_hidden`, with each distinct prompt run once (models/shared_prompts.py)."""
        prompt_width, width = batch.prompt_width, batch.response_mask.shape[1]
        first, owner = distinct_prompts(
            batch.input_ids[:, :prompt_width], batch.attention_mask[:, :prompt_width]
        )
        if len(first) == len(batch):
            return self._hidden(batch, embedded, checkpointing=False, full=full)
        prompt_hidden, cache = prefill(
            self.lm,
            batch.input_ids[first, :prompt_width],
            batch.attention_mask[first, :prompt_width],
            batch.position_ids[first, :prompt_width],
            owner,
            inputs_embeds=embedded.index_select(0, first)[:, :prompt_width],
        )
        # The last prompt position predicts the first completion token.
        # index_select: its backward (index_add_) sums the rows of a prompt in a fixed order.
        rows = prompt_hidden.index_select(0, owner)
        parts = [rows if full else rows[:, prompt_width - 1 :]]
        if width > 1:  # the last completion token predicts nothing that is scored
            stop = prompt_width + width - 1
            parts.append(
                self.lm.base_model(
                    inputs_embeds=embedded[:, prompt_width:stop],
                    attention_mask=batch.attention_mask[:, :stop],
                    position_ids=batch.position_ids[:, prompt_width:stop],
                    past_key_values=cache,
                    use_cache=True,
                ).last_hidden_state
            )
        return torch.cat(parts, dim=1)

    def hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This wrapper's state dict (e.g. ZeRO-3's consolidated one) with the LM's own keys."""
        return {key[3:]: value for key, value in state_dict.items() if key.startswith("lm.")}

    def mtp_state_dict(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The MTP modules' entries of this wrapper's state dict, keys without the prefix."""
        return {
            key[len(MTP_PREFIX) :]: value
            for key, value in state_dict.items()
            if key.startswith(MTP_PREFIX)
        }


@contextlib.contextmanager
def _layers_in_train_mode(lm: PreTrainedModel, enabled: bool) -> Iterator[None]:
    """transformers recomputes a layer in backward only while that layer is in train mode; the
    policy stays in eval mode (no dropout), so only the layers' own flags flip, for this pass."""
    layers = (
        [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)] if enabled else []
    )
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def _scatter(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(valid.shape, dtype=values.dtype, device=valid.device)
    return out.masked_scatter(valid, values)
