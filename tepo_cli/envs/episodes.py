"""Multi-turn episodes: the model's turns and the environment's observations, as token ids.

Every active episode's context (its prompt ids, then every turn and observation so far) goes to
the sampler as ids, and the ids it returns are kept as they are: what the trainer trains on is
exactly what was sampled. A turn ends at an end-of-message token; a turn cut by its token limit
ends the episode. After each turn the environments answer concurrently (sandboxed programs wait
on pipes), each bounded by `env.respond_timeout_s`. An environment whose hook raises
(`__init__`, `turn_end`, `respond`, `reward`, `tool_calls`, `tool_failures`), answers something
of the wrong type, or does not answer in time ends its episode with reward 0 and a counted
reason; the run goes on. The episode keeps one line saying which environment, which hook and
what went wrong (`Episode.error`), since a counter alone tells a user nothing to fix.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.envs.environment_contract import Environment, EnvSettings
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
    model_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    end: str | None = None
    reward: RewardResult | None = None
    observation_tokens: int = 0
    observations_cut: int = 0
    unclosed: bool = False  # the last turn was stopped early: its end-of-message is not sampled
    engine_logprobs: bool = True  # every turn came with the engine's log-probs (vllm)
    error: str | None = None  # the environment's failure, one line (`failure_line`)
    tool_calls: int = 0  # the environment's counts, read once when the episode is over
    tool_failures: dict[str, int] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        """Whether a token limit (the turn's or the episode's) ended it."""
        return self.end in ("turn-tokens", "episode-tokens")

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.ids

    def add(self, ids: list[int], by_model: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.model_mask += [by_model] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def fail(self, failure: str, error: str) -> None:
        """End the episode for its environment's failure (an `ENV_FAILURES` reason)."""
        self.end, self.error = failure, error


def episode_fields(episode: Episode) -> dict[str, Any]:
    """What a sample's record says of its episode (eval's samples.jsonl and training's): its
    turns, tool calls and failures, how it ended, and the environment's error (None: none)."""
    return {
        "turns": len(episode.turns),
        "tool_calls": episode.tool_calls,
        "tool_failures": sum(episode.tool_failures.values()),
        "end": episode.end,
        "error": episode.error,
    }


class Unmade(Environment):
    """Stands in for an environment whose constructor raised: its episode plays the model's
    first turn (a row always holds a response) and then ends with `env-error`."""

    name = "unmade"

    def __init__(self, made: str, error: str) -> None:  # no super(): there is nothing to hold
        self.calls, self.failures, self.made, self.error = 0, {}, made, error

    def respond(self, turn: str) -> None:
        return None


def make_environments(
    make: Callable[[Problem, Any, EnvSettings], Environment],
    problems: list[Problem],
    grader: Any,
    settings: EnvSettings,
) -> list[Environment]:
    """One environment per problem; a constructor that raises gives an `Unmade` in its place."""
    made: list[Environment] = []
    for problem in problems:
        try:
            made.append(make(problem, grader, settings))
        except Exception as exc:  # the user's class: its episode fails, the run goes on
            name = getattr(make, "name", getattr(make, "__name__", "?"))
            made.append(Unmade(name, failure_line(name, "__init__", exc)))
    return made


def failure_line(environment: str, hook: str, problem: BaseException | str) -> str:
    """One line naming the environment, its hook and what went wrong (an exception's type and
    message, or a sentence), at most 300 characters."""
    if isinstance(problem, BaseException):
        message = " ".join(str(problem).split())
        problem = f"raised {type(problem).__name__}" + (f": {message}" if message else "")
    line = f"environment {environment}: {hook} {problem}"
    return line if len(line) <= 300 else line[:297] + "..."


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
    for turn in range(settings.max_turns):
        active = [e for e in episodes if e.end is None]
        if not active:
            break
        _take_turns(sample, tokenizer, active, settings)
        for episode in active:
            if isinstance(episode.environment, Unmade) and episode.error is None:
                episode.fail("env-error", episode.environment.error)
        talking = [e for e in active if e.end is None]
        replies = _ask([(e, "respond", e.turns[-1]) for e in talking], settings)
        for episode, (reply, failure) in zip(talking, replies, strict=True):
            _observe(
                episode, reply, failure, framing, settings, last=turn == settings.max_turns - 1
            )
    for episode in episodes:
        episode.end = episode.end or "turn-limit"
    graded = [e for e in episodes if e.end not in ENV_FAILURES]
    rewards = _ask([(e, "reward", e.turns) for e in graded], settings)
    for episode, (reward, failure) in zip(graded, rewards, strict=True):
        if failure is None and not isinstance(reward, RewardResult):
            failure = (
                "env-malformed",
                f"returned {type(reward).__name__}, not a RewardResult "
                "(tepo_cli.core.records.RewardResult)",
            )
        if failure is not None:
            episode.fail(failure[0], _line(episode, "reward", failure[1]))
        else:
            episode.reward = reward
    for episode in episodes:
        _count_tools(episode)
        if episode.reward is None:
            episode.reward = RewardResult(0.0, False, None)
    return episodes


def _line(episode: Episode, hook: str, problem: BaseException | str) -> str:
    environment = episode.environment
    name = environment.made if isinstance(environment, Unmade) else type(environment).name
    return failure_line(name, hook, problem)


