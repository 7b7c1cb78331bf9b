"""The `env` group's typed settings: multi-turn episodes (tepo_cli/envs/); conf/env/*.yaml
documents each knob."""

from __future__ import annotations

from pydantic import Field, PrivateAttr, model_validator

from tepo_cli.config.strict import Strict

# Tokens a chat template spends framing one observation message (its role header and the next
# assistant header): room kept for them in the episode's default length.
FRAMING_ROOM = 32
# Turns of a multi-turn environment whose `env.max_turns` is not given (null): one answer, one
# observation, a second answer, and a third — the shipped environments' presets, and room to
# use feedback once more after acting on it. `single` is one turn.
DEFAULT_TURNS = 3


class EnvConfig(Strict):
    name: str = Field(default="single", min_length=1)  # a registered environment (tepo_cli.envs)
    # null: 1 for `single`, DEFAULT_TURNS for any other (said in the start line)
    max_turns: int | None = Field(default=None, ge=1)
    max_episode_tokens: int | None = Field(default=None, ge=1)
    max_observation_tokens: int = Field(default=128, ge=1)
    observation_role: str = Field(default="user", min_length=1)
    timeout_s: float = Field(default=5.0, gt=0.0)
    respond_timeout_s: float = Field(default=60.0, gt=0.0)
    # The held-out evaluation inside `tepo train` with a multi-turn environment plays one greedy
    # episode per problem of the first `eval_size` held-out problems (null: all of them).
    eval_size: int | None = Field(default=None, ge=1)
    _turns_defaulted: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _default_turns(self) -> EnvConfig:
        """`max_turns: null` becomes 1 for `single` and DEFAULT_TURNS for any other environment,
        so a plugin environment chosen with env.name= alone plays episodes, not one turn."""
        if self.max_turns is None:
            self.max_turns = DEFAULT_TURNS if self.multi_turn else 1
            self._turns_defaulted = self.multi_turn
        return self

    @property
    def turns(self) -> int:
        """`max_turns`, settled (never null after validation)."""
        assert self.max_turns is not None
        return self.max_turns

    @property
    def turns_defaulted(self) -> bool:
        """Whether `max_turns` was not given and a multi-turn environment got DEFAULT_TURNS."""
        return self._turns_defaulted

    @property
    def multi_turn(self) -> bool:
        """Whether episodes run (any environment but `single`, today's one answer per prompt)."""
        return self.name != "single"

    def row_tokens(self, turn_tokens: int) -> int:
        """The most tokens a row holds after its prompt: one answer (`turn_tokens`), or a whole
        episode of turns and observations (`episode_tokens`)."""
        return self.episode_tokens(turn_tokens) if self.multi_turn else turn_tokens

    def episode_tokens(self, turn_tokens: int) -> int:
        """Tokens after the prompt an episode may hold: `max_episode_tokens`, or room for every
        turn (`turn_tokens` each, rollout.max_new_tokens) and the observations between them."""
        if self.max_episode_tokens is not None:
            return self.max_episode_tokens
        observations = (self.turns - 1) * (self.max_observation_tokens + FRAMING_ROOM)
        return self.turns * turn_tokens + observations
