"""The `env` group's typed settings: multi-turn episodes (tepo_cli/envs/); conf/env/*.yaml
documents each knob."""

from __future__ import annotations

from pydantic import Field

from tepo_cli.config.strict import Strict

# Tokens a chat template spends framing one observation message (its role header and the next
# assistant header): room kept for them in the episode's default length.
FRAMING_ROOM = 32


class EnvConfig(Strict):
    name: str = Field(default="single", min_length=1)  # a registered environment (tepo_cli.envs)
    max_turns: int = Field(default=1, ge=1)
    max_episode_tokens: int | None = Field(default=None, ge=1)
    max_observation_tokens: int = Field(default=128, ge=1)
    observation_role: str = Field(default="user", min_length=1)
    timeout_s: float = Field(default=5.0, gt=0.0)
    respond_timeout_s: float = Field(default=60.0, gt=0.0)

    @property
    def multi_turn(self) -> bool:
        """Whether episodes run (any environment but `single`, today's one answer per prompt)."""
        return self.name != "single"

    def episode_tokens(self, turn_tokens: int) -> int:
        """Tokens after the prompt an episode may hold: `max_episode_tokens`, or room for every
        turn (`turn_tokens` each, rollout.max_new_tokens) and the observations between them."""
        if self.max_episode_tokens is not None:
            return self.max_episode_tokens
        observations = (self.max_turns - 1) * (self.max_observation_tokens + FRAMING_ROOM)
        return self.max_turns * turn_tokens + observations
