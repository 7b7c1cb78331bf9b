"""The policy as tepo trains it: a causal LM whose log-probs go through the kernel path.

The backbone returns hidden states; `LogprobHead` turns them into token log-probs (and
entropies) with the lm-head weight inside `token_logprobs`, chunk by chunk, only at response
positions — the full [tokens x vocab] logits are never built. With MPO's `future=mtp` the policy
also carries the MTP modules (models/mtp.py), scored through the same kernel path.
"""

from __future__ import annotations

from collections import UserDict
from collections.abc import Collection
from typing import overload

import torch
from torch import nn
from transformers import PreTrainedModel

from tepo_cli.algos.algo_config import MtpConfig
from tepo_cli.config.schema import KernelConfig, LoraConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.kernels.truncated import Truncation
from tepo_cli.models.logprob_head import LogprobHead
from tepo_cli.models.lora import add_adapters, dropout_in_training, lora_dropouts
from tepo_cli.models.mtp import MtpStack, SharedPrompts
from tepo_cli.models.mtp_loss import mtp_present
from tepo_cli.models.packing import ExternalPrompts
from tepo_cli.models.prompt_pass import PromptPass, run_prompt_pass
from tepo_cli.models.sequence_hidden import sequence_hidden

MTP_PREFIX = "mtp."


class Scores(UserDict[str, torch.Tensor]):
    """What one scoring pass returns for N completions, by name (all zero on padding).

    logp:         [N, T] log-probs of the completion tokens (with grad when enabled), always;
    and those asked for (`Policy.forward(make=)`, algos/inputs.SCORED), None by attribute if not:
    entropy:      [N, T] entropies of the next-token distributions.
    entropy_term: [N, T] S = Σ_j p_j²(log p_j + H), no grad (TEPO's first_order mask).
    mtp_logp:     [N, T, K−1] MTP depth n's log-prob, at anchor column t, of completion token
                  t + n − 1 (0 where it does not exist).
    A mapping but not a dict, which ZeRO-3's module hooks would rewrap tensor by tensor.
    """

    def __getattr__(self, name: str) -> torch.Tensor | None:
        if name == "data" or name.startswith("_"):
            raise AttributeError(name)
        return self.data.get(name)


