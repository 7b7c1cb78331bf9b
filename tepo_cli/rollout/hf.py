"""The `hf` rollout back-end: transformers' generate() on the trainer's own model (KV cache, CPU
or GPU). The engine is the trainer, so there is nothing to sync and no rollout–training mismatch."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteriaList

from tepo_cli.config.schema import RolloutConfig
from tepo_cli.core import collective
from tepo_cli.core.rollout_record import Rollout, left_padded_positions, pad_right
from tepo_cli.envs.episodes import SampledTurn
from tepo_cli.models.cache_key import returned_cache, with_cache
from tepo_cli.models.shared_prompts import prefill
from tepo_cli.rollout.backend import Sampling, completion_mask, eos_ids
from tepo_cli.rollout.stop_rule import StopCriterion, cut_at_stop
from tepo_cli.rollout.turn_cache import Kept, TurnCache, build_batch, keep

NAME = "hf"  # rollout.backend (conf/rollout/hf.yaml)
REQUIRES = None  # transformers is tepo's own requirement


class HfBackend:
    """Generation with the policy's own transformers model."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        share_prompts: bool,
        keep_turns: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.share_prompts = share_prompts
        # episodes' conversations between turns (turn_cache.py); None: each turn from scratch
        self.turn_cache = TurnCache() if keep_turns else None

    def generate(self, prompts: list[str], sampling: Sampling) -> Rollout:
        return generate(self.model, self.tokenizer, prompts, sampling, self.share_prompts)

    def sample_turns(
        self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling
    ) -> list[SampledTurn]:
        """One turn for each context (token ids in, token ids out: multi-turn episodes)."""
        return sample_turns(
            self.model, self.tokenizer, contexts, max_new_tokens, sampling, self.turn_cache
        )

    def sync(self, lm: PreTrainedModel) -> None:
        """generate() reads the trainer's parameters themselves; the kept conversations' keys
        and values were computed with the weights before the step, so they go."""
        if self.turn_cache is not None:
            self.turn_cache.clear()

    def sleep(self) -> None:
        """Nothing to free: the engine is the trainer's model."""

    def close(self) -> None:
        """Nothing to release: the model is the trainer's."""


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
    With `sampling.stop`, a row stops generating where the rule ends it and is cut there.
    """
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids = encoded["input_ids"].repeat_interleave(sampling.n, dim=0).to(device)
    prompt_mask = encoded["attention_mask"].repeat_interleave(sampling.n, dim=0).to(device)
    eos = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    synced = partitioned_across_ranks(model)
    # Every rank must take the same branch below: under ZeRO-3 the prefill's forward gathers
    # parameters from all ranks, so the shortest prompt width decides for all of them.
    width = _smallest_across_ranks(prompt_ids.shape[1]) if synced else prompt_ids.shape[1]
    chunks = []
    for start in range(0, prompt_ids.shape[0], sampling.batch_size):
        stop = start + sampling.batch_size
        criteria = None  # one per call: it keeps which of the call's rows are done
        if sampling.stop:
            criteria = StoppingCriteriaList(
                [StopCriterion(sampling.stop, tokenizer, prompt_ids.shape[1])]
            )
        shared = (
            _shared_prefill(model, encoded, start, min(stop, len(prompt_ids)), sampling.n)
            if share_prompts and sampling.n > 1 and width > 1
            else {}
        )
        output = model.generate(
            input_ids=prompt_ids[start:stop],
            attention_mask=prompt_mask[start:stop],
            **_sampling_kwargs(sampling, sampling.max_new_tokens, eos, pad_id),
            synced_gpus=synced,
            stopping_criteria=criteria,
            **shared,
        )
        chunks.append(output[:, prompt_ids.shape[1] :])
    model.train(was_training)
    width = max(chunk.shape[1] for chunk in chunks)
    masks, truncated = zip(*(completion_mask(chunk, eos) for chunk in chunks), strict=True)
    completion_ids = torch.cat([pad_right(c, width, pad_id) for c in chunks])
    valid = torch.cat([pad_right(m, width, False) for m in masks])
    texts = tokenizer.batch_decode(
        [ids[mask].tolist() for ids, mask in zip(completion_ids, valid, strict=True)],
        skip_special_tokens=True,
    )
    rollout = Rollout(prompt_ids, prompt_mask, completion_ids, valid, texts, torch.cat(truncated))
    return cut_at_stop(rollout, sampling.stop, tokenizer) if sampling.stop else rollout


@torch.no_grad()
def sample_turns(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    contexts: list[list[int]],
    max_new_tokens: int,
    sampling: Sampling,
    turn_cache: TurnCache | None = None,
) -> list[SampledTurn]:
    """One sample per context, from its token ids as they are (left-padded into a batch, never
    decoded): each turn's ids up to and including its first end-of-message token. With
    `turn_cache`, a context that continues a conversation the cache kept runs only its new
    tokens (turn_cache.py), and the cache then keeps these rows' conversations."""
    eos = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    width = max(len(context) for context in contexts)  # without reuse: one padding for all
    was_training = model.training
    model.eval()
    turns: list[SampledTurn] = []
    kept: list[Kept] = []
    for start in range(0, len(contexts), sampling.batch_size):
        chunk = contexts[start : start + sampling.batch_size]
        reused = [turn_cache.reuse(c) if turn_cache else (None, 0) for c in chunk]
        batch = build_batch(model, chunk, reused, pad_id, width)
        output = model.generate(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            **with_cache(batch.cache),
            return_dict_in_generate=True,
            **_sampling_kwargs(sampling, max_new_tokens, eos, pad_id),
        )
        generated = output.sequences[:, batch.input_ids.shape[1] :]
        if turn_cache is not None:
            mask = torch.cat([batch.attention_mask, torch.ones_like(generated)], dim=1)
            kept += keep(batch, returned_cache(output), generated, mask)
        valid, truncated = completion_mask(generated, eos)
        for row, ids, cut in zip(
            generated.tolist(), valid.tolist(), truncated.tolist(), strict=True
        ):
            turns.append(SampledTurn(row[: sum(ids)], None, ended=not cut))
    model.train(was_training)
    if turn_cache is not None:
        turn_cache.kept = kept
    return turns


