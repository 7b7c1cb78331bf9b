"""Multi-turn episodes: the model's turns and the environment's observations, as token ids.

Every active episode's context (its prompt ids, then every turn and observation so far) goes to
the sampler as ids, and the ids it returns are kept as they are: what the trainer trains on is
exactly what was sampled. A turn ends at an end-of-message token; a turn cut by its token limit
ends the episode. After each turn the environments answer concurrently (sandboxed programs wait
on pipes), each bounded by `env.respond_timeout_s`. An environment that raises, answers
something other than text or None, or does not answer in time ends its episode with reward 0
and a counted reason; the run goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from tepo_cli.core.records import RewardResult
from tepo_cli.envs.base import Environment, EnvSettings
from tepo_cli.envs.observations import ObservationFormat

# Why an episode ended: the environment's None, a limit, or a failure of the environment.
ENDS = (
    "answer",
    "turn-limit",
    "turn-tokens",
    "episode-tokens",
    "env-error",
    "env-malformed",
    "env-timeout",
)
ENV_FAILURES = frozenset({"env-error", "env-malformed", "env-timeout"})


@dataclass
class SampledTurn:
    """One turn as the sampler returns it: its ids (with the end-of-message token when it
    ended), the engine's log-probs of them (None: the trainer's own model sampled), and
    whether it ended by itself (not by the token limit)."""

    ids: list[int]
    logprobs: list[float] | None
    ended: bool


TurnSampler = Callable[[list[list[int]], int], list[SampledTurn]]


@dataclass
class Episode:
    """One episode after its prompt: every token, who wrote it, and how it went."""

    prompt_ids: list[int]
    environment: Environment
    ids: list[int] = field(default_factory=list)
    from_model: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    end: str | None = None
    reward: RewardResult | None = None
    observation_tokens: int = 0
    observations_cut: int = 0
    unclosed: bool = False  # the last turn was stopped early: its end-of-message is not sampled
    engine_logprobs: bool = True  # every turn came with the engine's log-probs (vllm)

    @property
    def truncated(self) -> bool:
        """Whether a token limit (the turn's or the episode's) ended it."""
        return self.end in ("turn-tokens", "episode-tokens")

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.ids

    def add(self, ids: list[int], from_model: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.from_model += [from_model] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def run_episodes(
    sample: TurnSampler,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    environments: list[Environment],
    settings: EnvSettings,
) -> list[Episode]:
    """Run one episode per prompt to its end, and grade each once."""
    episodes = [Episode(list(p), env) for p, env in zip(prompt_ids, environments, strict=True)]
    framing = ObservationFormat(tokenizer, settings.observation_role)
    # Not a `with` block: its exit would wait for an environment that never returns.
    pool = ThreadPoolExecutor(max_workers=min(64, max(1, len(episodes))), thread_name_prefix="env")
    try:
        for turn in range(settings.max_turns):
            active = [e for e in episodes if e.end is None]
            if not active:
                break
            _take_turns(sample, tokenizer, active, settings)
            talking = [e for e in active if e.end is None]
            replies = _ask(pool, [(e.environment.respond, e.turns[-1]) for e in talking], settings)
            for episode, (reply, failure) in zip(talking, replies, strict=True):
                _observe(
                    episode, reply, failure, framing, settings, last=turn == settings.max_turns - 1
                )
        for episode in episodes:
            episode.end = episode.end or "turn-limit"
        graded = [e for e in episodes if e.end not in ENV_FAILURES]
        rewards = _ask(pool, [(e.environment.reward, e.turns) for e in graded], settings)
        for episode, (reward, failure) in zip(graded, rewards, strict=True):
            if failure is None and not isinstance(reward, RewardResult):
                failure = "env-malformed"
            if failure is not None:
                episode.end = failure
            else:
                episode.reward = reward
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    for episode in episodes:
        if episode.reward is None:
            episode.reward = RewardResult(0.0, False, None)
    return episodes


def _take_turns(
    sample: TurnSampler,
    tokenizer: PreTrainedTokenizerBase,
    active: list[Episode],
    settings: EnvSettings,
) -> None:
    """Each active episode's next turn, sampled from its context, kept as sampled."""
    budgets = [
        min(settings.max_turn_tokens, settings.max_episode_tokens - len(e.ids)) for e in active
    ]
    turns = sample([e.context for e in active], max(budgets))
    for episode, budget, turn in zip(active, budgets, turns, strict=True):
        ids = turn.ids[:budget]
        ended = turn.ended and len(ids) == len(turn.ids)
        stop = _early_stop(tokenizer, episode.environment, ids)
        if stop is not None:  # the environment ends the turn here (a closed code block)
            ids, ended = ids[:stop], True
            episode.unclosed = True  # its message still needs its end-of-message token
        logprobs = None if turn.logprobs is None else turn.logprobs[: len(ids)]
        episode.engine_logprobs &= logprobs is not None
        episode.add(ids, from_model=True, logprobs=logprobs)
        episode.turns.append(tokenizer.decode(ids, skip_special_tokens=True))
        if not ended:
            episode.end = "episode-tokens" if budget < settings.max_turn_tokens else "turn-tokens"


def _early_stop(
    tokenizer: PreTrainedTokenizerBase, environment: Environment, ids: list[int]
) -> int | None:
    """The fewest of the turn's tokens whose text reaches the environment's `turn_end`, when it
    names one before the turn's own end (None: the turn stands as sampled)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    end = environment.turn_end(text)
    if end is None or end >= len(text.rstrip()):
        return None
    low, high = 1, len(ids)  # the shortest prefix whose text holds the first `end` characters
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(ids[:middle], skip_special_tokens=True)) >= end:
            high = middle
        else:
            low = middle + 1
    return low if low < len(ids) else None


def _observe(
    episode: Episode,
    reply: Any,
    failure: str | None,
    framing: ObservationFormat,
    settings: EnvSettings,
    last: bool,
) -> None:
    """The environment's reply into the episode: its end, or the observation's tokens."""
    if failure is None and reply is not None and not isinstance(reply, str):
        failure = "env-malformed"
    if failure is not None:
        episode.end = failure
        return
    if reply is None:
        episode.end = "answer"
        return
    if last:
        episode.end = "turn-limit"  # no turn left to read the observation
        return
    ids, cut = framing.ids(reply, settings.max_observation_tokens)
    if episode.unclosed:  # close the stopped turn's message first: context, not the model's
        ids = [framing.tokenizer.eos_token_id, *ids]
        episode.unclosed = False
    if len(episode.ids) + len(ids) >= settings.max_episode_tokens:
        episode.end = "episode-tokens"
        return
    episode.add(ids, from_model=False)
    episode.observation_tokens += len(ids)
    episode.observations_cut += int(cut)


def _ask(
    pool: ThreadPoolExecutor, calls: list[tuple[Callable[[Any], Any], Any]], settings: EnvSettings
) -> list[tuple[Any, str | None]]:
    """Each (function, argument) called in the pool: (its result, None), or (None, why it
    failed). A call still running after the timeout is left to finish on its own thread."""
    futures = [pool.submit(function, argument) for function, argument in calls]
    deadline = time.monotonic() + settings.respond_timeout_s  # one for the whole batch
    results: list[tuple[Any, str | None]] = []
    for future in futures:
        try:
            results.append((future.result(timeout=max(0.0, deadline - time.monotonic())), None))
        except FutureTimeout:
            results.append((None, "env-timeout"))
        except Exception:  # the environment's own failure: its episode ends, the run goes on
            results.append((None, "env-error"))
    return results