class Policy(nn.Module):
    """`lm` is the transformers model (generation, saving); `forward` scores completions."""

    def __init__(
        self,
        lm: PreTrainedModel,
        kernel: KernelConfig,
        share_prompts: bool = True,
        mtp_depths: int = 0,
        mtp: MtpConfig | None = None,
        packing: bool = False,
        truncation: Truncation | None = None,
    ) -> None:
        """`truncation`: the sampler's top-k/top-p, under which every log-prob the objective reads
        is scored (rollout.truncated_sampling=renormalise; docs/objectives.md §0.9)."""
        super().__init__()
        # Sampling and training must see the same function (ratio = 1 on-policy): no dropout.
        self.lm = lm.eval()
        self.head = LogprobHead.of(lm.get_output_embeddings(), kernel)
        self.share_prompts = share_prompts
        self.packing = packing  # real tokens only, in one row (models/packing.py)
        self.mtp_config = mtp or MtpConfig()
        self.mtp = (
            MtpStack(lm, mtp_depths, self.mtp_config.head, kernel).eval() if mtp_depths else None
        )
        if self.mtp is not None and not self.mtp_config.trainable:
            self.mtp.requires_grad_(False)
        self.truncation = truncation or Truncation()
        for module in self.modules():
            if isinstance(module, LogprobHead):
                module.truncation = self.truncation
        self.adapted = False  # LoRA adapters in `lm` (add_adapters)
        self._lora_dropouts: list[nn.Module] = []

    @property
    def decoder(self) -> PreTrainedModel:
        """The transformers model whose decoder stack runs the sequences."""
        return self.lm

    def add_adapters(self, settings: LoraConfig, base_model: str | None) -> None:
        """LoRA adapters into the LM (models/lora.py), after the MTP modules copied its layers:
        those train whole."""
        add_adapters(self.lm, settings, base_model)
        self.adapted = True
        self._lora_dropouts = lora_dropouts(self.lm)

    def prompt_pass(self, batch: SequenceBatch, rows: torch.Tensor) -> PromptPass:
        """The distinct prompts of `rows` (host indices into `batch`) run once, for the
        micro-batches that read them (models/prompt_pass.py)."""
        return self(batch, prompt_pass_rows=rows)

    @overload
    def forward(
        self,
        batch: SequenceBatch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_mtp: bool = False,
        prompts: ExternalPrompts | None = None,
        make: Collection[str] = (),
    ) -> Scores: ...

    @overload
    def forward(self, batch: SequenceBatch, *, prompt_pass_rows: torch.Tensor) -> PromptPass: ...

    def forward(
        self,
        batch: SequenceBatch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_mtp: bool = False,
        prompts: ExternalPrompts | None = None,
        prompt_pass_rows: torch.Tensor | None = None,
        make: Collection[str] = (),
    ) -> Scores | PromptPass:
        """Score the completions of `batch` (see `Scores`): logp, and the scores named in `make`
        (the trainer's, from the objective's declared inputs, algos/inputs.py) or by the flags
        `with_entropy`, `with_mtp` (which needs the MTP modules);
        `prompts`: the rows' prompts from a prompt pass (models/prompt_pass.py), packing only.
        `prompt_pass_rows` is `prompt_pass`'s way in: the pass is a call of the module, as
        DeepSpeed's engine and ZeRO-3's hooks expect of every forward (`through_engine`), so the
        one entry has the two uses. LoRA dropout (model.lora.dropout) acts only when gradients
        are recorded."""
        with dropout_in_training(self._lora_dropouts):
            if prompt_pass_rows is not None:
                return run_prompt_pass(
                    self.lm, batch, prompt_pass_rows, self.lm.get_input_embeddings()
                )
            flags = {"entropy": with_entropy, "mtp_logp": with_mtp}
            wanted = {*make, *(name for name, on in flags.items() if on)}
            return self._score(batch, temperature, wanted, prompts)

    def _score(
        self,
        batch: SequenceBatch,
        temperature: float,
        make: set[str],
        prompts: ExternalPrompts | None,
    ) -> Scores:
        with_mtp = "mtp_logp" in make
        if with_mtp and self.mtp is None:
            raise ValueError("mtp_logp (with_mtp=True) needs a policy built with MTP modules")
        # The sequence is embedded once for the backbone and the MTP modules: every lookup's
        # backward is a dense [vocab, hidden] gradient, the largest tensor of a small model.
        embedded = self.lm.get_input_embeddings()(batch.input_ids)
        hidden = sequence_hidden(
            self.lm,
            batch,
            embedded,
            self.share_prompts,
            full=with_mtp,
            packing=self.packing,
            prompts=prompts,
        )
        valid = batch.completion_mask
        width = valid.shape[1]
        response_hidden = hidden[:, batch.prompt_width - 1 :] if with_mtp else hidden
        targets = batch.completion_ids[:, :width][valid]
        logp_flat, entropy_flat = self.head(
            response_hidden[valid], targets, temperature, "entropy" in make
        )
        scores = Scores(logp=_scatter(valid, logp_flat))
        if entropy_flat is not None:
            scores["entropy"] = _scatter(valid, entropy_flat)
        if "entropy_term" in make:
            with torch.no_grad():
                term = self.head.entropy_terms(response_hidden[valid], targets, temperature)
            scores["entropy_term"] = _scatter(valid, term)
        if with_mtp:
            scores["mtp_logp"], _ = self.mtp_logprobs(batch, hidden, temperature, embedded=embedded)
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
            first, owner = batch.distinct_prompts()
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
        valid = batch.completion_mask
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
        return sequence_hidden(
            self.lm, batch, embedded, self.share_prompts, full=True, packing=self.packing
        )

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


def _scatter(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(valid.shape, dtype=values.dtype, device=valid.device)
    return out.masked_scatter(valid, values)
