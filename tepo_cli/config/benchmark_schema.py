"""Typed schema of the `benchmark` group (conf/benchmark/): the knobs every benchmark shares and
those of the generated ones, arith and word_math (schema.py re-exports BenchmarkConfig)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from tepo_cli.config.strict import Strict, without

# The knobs of the generated benchmarks, and which benchmarks each applies to: set for another
# benchmark they would be read by nothing, so they are refused (and left out of a dump).
_GENERATED_KEYS: dict[str, tuple[str, ...]] = {
    "operations": ("arith",),
    "digits": ("arith",),
    "steps": ("word_math",),
    "step_weights": ("word_math",),
    "step_ops": ("word_math",),
    "start_range": ("word_math",),
    "operand_range": ("word_math",),
    "factor_range": ("word_math",),
    "max_value": ("word_math",),
    "eval_size": ("arith", "word_math"),
    "eval_seed": ("arith", "word_math"),
}

WordOp = Literal["add", "sub", "mul", "div"]
StepCount = Annotated[int, Field(ge=1, le=6)]
NumberRange = tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]


class BenchmarkConfig(Strict):
    name: str = Field(
        min_length=1
    )  # a registered benchmark (tepo_cli.benchmarks, checked at start)
    # arith (generated)
    operations: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+"], min_length=1)
    digits: int = Field(default=1, ge=1, le=6)
    # word_math (generated); data/word_math_problems.py checks how the values fit together
    steps: list[StepCount] = Field(default_factory=lambda: [1, 2, 3, 4], min_length=1)
    step_weights: list[Annotated[float, Field(ge=0.0)]] = Field(
        default_factory=lambda: [0.4, 0.3, 0.2, 0.1], min_length=1
    )
    step_ops: list[WordOp] = Field(
        default_factory=lambda: ["add", "sub", "mul", "div"], min_length=1
    )
    start_range: NumberRange = (2, 12)
    operand_range: NumberRange = (1, 6)
    factor_range: NumberRange = (2, 3)
    max_value: int = Field(default=60, ge=1)
    # both generated benchmarks
    eval_size: int = Field(default=100, ge=1)
    eval_seed: int = 1234
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
        misplaced: dict[tuple[str, ...], list[str]] = {}
        for key in sorted(self.model_fields_set & set(_GENERATED_KEYS)):
            if self.name not in _GENERATED_KEYS[key]:
                misplaced.setdefault(_GENERATED_KEYS[key], []).append(f"benchmark.{key}")
        if misplaced:
            raise ValueError(
                "; ".join(
                    f"{', '.join(keys)} only apply to benchmark={' or '.join(owners)}"
                    for owners, keys in misplaced.items()
                )
            )
        return self

    @model_serializer(mode="wrap")
    def _applicable_knobs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A dump (a run's config.yaml) holds the knobs that apply, so it validates again."""
        foreign = [key for key, owners in _GENERATED_KEYS.items() if self.name not in owners]
        return without(handler(self), foreign)
