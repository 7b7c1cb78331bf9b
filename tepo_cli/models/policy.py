"""The policy as tepo trains it: a causal LM whose log-probs go through the kernel path.

The backbone returns hidden states; `LogprobHead` turns them into token log-probs (and
entropies) with the lm-head weight inside `token_logprobs`, chunk by chunk, only at response
positions — the full [tokens x vocab] logits are never built. A feature may attach modules of
its own (MPO's multi-token prediction modules): the policy carries them, and they score one more
quantity through the same head.
"""

from __future__ import annotations

from collections import UserDict
from collections.abc import Callable, Collection
from typing import Any, overload

import torch
from torch import nn
from transformers import PreTrainedModel

from tepo_cli.config.schema import KernelConfig, LoraConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.kernels.truncated import Truncation
from tepo_cli.models.logprob_head import LogprobHead
from tepo_cli.models.lora import add_adapters, dropout_in_training, lora_dropouts
from tepo_cli.models.packing import ExternalPrompts
from tepo_cli.models.prompt_pass import PromptPass, run_prompt_pass
from tepo_cli.models.sequence_hidden import sequence_hidden

Attach = Callable[[PreTrainedModel, KernelConfig], nn.Module]


class Scores(UserDict[str, torch.Tensor]):
    """What one scoring pass returns for N completions, by name (all zero on padding).

    logp:         [N, T] log-probs of the completion tokens (with grad when enabled), always;
    and those asked for (`Policy.forward(make=)`, algos/inputs.SCORED), None by attribute if not:
    entropy:      [N, T] entropies of the next-token distributions.
    entropy_term: [N, T] S = Σ_j p_j²(log p_j + H), no grad (TEPO's first_order mask).
    and the attached modules' quantity, by their `scores` name (MPO's, [N, T, K−1]).
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
        attach: Attach | None = None,
        packing: bool = False,
        truncation: Truncation | None = None,
    ) -> None:
        """`truncation`: the sampler's top-k/top-p, under which every log-prob the objective reads
        is scored (rollout.truncated_sampling=renormalise; docs/objectives.md §0.9). `attach`
        builds a feature's modules from the LM (before any adapter) once the head exists: an
        `nn.Module` with `state_prefix` (its attribute here, so its checkpoint keys keep their
        prefix), `scores` (the name of what it scores) and `score(policy, batch, hidden,
        temperature, embedded=)` returning that [N, T, ...] tensor first."""
        super().__init__()
        # Sampling and training must see the same function (ratio = 1 on-policy): no dropout.
        self.lm = lm.eval()
        self.head = LogprobHead.of(lm.get_output_embeddings(), kernel)
        self.share_prompts = share_prompts
        self.packing = packing  # real tokens only, in one row (models/packing.py)
        self._attached_as: str | None = None
        if attach is not None:
            modules = attach(lm, kernel)
            self._attached_as = modules.state_prefix
            self.add_module(modules.state_prefix, modules)
        self.truncation = truncation or Truncation()
        for module in self.modules():
            if isinstance(module, LogprobHead):
                module.truncation = self.truncation
        self.adapted = False  # LoRA adapters in `lm` (add_adapters)
        self._lora_dropouts: list[nn.Module] = []

    @property
    def attached(self) -> Any | None:
        """The feature's modules `attach` built, or None."""
        return None if self._attached_as is None else getattr(self, self._attached_as)

    @property
    def decoder(self) -> PreTrainedModel:
        """The transformers model whose decoder stack runs the sequences."""
        return self.lm

    def add_adapters(self, settings: LoraConfig, base_model: str | None) -> None:
        """LoRA adapters into the LM (models/lora.py), after attached modules copied its layers:
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
        prompts: ExternalPrompts | None = None,
        prompt_pass_rows: torch.Tensor | None = None,
        make: Collection[str] = (),
    ) -> Scores | PromptPass:
        """Score the completions of `batch` (see `Scores`): logp, and the scores named in `make`
        (the trainer's, from the objective's declared inputs, algos/inputs.py; the attached
        modules' name needs them) or by the flag `with_entropy`;
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
            wanted = {*make, *(("entropy",) if with_entropy else ())}
            return self._score(batch, temperature, wanted, prompts)

    def _score(
        self,
        batch: SequenceBatch,
        temperature: float,
        make: set[str],
        prompts: ExternalPrompts | None,
    ) -> Scores:
        attached = self.attached
        with_attached = attached is not None and attached.scores in make
        # The sequence is embedded once for the backbone and the attached modules: every lookup's
        # backward is a dense [vocab, hidden] gradient, the largest tensor of a small model.
        embedded = self.lm.get_input_embeddings()(batch.input_ids)
        hidden = sequence_hidden(
            self.lm,
            batch,
            embedded,
            self.share_prompts,
            full=with_attached,
            packing=self.packing,
            prompts=prompts,
        )
        valid = batch.completion_mask
        width = valid.shape[1]
        response_hidden = hidden[:, batch.prompt_width - 1 :] if with_attached else hidden
        targets = batch.completion_ids[:, :width][valid]
        logp_flat, entropy_flat = self.head(
            response_hidden[valid], targets, temperature, "entropy" in make
        )
        scores = Scores(logp=scatter_valid(valid, logp_flat))
        if entropy_flat is not None:
            scores["entropy"] = scatter_valid(valid, entropy_flat)
        if "entropy_term" in make:
            with torch.no_grad():
                term = self.head.entropy_terms(response_hidden[valid], targets, temperature)
            scores["entropy_term"] = scatter_valid(valid, term)
        if with_attached:
            scores[attached.scores], _ = attached.score(
                self, batch, hidden, temperature, embedded=embedded
            )
        unmade = make - scores.keys()  # what neither the head nor attached modules make
        if unmade:
            wanted = ", ".join(sorted(unmade))
            raise ValueError(f"{wanted} needs a policy built with the modules that score it")
        return scores

    def backbone_hidden(self, batch: SequenceBatch) -> torch.Tensor:
        """[N, P + T − 1, H] the backbone's final hidden states at every position that predicts
        a token of the sequence (what attached modules read)."""
        embedded = self.lm.get_input_embeddings()(batch.input_ids)
        return sequence_hidden(
            self.lm, batch, embedded, self.share_prompts, full=True, packing=self.packing
        )

    def hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This wrapper's state dict (e.g. ZeRO-3's consolidated one) with the LM's own keys."""
        return {key[3:]: value for key, value in state_dict.items() if key.startswith("lm.")}


def scatter_valid(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[N, T] (or the shape of `valid`) zeros with `values` at the places `valid` marks."""
    out = torch.zeros(valid.shape, dtype=values.dtype, device=valid.device)
    return out.masked_scatter(valid, values)
