"""`tepo eval env=...`: each sample is an episode — the model's turns and its environment's
observations (tepo_cli/envs/), as in training — graded by its environment when it ends.

Records have the one-answer records' keys (`completion` holds the whole episode after the
prompt, observations included; `length` the model's own tokens) and, per episode, its turns,
tool calls, how it ended and the environment's error (`envs.episodes.episode_fields`, which
training's samples.jsonl shares). Problems go `eval.batch_size // eval.n` at a time, so an
interrupted evaluation resumes after the last batch written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from tepo_cli.config.eval_schema import EvalConfig
from tepo_cli.core.records import Problem
from tepo_cli.envs.episodes import ENDS, Episode, episode_fields
from tepo_cli.envs.problem_episodes import env_settings, problem_episodes, turn_sampler
from tepo_cli.rewards import Reward


def episode_records(
    config: EvalConfig,
    backend: Any,
    tokenizer: Any,
    problems: list[Problem],
    reward: Reward,
    sampling: Any,
) -> Iterator[list[dict[str, Any]]]:
    """The graded episodes of `problems`, `eval.n` each, batch by batch."""
    settings = env_settings(config.env, config.turn_tokens)
    sampler = turn_sampler(backend, sampling)
    n = config.eval.n
    per_batch = max(1, config.eval.batch_size // n)
    for start in range(0, len(problems), per_batch):
        batch = problems[start : start + per_batch]
        episodes = problem_episodes(
            config.env, settings, config.benchmark, sampler, tokenizer, batch, reward, n
        )
        texts = tokenizer.batch_decode([e.ids for e in episodes], skip_special_tokens=True)
        yield [
            _record(batch[i // n], i % n, episode, text)
            for i, (episode, text) in enumerate(zip(episodes, texts, strict=True))
        ]


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
