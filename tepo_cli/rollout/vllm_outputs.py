"""vLLM's request outputs as tepo's records: a `Rollout` of one answer per sample, or the
`SampledTurn` of a multi-turn episode (token ids and the engine's log-probs of them)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from tepo_cli.core.rollout_record import Rollout
from tepo_cli.envs.episodes import SampledTurn
from tepo_cli.rollout.backend import Sampling


def outputs_rollout(
    tokenizer: PreTrainedTokenizerBase,
    ids: list[list[int]],
    completions: list[Any],
    sampling: Sampling,
) -> Rollout:
    """The engine's lists as host tensors; the back-end boundary (`OnPolicyDevice`, built by
    `build_backend`) moves them to the policy's device."""
    encoded = tokenizer.pad({"input_ids": ids}, return_tensors="pt")  # left, as hf's
    rows = [list(c.token_ids) for c in completions]
    width = max(1, *(len(r) for r in rows))
    pad_id = tokenizer.pad_token_id
    completion_ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device="cpu")
    valid = torch.zeros((len(rows), width), dtype=torch.bool, device="cpu")
    logprobs = torch.zeros((len(rows), width), dtype=torch.float32, device="cpu")
    for i, (row, completion) in enumerate(zip(rows, completions, strict=True)):
        completion_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")
        valid[i, : len(row)] = True
        if completion.logprobs is not None:
            values = [
                step[token].logprob for token, step in zip(row, completion.logprobs, strict=True)
            ]
            logprobs[i, : len(values)] = torch.tensor(values, dtype=torch.float32, device="cpu")
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    truncated = torch.tensor(
        [c.finish_reason == "length" for c in completions], dtype=torch.bool, device="cpu"
    )
    return Rollout(
        encoded["input_ids"].repeat_interleave(sampling.n, dim=0),
        encoded["attention_mask"].repeat_interleave(sampling.n, dim=0),
        completion_ids,
        valid,
        texts,
        truncated,
        None if sampling.greedy else logprobs,
    )


def outputs_turn(completion: Any) -> SampledTurn:
    """One sampled turn: its ids as the engine returned them, their log-probs (None for greedy
    requests, which ask for none), and whether it ended by itself (not by the length limit)."""
    ids = list(completion.token_ids)
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [step[t].logprob for t, step in zip(ids, completion.logprobs, strict=True)]
    return SampledTurn(ids, logprobs, ended=completion.finish_reason != "length")
