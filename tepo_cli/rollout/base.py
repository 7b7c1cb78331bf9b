"""What every rollout back-end shares: the `Rollout` it returns, the `Sampling` it is asked for,
the `RolloutBackend` interface train and eval call, and the padding helpers.

Rows are laid out group by group (the n samples of a prompt are consecutive); prompts are
left-padded, completions right-padded; a completion is valid up to and including its first EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Rollout:
    """Generated samples, group by group (the n samples of a prompt are consecutive rows)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P] 1 on prompt tokens
    completion_ids: torch.Tensor  # [N, T] right-padded
    completion_mask: torch.Tensor  # [N, T] bool: generated tokens up to and including the first EOS
    texts: list[str]  # decoded completions without special tokens
    truncated: torch.Tensor  # [N] bool: stopped by the length limit, not by EOS
    # [N, T] the engine's own log-probs of the sampled tokens (after temperature), 0 on padding;
    # None when the engine is the trainer's model (hf): its log-probs are the trainer's.
    logprobs: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)

    def take(self, rows: torch.Tensor) -> Rollout:
        """The given rows (a LongTensor of indices), in that order."""
        return Rollout(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.completion_ids[rows],
            self.completion_mask[rows],
            [self.texts[i] for i in rows.tolist()],
            self.truncated[rows],
            None if self.logprobs is None else self.logprobs[rows],
        )

    @staticmethod
    def concat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Stack rollouts of different widths: prompts re-padded left, completions right."""
        prompt_width = max(p.prompt_ids.shape[1] for p in parts)
        width = max(p.completion_ids.shape[1] for p in parts)
        with_logprobs = [p.logprobs is not None for p in parts]
        if any(with_logprobs) and not all(with_logprobs):
            raise ValueError("cannot concatenate rollouts with and without engine log-probs")
        return Rollout(
            torch.cat([pad_left(p.prompt_ids, prompt_width, pad_id) for p in parts]),
            torch.cat([pad_left(p.prompt_mask, prompt_width, 0) for p in parts]),
            torch.cat([pad_right(p.completion_ids, width, pad_id) for p in parts]),
            torch.cat([pad_right(p.completion_mask, width, False) for p in parts]),
            [text for p in parts for text in p.texts],
            torch.cat([p.truncated for p in parts]),
            torch.cat([pad_right(p.logprobs, width, 0.0) for p in parts])  # type: ignore[arg-type]
            if all(with_logprobs)
            else None,
        )


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    batch_size: int = 64
    # Engines that seed each request (vllm): prompt i's j-th sample draws from seed + i * n + j, so
    # a run reproduces. None: the engine's own stream. hf draws from torch's global generator.
    seed: int | None = None


class RolloutBackend(Protocol):
    """A generation engine, as train and eval see it (rollout/__init__.py names the back-ends).

    `generate` samples `sampling.n` completions per prompt; an engine with kernels of its own
    also returns its log-probs of the sampled tokens (`Rollout.logprobs`, corrected for as in
    docs/objectives.md §0.8). `sync` makes the engine generate with the trainer's current weights;
    the trainer calls it after every optimizer step (and times it: `sync_seconds`). `close`
    releases the engine at the end of a job.
    """

    def generate(self, prompts: list[str], sampling: Sampling) -> Rollout: ...

    def sync(self, lm: PreTrainedModel) -> None: ...

    def close(self) -> None: ...


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids as generate() numbers them: real tokens 0, 1, ... from the first one."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS and every EOS the model's generation config names."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return sorted(i for i in ids if i is not None)


def completion_mask(ids: torch.Tensor, eos: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid = every generated token up to and including the first EOS (padding may equal EOS);
    truncated = no EOS at all.

    Computed per generate() call, before chunks are padded to a common width.
    """
    is_eos = torch.isin(ids, torch.tensor(eos, device=ids.device))
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos.long()
    return eos_before == 0, ~is_eos.any(dim=1)


def pad_right(values: torch.Tensor, width: int, fill: int | float | bool) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, width - values.shape[1]), value=fill)


def pad_left(values: torch.Tensor, width: int, fill: int | float | bool) -> torch.Tensor:
    return torch.nn.functional.pad(values, (width - values.shape[1], 0), value=fill)
