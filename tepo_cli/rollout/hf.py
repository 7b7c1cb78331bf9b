"""Rollout with transformers' generate(): G samples per prompt, KV cache, CPU or GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tepo_cli.models.shared_prompts import prefill


@dataclass
class Rollout:
    """Generated samples, group by group (the n samples of a prompt are consecutive rows)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P] 1 on prompt tokens
    completion_ids: torch.Tensor  # [N, T] right-padded
    completion_mask: torch.Tensor  # [N, T] bool: generated tokens up to and including the first EOS
    texts: list[str]  # decoded completions without special tokens
    truncated: torch.Tensor  # [N] bool: stopped by the length limit, not by EOS

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
        )

    @staticmethod
    def concat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Stack rollouts of different widths: prompts re-padded left, completions right."""
        prompt_width = max(p.prompt_ids.shape[1] for p in parts)
        width = max(p.completion_ids.shape[1] for p in parts)
        return Rollout(
            torch.cat([_pad_left(p.prompt_ids, prompt_width, pad_id) for p in parts]),
            torch.cat([_pad_left(p.prompt_mask, prompt_width, 0) for p in parts]),
            torch.cat([_pad_right(p.completion_ids, width, pad_id) for p in parts]),
            torch.cat([_pad_right(p.completion_mask, width, False) for p in parts]),
            [text for p in parts for text in p.texts],
            torch.cat([p.truncated for p in parts]),
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


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    sampling: Sampling,
    share_prompts: bool = True,
) -> Rollout:
    """Sample `sampling.n` completions for each prompt.

    With `share_prompts` and n > 1, each prompt's prefill runs once and its KV cache is gathered
    to its n rows (models/shared_prompts.py); the samples are the same either way.
    Runs under no_grad (not inference_mode): the returned ids are later used in autograd graphs.
    """
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids = encoded["input_ids"].repeat_interleave(sampling.n, dim=0).to(device)
    prompt_mask = encoded["attention_mask"].repeat_interleave(sampling.n, dim=0).to(device)
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    chunks = []
    for start in range(0, prompt_ids.shape[0], sampling.batch_size):
        stop = start + sampling.batch_size
        shared = (
            _shared_prefill(model, encoded, start, min(stop, len(prompt_ids)), sampling.n)
            if share_prompts and sampling.n > 1 and prompt_ids.shape[1] > 1
            else {}
        )
        output = model.generate(
            input_ids=prompt_ids[start:stop],
            attention_mask=prompt_mask[start:stop],
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature,
            top_p=None if sampling.greedy else sampling.top_p,
            top_k=None if sampling.greedy else sampling.top_k,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
            **shared,
        )
        chunks.append(output[:, prompt_ids.shape[1] :])
    model.train(was_training)
    width = max(chunk.shape[1] for chunk in chunks)
    masks, truncated = zip(*(_completion_mask(chunk, eos_ids) for chunk in chunks), strict=True)
    completion_ids = torch.cat([_pad_right(c, width, pad_id) for c in chunks])
    completion_mask = torch.cat([_pad_right(m, width, False) for m in masks])
    texts = tokenizer.batch_decode(
        [ids[mask].tolist() for ids, mask in zip(completion_ids, completion_mask, strict=True)],
        skip_special_tokens=True,
    )
    return Rollout(
        prompt_ids, prompt_mask, completion_ids, completion_mask, texts, torch.cat(truncated)
    )


def _shared_prefill(
    model: PreTrainedModel, encoded: Any, start: int, stop: int, n: int
) -> dict[str, Any]:
    """A KV cache of rows start..stop-1's prompts but their last token, each distinct prompt run
    once; generate() then feeds only the last prompt token before sampling."""
    prompt_of_row = torch.arange(start, stop) // n
    first_prompt = int(prompt_of_row[0])
    prompt_index = torch.arange(first_prompt, int(prompt_of_row[-1]) + 1)
    device = next(model.parameters()).device
    ids = encoded["input_ids"][prompt_index, :-1].to(device)
    mask = encoded["attention_mask"][prompt_index, :-1].to(device)
    positions = left_padded_positions(mask)
    _, cache = prefill(model, ids, mask, positions, (prompt_of_row - first_prompt).to(device))
    return {"past_key_values": cache}


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids as generate() numbers them: real tokens 0, 1, ... from the first one."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return sorted(i for i in ids if i is not None)


def _completion_mask(ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid = every generated token up to and including the first EOS (padding may equal EOS).

    Computed per generate() call, before chunks are padded to a common width.
    """
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device))
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos.long()
    return eos_before == 0, ~is_eos.any(dim=1)


def _pad_right(values: torch.Tensor, width: int, fill: int | bool) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, width - values.shape[1]), value=fill)


def _pad_left(values: torch.Tensor, width: int, fill: int | bool) -> torch.Tensor:
    return torch.nn.functional.pad(values, (width - values.shape[1], 0), value=fill)
