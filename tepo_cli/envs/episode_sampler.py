"""The sampler of an environment that takes turns (any `env` but `single`): one episode per
sample, run by the environment (this package), graded by it when it ended.

In training each episode is one row — the prompt, then every turn and observation, with
`model_mask` marking the model's own tokens (the objective's; the observations are context
only). Metrics per step (summed here per rank, averaged over every rank's episodes in the
record by train/step_records.py, so every one is per episode): turns, tool calls, failed tool
calls, tool calls that timed out, observation tokens and observations cut (`env_*_mean`), and
the share of episodes by how they ended (`env_end_*_frac`). Each episode's own account (its
turns, how it ended, its environment's error) goes to the step's samples and to `tepo eval`'s
records (`episode_fields`), and every environment error to `Samples.errors`, for the console
and train.log.

`tepo eval` records have the one-answer records' keys (`completion` holds the whole episode
after the prompt, observations included; `length` the model's own tokens) and the episode's
account. Problems go `eval.batch_size // eval.n` at a time, so an interrupted evaluation
resumes after the last batch written.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.config.schema import BenchmarkConfig, TrainerConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.envs.env_start import environment_line
from tepo_cli.envs.episodes import ENDS, Episode, TurnSampler, episode_fields
from tepo_cli.envs.problem_episodes import env_settings, problem_episodes, turn_sampler
from tepo_cli.envs.samples import HeldOut, Samples
from tepo_cli.rewards import Reward


class Episodes:
    """The benchmark's prompt with the environment's instructions after the question; turns of
    at most `turn_tokens` tokens each."""

    def __init__(self, env: EnvConfig, benchmark: BenchmarkConfig, turn_tokens: int) -> None:
        self.env, self.benchmark = env, benchmark
        self.settings = env_settings(env, turn_tokens)

    def _episodes(
        self,
        turns: TurnSampler,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        reward: Reward,
        n: int,
    ) -> list[Episode]:
        """`n` episodes per problem, run to their ends; `turns` samples each turn."""
        return problem_episodes(
            self.env, self.settings, self.benchmark, turns, tokenizer, problems, reward, n
        )

    def sample(
        self,
        backend: Any,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        reward: Reward,
        sampling: Any,
        after_turn: Callable[[], None] | None = None,
    ) -> Samples:
        """`sampling.n` episodes per problem, each with its own environment, graded by it."""
        turns = turn_sampler(backend, sampling, after_turn)
        episodes = self._episodes(turns, tokenizer, problems, reward, sampling.n)
        rollout = episodes_rollout(episodes, tokenizer.pad_token_id, tokenizer)
        device = getattr(backend, "device", None)
        if device is not None:
            rollout = rollout.to(device)
        results = [episode.reward or RewardResult(0.0, False, None) for episode in episodes]
        records = [episode_fields(episode) for episode in episodes]
        errors = [episode.error for episode in episodes if episode.error is not None]
        return Samples(rollout, results, records, episode_sums(episodes), errors)

    def records(
        self,
        backend: Any,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        reward: Reward,
        sampling: Any,
    ) -> Iterator[list[dict[str, Any]]]:
        """The graded episodes of `problems`, `sampling.n` each, batch by batch."""
        turns = turn_sampler(backend, sampling)
        n = sampling.n
        per_batch = max(1, sampling.batch_size // n)
        for start in range(0, len(problems), per_batch):
            batch = problems[start : start + per_batch]
            episodes = self._episodes(turns, tokenizer, batch, reward, n)
            texts = tokenizer.batch_decode([e.ids for e in episodes], skip_special_tokens=True)
            yield [
                _record(batch[i // n], i % n, episode, text)
                for i, (episode, text) in enumerate(zip(episodes, texts, strict=True))
            ]

    def held_out(
        self,
        backend: Any,
        tokenizer: PreTrainedTokenizerBase,
        problems: list[Problem],
        padding: list[Problem],
        reward: Reward,
        sampling: Any,
    ) -> HeldOut:
        """One greedy episode per problem, all in one round; the environment errors of the real
        problems (the padding's are not counted). No answers are logged: an episode's account
        is in the training samples."""
        began = time.perf_counter()
        round_ = self.sample(backend, tokenizer, problems + padding, reward, sampling)
        real = len(problems)
        errors = [r["error"] for r in round_.records[:real] if r["error"] is not None]
        assert round_.results is not None  # graded by the environments
        solved = float(sum(result.correct for result in round_.results[:real]))
        return HeldOut(solved, real, [], errors, time.perf_counter() - began)

    def held_out_problems(self, task: Any) -> list[Problem]:
        """The first `env.eval_size` held-out problems (all when null): each is a whole
        episode, several generations long."""
        limit = self.env.eval_size
        return task.eval_problems() if limit is None else task.eval_problems(limit)

    def summary(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The environment, its turn limit, and the episodes' means and ends."""
        env = {"name": self.env.name, "max_turns": self.env.max_turns}
        return {"env": {**env, **episode_summary(records)}}

    def start_line(self, trainer: TrainerConfig, task: Any) -> str:
        """The turns an episode may take and what the held-out evaluation will cost
        (envs/env_start.py), so nobody waits on it without a word."""
        evaluates = trainer.eval_before or trainer.eval_after or trainer.eval_every
        count = len(self.held_out_problems(task)) if evaluates else 0
        return environment_line(self.env, trainer, count)


def _record(problem: Problem, sample: int, episode: Episode, text: str) -> dict[str, Any]:
    result = episode.reward
    return {
        "id": problem.id,
        "sample": sample,
        "completion": text,
        "answer": problem.answer,
        "extracted": None if result is None else result.extracted,
        "reward": 0.0 if result is None else result.reward,
        "passed": False if result is None else result.correct,
        "length": sum(episode.model_mask),
        "truncated": episode.truncated,
        **episode_fields(episode),
    }


def episode_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Means per episode and the share of episodes by how they ended (for summary.json)."""
    count = max(1, len(records))
    ends = Counter(record.get("end") for record in records)
    return {
        "turns_mean": sum(r.get("turns", 0) for r in records) / count,
        "tool_calls_mean": sum(r.get("tool_calls", 0) for r in records) / count,
        "tool_failures_mean": sum(r.get("tool_failures", 0) for r in records) / count,
        "ends": {end: ends.get(end, 0) / count for end in ENDS},
    }


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
