"""Typed schema of `tepo eval` configs: the groups it shares with `tepo train` (config/schema.py)
and its own sampling options (`eval.*`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.config.schema import (
    BenchmarkConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    Strict,
    check_stop_with_episodes,
    resolve_engine_length,
)


class EvalOptions(Strict):
    limit: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    greedy: bool = True
    temperature: float = Field(default=0.7, gt=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_new_tokens: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=64, ge=1)
    pass_k: list[int] = Field(default_factory=lambda: [1, 5, 10])

    @model_validator(mode="after")
    def _check_greedy(self) -> EvalOptions:
        if self.greedy and self.n > 1:
            raise ValueError("eval.n > 1 needs sampling: set eval.greedy=false")
        return self


class EvalConfig(Strict):
    seed: int = 0
    model: ModelConfig
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)  # the back-end; eval.* samples
    benchmark: BenchmarkConfig
    reward: RewardConfig
    eval: EvalOptions = Field(default_factory=EvalOptions)
    env: EnvConfig = Field(default_factory=EnvConfig)  # multi-turn episodes (tepo_cli/envs/)
    num_threads: int | None = Field(default=None, ge=1)
    plugins: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _engine_length(self) -> EvalConfig:
        # the engine holds one answer, or a whole episode, after the prompt
        resolve_engine_length(self.rollout.engine, self.env.row_tokens(self.turn_tokens))
        check_stop_with_episodes(self.rollout, self.env)
        return self

    @property
    def turn_tokens(self) -> int:
        """The most tokens one answer (one turn of an episode) may hold."""
        return self.eval.max_new_tokens or self.benchmark.max_new_tokens
