"""A user's environment written from docs/guides/environments.md alone: guess the number (the
arith problem's answer), with per-episode state and a shaped reward; plus faulty variants, one
per way an environment goes wrong, which the run must survive and report."""

from __future__ import annotations

import re
import time

import hints  # beside this file

from tepo_cli.envs import Environment, Problem, RewardResult, register_environment

GUESS = re.compile(r"-?\d+")


@register_environment
class GuessNumber(Environment):
    name = "guess_number"
    instructions = "Answer with a number. If it is wrong you will hear whether it is too high."

    def __init__(self, problem: Problem, grader, settings) -> None:
        super().__init__(problem, grader, settings)
        self.guesses: list[int] = []

    def turn_end(self, text: str) -> int | None:
        # The turn stops after its first number; one without a number stops at 30 characters,
        # so a rambling player hears "Answer with a number." at once.
        found = GUESS.search(text)
        return min(30, len(text)) if found is None else found.end()

    def respond(self, turn: str) -> str | None:
        found = GUESS.search(turn)
        if found is None:
            return "Answer with a number."
        self.guesses.append(int(found.group()))
        answer = int(self.problem.answer)
        return None if self.guesses[-1] == answer else hints.hint(self.guesses[-1], answer)

    def reward(self, turns: list[str]) -> RewardResult:
        answer = int(self.problem.answer)
        last = str(self.guesses[-1]) if self.guesses else None
        correct = bool(self.guesses) and self.guesses[-1] == answer
        return RewardResult(hints.shaped(self.guesses, answer), correct, last)


@register_environment
class RaisesInInit(GuessNumber):
    name = "guess_raise_init"

    def __init__(self, problem: Problem, grader, settings) -> None:
        raise KeyError("no such board")


@register_environment
class RaisesInTurnEnd(GuessNumber):
    name = "guess_raise_turn_end"

    def turn_end(self, text: str) -> int | None:
        raise IndexError("turn_end fell over")


@register_environment
class RaisesInRespond(GuessNumber):
    name = "guess_raise_respond"

    def respond(self, turn: str) -> str | None:
        return str(1 / 0)


@register_environment
class RaisesInReward(GuessNumber):
    name = "guess_raise_reward"

    def reward(self, turns: list[str]) -> RewardResult:
        raise ValueError("the scorer is broken")


@register_environment
class Hangs(GuessNumber):
    name = "guess_hang"

    def respond(self, turn: str) -> str | None:
        time.sleep(3600)
        return None


@register_environment
class Malformed(GuessNumber):
    name = "guess_malformed"

    def respond(self, turn: str) -> str | None:
        return {"text": "too low"}  # type: ignore[return-value]
