"""The environment contract: what a multi-turn episode asks of the task it runs in.

One `Environment` object per episode, made from the problem (as TRL's `environment_factory`
makes one per sample and SkyRL-gym's `init(prompt)` starts one). After each model turn the
rollout calls `respond(turn)`: the text of an observation, appended to the conversation as the
next message, or None when the episode is over (OpenEnv's `step` returning `terminated`,
verifiers' `env_response` and its stop conditions). When it is over — by the environment's
None, or by a turn or token limit — `reward(turns)` gives the episode's reward once (OpenEnv's
final reward, verifiers' rubric). That is all: the turns arrive as text, since an environment
reads what the model wrote; the token ids the trainer trains on never leave the rollout (no
decode and re-encode of the model's tokens between turns, the pitfall verl and SkyRL avoid by
keeping ids end to end). Tools are the environment's business: `python_tool` runs a code
block, `code_feedback` runs tests; a plugin may do anything in `respond`, but model-written code
runs only in tepo's sandbox (`tepo_cli/rewards/sandbox/`).

Why this and not more: observations as text cover TRL's tool methods and verl's agent loop
(both end in a message appended to the conversation), and a reward at the end covers every
verifiable-reward task; per-turn rewards, parallel tool calls and environment-held state beyond
the object itself are not needed by any built-in environment, and can be added without breaking
this contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.rewards import Reward


@dataclass(frozen=True)
class EnvSettings:
    """An environment's limits (the `env` config group).

    max_turns: model turns per episode (1: one answer, today's single-turn rollouts).
    max_turn_tokens: tokens the model may write in one turn.
    max_episode_tokens: tokens of the whole episode after the prompt (turns and observations).
    max_observation_tokens: an observation is cut to this many tokens (marked as cut).
    observation_role: the chat role observations are sent as ("user": every chat template has it).
    timeout_s: the wall-clock limit of one program the environment runs in the sandbox.
    respond_timeout_s: how long the rollout waits for `respond` or `reward` before it ends the
        episode with reward 0 (an environment that hangs never hangs the run).
    """

    max_turns: int = 3
    max_turn_tokens: int = 256
    max_episode_tokens: int = 768
    max_observation_tokens: int = 128
    observation_role: str = "user"
    timeout_s: float = 5.0
    respond_timeout_s: float = 60.0


class Environment(ABC):
    """One episode of a task. Subclasses set `name` and implement `respond`; `reward` grades
    the last turn with the task's own grader unless overridden. Every hook, its thread and what
    a failing one does to its episode: docs/guides/environments.md ("The contract"), which a
    user writes their environment from alone."""

    name: ClassVar[str]
    # Appended to the task's message (after a blank line): what the model must know to use the
    # environment (its tool, its feedback). Empty: the task's prompt as it is.
    instructions: ClassVar[str] = ""

    def __init__(self, problem: Problem, grader: Reward, settings: EnvSettings) -> None:
        self.problem = problem
        self.grader = grader
        self.settings = settings
        self.calls = 0  # tool calls so far (`count_call`)
        self.failures: dict[str, int] = {}  # failed tool calls by reason

    @abstractmethod
    def respond(self, turn: str) -> str | None:
        """The observation after the model's `turn` (its text), or None: the episode is over."""

    def turn_end(self, text: str) -> int | None:
        """Where the model's turn stops early, as a character offset into its `text` (None: at
        its end-of-message token or its token limit, as sampled). python_tool stops a turn at
        its first closed code block, so the program runs before the model writes on. The tokens
        after that point were sampled but are dropped; the ones kept are trained as sampled."""
        return None

    def reward(self, turns: list[str]) -> RewardResult:
        """The episode's reward, once, when it is over (`turns`: the model's, in order)."""
        return self.grader(turns[-1] if turns else "", self.problem)

    def count_call(self, failure: str | None = None) -> None:
        """A tool call, and why it failed (None: it did not), for the step's metrics."""
        self.calls += 1
        if failure is not None:
            self.failures[failure] = self.failures.get(failure, 0) + 1

    def tool_calls(self) -> int:
        """Tool calls made so far (counted in the step's metrics)."""
        return self.calls

    def tool_failures(self) -> dict[str, int]:
        """Tool calls that failed so far, by reason (the sandbox's: "timeout", "exit-code", ...)."""
        return dict(self.failures)


def contract_problem(candidate: object) -> str | None:
    """Why `candidate` is not an environment class (None: it is one), in one sentence."""
    if not isinstance(candidate, type) or not issubclass(candidate, Environment):
        return f"{candidate!r} is not a subclass of tepo_cli.envs.Environment"
    name = getattr(candidate, "name", None)
    if not isinstance(name, str) or not name:
        return f"{candidate.__name__} sets no `name` (a class attribute: the env= value)"
    missing = sorted(getattr(candidate, "__abstractmethods__", ()))
    if missing:
        return f"{candidate.__name__} does not implement {', '.join(missing)}"
    return None
