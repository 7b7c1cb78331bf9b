"""What every rollout back-end shares: the `Sampling` it is asked for, the `RolloutBackend`
interface train and eval call, and the EOS helpers. The `Rollout` record it returns lives in
core/rollout_record.py (every stage reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tepo_cli.core.rollout_record import Rollout
from tepo_cli.envs.episodes import SampledTurn
from tepo_cli.rollout.stop_rule import StopRule


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
    # `rollout.stop`: where an answer ends besides its EOS (stop_rule.py); None: at its EOS
    stop: StopRule | None = None


class RolloutBackend(Protocol):
    """A generation engine, as train and eval see it (rollout/__init__.py names the back-ends).

    Devices: the rollout crosses onto the policy's device once, here, at the back-end boundary.
    `build_backend` wraps every back-end in `OnPolicyDevice`, so `generate` returns a `Rollout`
    whose tensors are all on the policy's device, wherever the engine keeps its own (vLLM returns
    Python lists, turned into host tensors); no later stage moves a rollout.

    `generate` samples `sampling.n` completions per prompt; an engine with kernels of its own
    also returns its log-probs of the sampled tokens (`Rollout.logprobs`, corrected for as in
    docs/objectives.md §0.8). `sync` makes the engine generate with the trainer's current weights;
    the trainer calls it after every optimizer step (and times it: `sync_seconds`). `sleep`,
    called after each step's rollout, lets an engine with device memory of its own give it to the
    update until the next `sync` or `generate` (vLLM's sleep mode); it is optional (`OnPolicyDevice`
    skips a back-end without it). `close` releases the engine at the end of a job.
    `sample_turns` samples one turn per context of token ids and returns token ids (multi-turn
    episodes, tepo_cli/envs/episodes.py: nothing is decoded and encoded again between turns).
    """

    def generate(self, prompts: list[str], sampling: Sampling) -> Rollout: ...

    def sample_turns(
        self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling
    ) -> list[SampledTurn]: ...

    def sync(self, lm: PreTrainedModel) -> None: ...

    def sleep(self) -> None: ...

    def close(self) -> None: ...


class OnPolicyDevice:
    """A back-end whose rollouts come back on `device`, the policy's (the boundary above)."""

    def __init__(self, backend: RolloutBackend, device: torch.device) -> None:
        self.backend = backend
        self.device = device

    def generate(self, prompts: list[str], sampling: Sampling) -> Rollout:
        return self.backend.generate(prompts, sampling).to(self.device)

    def sample_turns(
        self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling
    ) -> list[SampledTurn]:
        """Turns are token-id lists, on no device: the episode's rollout crosses at its end."""
        return self.backend.sample_turns(contexts, max_new_tokens, sampling)

    def sync(self, lm: PreTrainedModel) -> None:
        self.backend.sync(lm)

    def sleep(self) -> None:
        sleep = getattr(self.backend, "sleep", None)
        if sleep is not None:
            sleep()

    def settings(self) -> dict[str, bool]:
        """The engine's resolved speed modes (vllm: CUDA graphs, sleep, per-request seeds); {}
        for a back-end without any."""
        settings = getattr(self.backend, "settings", None)
        return {} if settings is None else settings()

    def close(self) -> None:
        self.backend.close()


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
