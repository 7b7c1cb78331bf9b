"""Episodes for a list of problems: each problem's benchmark prompt with the environment's
instructions after the question, n episodes per problem, each with an environment of its own —
what `tepo train` and `tepo eval env=...` both run (envs/episode_sampler.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.records import Problem
from tepo_cli.data.prompt_templates import render_prompt
from tepo_cli.envs import Environment, EnvSettings, environment
from tepo_cli.envs.episodes import (
    Episode,
    SampledTurn,
    TurnSampler,
    make_environments,
    run_episodes,
)
from tepo_cli.rewards import Reward


def env_settings(env: EnvConfig, turn_tokens: int) -> EnvSettings:
    """The environment's limits from the `env` group; a turn holds at most `turn_tokens`."""
    return EnvSettings(
        max_turns=env.turns,
        max_turn_tokens=turn_tokens,
        max_episode_tokens=env.episode_tokens(turn_tokens),
        max_observation_tokens=env.max_observation_tokens,
        observation_role=env.observation_role,
        timeout_s=env.timeout_s,
        respond_timeout_s=env.respond_timeout_s,
    )


def problem_episodes(
    env: EnvConfig,
    settings: EnvSettings,
    benchmark: BenchmarkConfig,
    sampler: TurnSampler,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    reward: Reward,
    n: int,
) -> list[Episode]:
    """`n` episodes per problem, problem by problem, run to their ends."""
    make = environment(env.name)
    prompts = [render_prompt(tokenizer, benchmark, with_instructions(p, make)) for p in problems]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    rows = [list(prompt_ids[i // n]) for i in range(len(prompts) * n)]
    envs = make_environments(make, [problems[i // n] for i in range(len(rows))], reward, settings)
    return run_episodes(sampler, tokenizer, rows, envs, settings)


def with_instructions(problem: Problem, make: type[Environment]) -> str:
    """The question the prompt template gets: the problem's, then the environment's
    instructions (when it has any) after a blank line."""
    if not make.instructions:
        return problem.question
    return f"{problem.question}\n\n{make.instructions}"


def turn_sampler(
    backend: Any, sampling: Any, after_turn: Callable[[], None] | None = None
) -> TurnSampler:
    """The back-end's `sample_turns`, one call per turn (`sampling`: a rollout `Sampling`); an
    engine with per-request seeds gets a fresh block of seeds each turn, so a rerun samples the
    same turns. `after_turn` runs after each (the trainer's fault-injection point)."""
    calls = 0

    def sample(contexts: list[list[int]], max_new_tokens: int) -> list[SampledTurn]:
        nonlocal calls
        seed = None if sampling.seed is None else sampling.seed + calls * len(contexts) * 7919
        calls += 1
        one = dataclasses.replace(sampling, n=1, seed=seed)
        turns = backend.sample_turns(contexts, max_new_tokens, one)
        if after_turn is not None:
            after_turn()
        return turns

    return sample
