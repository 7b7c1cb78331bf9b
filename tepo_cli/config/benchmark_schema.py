"""Typed schema of the `benchmark` group (conf/benchmark/): the knobs every benchmark shares
(schema.py re-exports BenchmarkConfig). A benchmark's own knobs (arith's `digits`, word_math's
`steps`, a plugin's) are the group's other keys: its registered `Benchmark.options` model
validates them (`BenchmarkConfig.own`), so a plugin benchmark can have knobs of its own."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tepo_cli.config.strict import Strict
from tepo_cli.core.errors import ConfigError

Options = TypeVar("Options", bound=BaseModel)


class BenchmarkConfig(Strict):
    model_config = ConfigDict(extra="allow")  # the benchmark's own knobs: see `own`

    name: str = Field(
        min_length=1
    )  # a registered benchmark (tepo_cli.benchmarks, checked at start)
    # datasets
    split: str = "test"
    train_split: str = "train"
    path: str | None = None
    hub_id: str | None = None
    allow_test_split: bool = False
    # all
    max_new_tokens: int = Field(default=16, ge=1)
    prompt: str = "What is {question}? Answer with just the number."
    system_prompt: str | None = None
    chat_template: bool = True

    @model_validator(mode="after")
    def _check_fields(self) -> BenchmarkConfig:
        if "{question}" not in self.prompt:
            raise ValueError("benchmark.prompt must contain the placeholder {question}")
        return self

    def own(self, options: type[Options]) -> Options:
        """The benchmark's own knobs (the keys beyond the shared ones) as `options`, its
        registered model, validates them; a ConfigError naming the key where one does not
        validate or is not the benchmark's."""
        knobs = dict(self.model_extra or {})
        try:
            return options.model_validate(knobs)
        except ValidationError as error:
            own = [key for key in options.model_fields]
            problems = []
            for item in error.errors():
                key = ".".join(str(part) for part in item["loc"])
                if item["type"] == "extra_forbidden":
                    problems.append(
                        f"benchmark.{key}: benchmark={self.name} has no such knob (its own: "
                        f"{', '.join(own)}; shared: {', '.join(self.shared_keys())})"
                    )
                else:
                    problems.append(f"benchmark.{key}: {item['msg'][:1].lower()}{item['msg'][1:]}")
            raise ConfigError("; ".join(problems) + ".") from None

    @classmethod
    def shared_keys(cls) -> list[str]:
        return list(cls.model_fields)

    def check_own(self, options: type[BaseModel] | None) -> None:
        """`own`'s check, and for a benchmark without knobs of its own (`options` None), a
        ConfigError naming any key set beyond the shared ones."""
        if options is not None:
            self.own(options)
        elif self.model_extra:
            raise ConfigError(
                f"{', '.join(f'benchmark.{key}' for key in sorted(self.model_extra))}: benchmark="
                f"{self.name} has no knobs of its own; its keys are "
                f"{', '.join(self.shared_keys())}."
            )
