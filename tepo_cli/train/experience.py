"""One step's experience: prompts -> rollout -> rewards -> group advantages -> no-grad scores.

Every record moves forward only; the update phase reads an `Experience` and never reaches back.
Groups never straddle ranks (each rank owns whole prompts), so group statistics are local.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from tepo_cli.algos import group_advantages
from tepo_cli.config.schema import TrainConfig
from tepo_cli.data.arith import Problem
from tepo_cli.data.prompts import render_prompt
from tepo_cli.rewards import RewardFn
from tepo_cli.rollout.hf import Rollout, Sampling, generate
from tepo_cli.train.sequences import SequenceBatch, response_logprobs


@dataclass
class Experience:
    problems: list[Problem]  # one per group
    rollout: Rollout
    batch: SequenceBatch
    rewards: torch.Tensor  # [N]
    correct: torch.Tensor  # [N] bool
    advantages: torch.Tensor  # [N]
    old_logp: torch.Tensor | None = None  # [N, T]; None when the update is on-policy
    old_entropy: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def on_policy(cfg: TrainConfig) -> bool:
    """One optimizer step per rollout: π_old = π_θ, so old log-probs are the current ones."""
    return cfg.trainer.ppo_epochs == 1 and cfg.trainer.minibatches == 1


def collect(
    cfg: TrainConfig,
    policy: nn.Module,
    reference: nn.Module | None,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    reward_fn: RewardFn,
) -> Experience:
    timer = _Timer()
    rollout_cfg = cfg.rollout
    prompts = [render_prompt(tokenizer, cfg.benchmark, p.question) for p in problems]
    sampling = Sampling(
        n=rollout_cfg.n,
        temperature=rollout_cfg.temperature,
        top_p=rollout_cfg.top_p,
        top_k=rollout_cfg.top_k,
        max_new_tokens=rollout_cfg.max_new_tokens,
        batch_size=rollout_cfg.batch_size,
    )
    with timer("rollout"):
        rollout = generate(policy, tokenizer, prompts, sampling)
    with timer("reward"):
        results = [
            reward_fn(text, problems[i // rollout_cfg.n]) for i, text in enumerate(rollout.texts)
        ]
        device = rollout.completion_ids.device
        rewards = torch.tensor([r.reward for r in results], dtype=torch.float32, device=device)
        correct = torch.tensor([r.correct for r in results], dtype=torch.bool, device=device)
        advantages = group_advantages(rewards, rollout_cfg.n, scale=cfg.algo.advantage_scale)
    batch = SequenceBatch.from_rollout(rollout)
    experience = Experience(problems, rollout, batch, rewards, correct, advantages)
    with timer("score"):
        _score(cfg, policy, reference, experience)
    experience.seconds = timer.seconds
    return experience


@torch.no_grad()
def _score(
    cfg: TrainConfig, policy: nn.Module, reference: nn.Module | None, experience: Experience
) -> None:
    """Old-policy (when off-policy) and reference log-probs, in micro-batches, without gradient."""
    need_old = not on_policy(cfg)
    need_old_entropy = need_old and cfg.algo.kl_mask == "tepo"
    if not need_old and reference is None:
        return
    batch, width = experience.batch, experience.batch.response_mask.shape[1]
    old, old_entropy, ref = [], [], []
    for rows in torch.arange(len(batch)).split(cfg.trainer.micro_batch_size):
        part = batch.select(rows)
        if need_old:
            logp, entropy = response_logprobs(
                policy, part, cfg.rollout.temperature, cfg.kernel, with_entropy=need_old_entropy
            )
            old.append(_widen(logp, width))
            if entropy is not None:
                old_entropy.append(_widen(entropy, width))
        if reference is not None:
            logp, _ = response_logprobs(reference, part, cfg.rollout.temperature, cfg.kernel)
            ref.append(_widen(logp, width))
    experience.old_logp = torch.cat(old) if old else None
    experience.old_entropy = torch.cat(old_entropy) if old_entropy else None
    experience.ref_logp = torch.cat(ref) if ref else None


def _widen(values: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str) -> _Timer:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self._name] = (
            self.seconds.get(self._name, 0.0) + time.perf_counter() - self._start
        )
