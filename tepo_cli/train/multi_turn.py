"""The rollout of a multi-turn step (`env` other than `single`): one episode per sample, run by
the environment (tepo_cli/envs/), laid out as one row each — the prompt, then every turn and
observation, with `model_mask` marking the model's own tokens (the objective's; the
observations are context only) — and graded by the environment when it ended.

Metrics per step (summed here per rank, averaged over every rank's episodes in the record, so
every one is per episode): turns, tool calls, failed tool calls, tool calls that timed out,
observation tokens and observations cut (`env_*_mean`), and the share of episodes by how they
ended (`env_end_*_frac`). Each episode's own account (its turns, how it ended, its
environment's error) goes to the step's samples (`EpisodeRollout.records`), and every
environment error of the round to `errors`, for the console and train.log.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.envs.episodes import ENDS, Episode, episode_fields
from tepo_cli.envs.problem_episodes import env_settings, problem_episodes, turn_sampler
from tepo_cli.rewards import Reward
from tepo_cli.rollout import Sampling
from tepo_cli.runtime.hooks import NO_HOOKS, RunHooks


@dataclasses.dataclass
class EpisodeRollout:
    """A multi-turn round: its rollout, each row's reward (its environment's), and the round's
    metric sums."""

    rollout: Rollout
    results: list[RewardResult]
    sums: dict[str, float]
    records: list[dict[str, Any]]  # per row: `episode_fields` (turns, end, error, ...)
    errors: list[str]  # the round's environment errors, one line each


def sample_episodes(
    cfg: TrainConfig,
    backend: Any,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    reward: Reward,
    sampling: Sampling,
    hooks: RunHooks = NO_HOOKS,
) -> EpisodeRollout:
    """`rollout.n` episodes per problem, each with its own environment; the prompt is the
    benchmark's, with the environment's instructions after the question."""
    assert cfg.rollout.max_new_tokens is not None  # resolved from the benchmark
    settings = env_settings(cfg.env, cfg.rollout.max_new_tokens)
    sampler = turn_sampler(backend, sampling, lambda: hooks.reached("episode"))
    episodes = problem_episodes(
        cfg.env, settings, cfg.benchmark, sampler, tokenizer, problems, reward, cfg.rollout.n
    )
    rollout = episodes_rollout(episodes, tokenizer.pad_token_id, tokenizer)
    device = getattr(backend, "device", None)
    if device is not None:
        rollout = rollout.to(device)
    results = [episode.reward or RewardResult(0.0, False, None) for episode in episodes]
    records = [episode_fields(episode) for episode in episodes]
    errors = [episode.error for episode in episodes if episode.error is not None]
    return EpisodeRollout(rollout, results, episode_sums(episodes), records, errors)


def episodes_rollout(
    episodes: list[Episode], pad_id: int, tokenizer: PreTrainedTokenizerBase
) -> Rollout:
    """The episodes as rows on the host: prompts left-padded, episodes right-padded."""
    rows = len(episodes)
    prompt_width = max(len(e.prompt_ids) for e in episodes)
    width = max(1, *(len(e.ids) for e in episodes))
    prompt_ids = torch.full((rows, prompt_width), pad_id, dtype=torch.long, device="cpu")
    prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.long, device="cpu")
    ids = torch.full((rows, width), pad_id, dtype=torch.long, device="cpu")
    present = torch.zeros((rows, width), dtype=torch.bool, device="cpu")
    model_mask = torch.zeros((rows, width), dtype=torch.bool, device="cpu")
    logprobs = torch.zeros((rows, width), dtype=torch.float32, device="cpu")
    for row, episode in enumerate(episodes):
        length, start = len(episode.ids), prompt_width - len(episode.prompt_ids)
        prompt_ids[row, start:] = torch.tensor(episode.prompt_ids, dtype=torch.long, device="cpu")
        prompt_mask[row, start:] = 1
        ids[row, :length] = torch.tensor(episode.ids, dtype=torch.long, device="cpu")
        present[row, :length] = True
        model_mask[row, :length] = torch.tensor(episode.model_mask, dtype=torch.bool, device="cpu")
        logprobs[row, :length] = torch.tensor(episode.logprobs, dtype=torch.float32, device="cpu")
    texts = tokenizer.batch_decode([e.ids for e in episodes], skip_special_tokens=True)
    truncated = torch.tensor([e.truncated for e in episodes], device="cpu")
    engine_logprobs = all(e.engine_logprobs for e in episodes)
    return Rollout(
        prompt_ids,
        prompt_mask,
        ids,
        present,
        texts,
        truncated,
        logprobs if engine_logprobs else None,
        model_mask,
    )


def episode_sums(episodes: list[Episode]) -> dict[str, float]:
    """This rank's sums of the episode metrics (the record divides by `episodes` over ranks)."""
    sums = {
        "episodes": float(len(episodes)),
        "env_turns": float(sum(len(e.turns) for e in episodes)),
        "env_tool_calls": float(sum(e.tool_calls for e in episodes)),
        "env_tool_failures": float(sum(sum(e.tool_failures.values()) for e in episodes)),
        "env_tool_timeouts": float(sum(e.tool_failures.get("timeout", 0) for e in episodes)),
        "env_observation_tokens": float(sum(e.observation_tokens for e in episodes)),
        "env_observations_cut": float(sum(e.observations_cut for e in episodes)),
    }
    for end in ENDS:
        sums[f"env_end_{end.replace('-', '_')}"] = float(sum(e.end == end for e in episodes))
    return sums
