"""`env=single`: one answer per prompt, graded once — the rollouts tepo has always made."""

from __future__ import annotations

from tepo_cli.envs.environment_contract import Environment


class Single(Environment):
    """No observation: the episode is over after the first turn."""

    name = "single"

    def respond(self, turn: str) -> None:
        return None


ENVIRONMENT = Single