def _sampling_kwargs(
    sampling: Sampling, max_new_tokens: int, eos: list[int], pad_id: int
) -> dict[str, Any]:
    """generate()'s sampling arguments for `sampling` (greedy: no temperature or truncation)."""
    greedy = sampling.greedy
    return {
        "max_new_tokens": max_new_tokens,
        "do_sample": not greedy,
        "temperature": None if greedy else sampling.temperature,
        "top_p": None if greedy else sampling.top_p,
        "top_k": None if greedy else sampling.top_k,
        "eos_token_id": eos,
        "pad_token_id": pad_id,
    }


def partitioned_across_ranks(model: PreTrainedModel) -> bool:
    """Whether the model's parameters are ZeRO-3 partitions (DeepSpeed tags them with `ds_id`)
    in a group of several ranks. Every forward then all-gathers each layer's parameters from all
    ranks, so generate() must run with `synced_gpus`: a rank whose samples have all ended keeps
    stepping the model until every rank's have, or the ranks' gathers fall out of step (a
    deadlock). transformers only turns it on by itself under its own DeepSpeed integration."""
    if not collective.multi_rank():
        return False
    return any(hasattr(param, "ds_id") for param in model.parameters())


def _smallest_across_ranks(value: int) -> int:
    """The smallest `value` over the ranks."""
    return int(collective.all_min(torch.tensor([value], dtype=torch.int64, device="cpu")).item())


def _shared_prefill(
    model: PreTrainedModel, encoded: Any, start: int, stop: int, n: int
) -> dict[str, Any]:
    """A KV cache of rows start..stop-1's prompts but their last token, each distinct prompt run
    once; generate() then feeds only the last prompt token before sampling."""
    prompt_of_row = torch.arange(start, stop, device="cpu") // n  # indexes the host encoding
    first_prompt = int(prompt_of_row[0])
    prompt_index = torch.arange(first_prompt, int(prompt_of_row[-1]) + 1, device="cpu")
    device = next(model.parameters()).device
    ids = encoded["input_ids"][prompt_index, :-1].to(device)
    mask = encoded["attention_mask"][prompt_index, :-1].to(device)
    positions = left_padded_positions(mask)
    _, cache = prefill(model, ids, mask, positions, (prompt_of_row - first_prompt).to(device))
    return with_cache(cache)


def build(
    cfg: RolloutConfig, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, share_prompts: bool
) -> HfBackend:
    """The registry's entry point (rollout/__init__.py)."""
    return HfBackend(lm, tokenizer, share_prompts, cfg.turn_cache)