def _count_tools(episode: Episode) -> None:
    """The environment's tool counts, read once; a count hook that fails (or answers the wrong
    type) fails the episode like any other hook."""
    for hook in ("tool_calls", "tool_failures"):
        try:
            value = getattr(episode.environment, hook)()
        except Exception as exc:  # the user's override
            if episode.error is None:
                episode.fail("env-error", _line(episode, hook, exc))
                episode.reward = None
            continue
        wanted = int if hook == "tool_calls" else dict
        if not isinstance(value, wanted):
            if episode.error is None:
                problem = f"returned {type(value).__name__}, not {wanted.__name__}"
                episode.fail("env-malformed", _line(episode, hook, problem))
                episode.reward = None
            continue
        setattr(episode, hook, value)


def _take_turns(
    sample: TurnSampler,
    tokenizer: PreTrainedTokenizerBase,
    active: list[Episode],
    settings: EnvSettings,
) -> None:
    """Each active episode's next turn, sampled from its context, kept as sampled (up to where
    its environment's `turn_end` stops it)."""
    budgets = [
        min(settings.max_turn_tokens, settings.max_episode_tokens - len(e.ids)) for e in active
    ]
    turns = sample([e.context for e in active], max(budgets))
    kept = [turn.ids[:budget] for turn, budget in zip(turns, budgets, strict=True)]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in kept]
    ends = _ask([(e, "turn_end", t) for e, t in zip(active, texts, strict=True)], settings)
    for episode, budget, turn, ids, text, (end, failure) in zip(
        active, budgets, turns, kept, texts, ends, strict=True
    ):
        ended = turn.ended and len(ids) == len(turn.ids)
        if failure is None and not (end is None or type(end) is int):
            failure = ("env-malformed", f"returned {type(end).__name__}, not an int or None")
        stop = None if failure is not None else _early_stop(tokenizer, ids, text, end)
        if stop is not None:  # the environment ends the turn here (a closed code block)
            ids, ended = ids[:stop], True
            episode.unclosed = True  # its message still needs its end-of-message token
        logprobs = None if turn.logprobs is None else turn.logprobs[: len(ids)]
        episode.engine_logprobs &= logprobs is not None
        episode.add(ids, by_model=True, logprobs=logprobs)
        episode.turns.append(tokenizer.decode(ids, skip_special_tokens=True))
        if failure is not None:  # the turn is kept as sampled; the episode ends here
            episode.fail(failure[0], _line(episode, "turn_end", failure[1]))
        elif not ended:
            episode.end = "episode-tokens" if budget < settings.max_turn_tokens else "turn-tokens"


def _early_stop(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], text: str, end: int | None
) -> int | None:
    """The fewest of the turn's tokens whose text (`text`) reaches the environment's
    `turn_end` (`end`), when it names one before the turn's own end (None: the turn stands as
    sampled)."""
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
    failure: tuple[str, BaseException | str] | None,
    framing: ObservationFormat,
    settings: EnvSettings,
    last: bool,
) -> None:
    """The environment's reply into the episode: its end, or the observation's tokens."""
    if failure is None and reply is not None and not isinstance(reply, str):
        failure = ("env-malformed", f"returned {type(reply).__name__}, not str or None")
    if failure is not None:
        episode.fail(failure[0], _line(episode, "respond", failure[1]))
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
    episode.add(ids, by_model=False)
    episode.observation_tokens += len(ids)
    episode.observations_cut += int(cut)


Failure = tuple[str, BaseException | str]  # (an ENV_FAILURES reason, what went wrong)


# Environment calls running at once, at most (a shipped environment's call waits on a sandboxed
# program: this bounds the processes alive together).
_SLOTS = threading.BoundedSemaphore(64)


def _in_thread(function: Callable[[Any], Any], argument: Any) -> Future[Any]:
    """`function(argument)` on a daemon thread of its own: one that never returns is left
    behind, and neither the run nor the interpreter's exit waits for it (a thread pool's
    workers are joined at exit: a hanging environment would hang the finished run)."""
    future: Future[Any] = Future()

    def run() -> None:
        with _SLOTS:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(function(argument))
            except BaseException as exc:  # handed to the caller, which names it
                future.set_exception(exc)

    threading.Thread(target=run, name="env", daemon=True).start()
    return future


def _ask(
    calls: list[tuple[Episode, str, Any]], settings: EnvSettings
) -> list[tuple[Any, Failure | None]]:
    """Each (episode, hook, argument): the episode's environment's hook called on its own
    thread with the argument: (its result, None), or (None, (reason, what went wrong)). A call
    still running after the timeout is left to finish on its thread."""
    futures = [
        _in_thread(getattr(episode.environment, hook), argument)
        for episode, hook, argument in calls
    ]
    deadline = time.monotonic() + settings.respond_timeout_s  # one for the whole batch
    results: list[tuple[Any, Failure | None]] = []
    for future in futures:
        try:
            results.append((future.result(timeout=max(0.0, deadline - time.monotonic())), None))
        except FutureTimeout:
            late = f"did not answer within env.respond_timeout_s={settings.respond_timeout_s:g} s"
            results.append((None, ("env-timeout", late)))
        except Exception as exc:  # the environment's own failure: its episode ends, the run goes on
            results.append((None, ("env-error", exc)))
    return results
