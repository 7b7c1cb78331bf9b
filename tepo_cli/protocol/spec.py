"""`protocol.yaml`: a pre-registered experiment, fixed before its first run.

The file names everything a verdict depends on — the arms as Hydra override sets, the seeds, the
run order, the primary metrics with the direction each is expected to move, the test, α and the
multiplicity correction — so that neither the runs nor the report can choose them after seeing
data. The runner (`tepo protocol run`) trains exactly `Protocol.runs()`; the report computes
exactly `primaries`. Loading is strict: an unknown key or an impossible value is refused with one
paragraph naming the file and the key, since a silently ignored key would change what was
registered.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tepo_cli.core.errors import ConfigError, describe_value

ARM_NAME = re.compile(r"^[a-z0-9_]+$")
# Keys the runner sets itself on every run: a protocol setting them would fight the runner.
RUNNER_KEYS = ("seed", "resume", "hydra.run.dir")
TESTS = ("welch", "paired", "logrank", "mcnemar")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Gate(_Strict):
    """A precondition of a primary, checked on `seeds` of `arm` before the comparison counts
    (e.g. GRPO's entropy must first fall by 20 % for an entropy claim to be testable)."""

    arm: StrictStr
    seeds: list[StrictInt] = Field(min_length=1)
    metric: StrictStr
    params: dict[str, Any] = Field(default_factory=dict)
    at_most: StrictFloat | StrictInt | None = None
    at_least: StrictFloat | StrictInt | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> Gate:
        if (self.at_most is None) == (self.at_least is None):
            raise ValueError("a gate needs exactly one bound: 'at_most' or 'at_least'")
        return self


class Comparison(_Strict):
    """One registered comparison: `metric` (with `params`) of `treatment` against `control`."""

    name: StrictStr
    metric: StrictStr
    params: dict[str, Any] = Field(default_factory=dict)
    treatment: StrictStr
    control: StrictStr
    direction: Literal["greater", "less", "two-sided"]
    test: Literal["welch", "paired", "logrank", "mcnemar"]
    gate: Gate | None = None

    @model_validator(mode="after")
    def _two_arms(self) -> Comparison:
        if self.treatment == self.control:
            raise ValueError(
                f"treatment and control are the same arm ({self.treatment!r}); "
                "a comparison needs two"
            )
        return self


class Run(NamedTuple):
    """One run as it will train: its directory name and the overrides after `tepo train`."""

    name: str
    overrides: list[str]


class Protocol(_Strict):
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: StrictStr = ""
    commit: StrictStr | None = None
    base: list[StrictStr] = Field(default_factory=list)
    arms: dict[StrictStr, list[StrictStr]] = Field(min_length=1)
    # arm -> another protocol file (relative to this one) whose published runs of that arm are
    # this protocol's: never trained here (tepo_cli/protocol/reuse.py checks they are the same runs)
    reuse: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    seeds: list[StrictInt] = Field(min_length=1)
    order: Literal["interleaved", "arm_major"] = "interleaved"
    first_run_only: list[StrictStr] = Field(default_factory=list)
    other_runs: list[StrictStr] = Field(default_factory=list)
    alpha: StrictFloat = Field(gt=0, lt=1)
    correction: Literal["holm", "bonferroni", "none"]
    primaries: list[Comparison] = Field(min_length=1)
    secondaries: list[Comparison] = Field(default_factory=list)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, arms: dict[str, list[str]]) -> dict[str, list[str]]:
        for arm in arms:
            if not ARM_NAME.match(arm):
                raise ValueError(f"arm name {arm!r} is not allowed: use [a-z0-9_]+")
        return arms

    @field_validator("commit")
    @classmethod
    def _commit_hash(cls, commit: str | None) -> str | None:
        if commit is not None and not re.fullmatch(r"[0-9a-f]{7,40}", commit):
            raise ValueError("a commit is 7 to 40 lowercase hex digits (git rev-parse HEAD)")
        return commit

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
        if repeated:
            raise ValueError(f"seeds repeat: {repeated}; each seed is one run per arm")
        return seeds

    @model_validator(mode="after")
    def _references(self) -> Protocol:
        _check_overrides("base", self.base)
        for arm, overrides in self.arms.items():
            _check_overrides(f"arms.{arm}", overrides)
        for arm in self.reuse:
            self._check_arm(f"reuse.{arm}", arm)
        if self.reuse and set(self.reuse) == set(self.arms):
            raise ValueError(
                "reuse: every arm is reused, so nothing would train here; a protocol registers "
                "runs that are still to come (reuse the arms it is compared against)"
            )
        _check_overrides("first_run_only", self.first_run_only)
        _check_overrides("other_runs", self.other_runs)
        names: set[str] = set()
        for group in ("primaries", "secondaries"):
            for index, comparison in enumerate(getattr(self, group)):
                where = f"{group}[{index}]"
                if comparison.name in names:
                    raise ValueError(f"{where}.name: {comparison.name!r} is used twice")
                names.add(comparison.name)
                for role in ("treatment", "control"):
                    self._check_arm(f"{where}.{role}", getattr(comparison, role))
                gate = comparison.gate
                if gate is None:
                    continue
                self._check_arm(f"{where}.gate.arm", gate.arm)
                outside = [seed for seed in gate.seeds if seed not in self.seeds]
                if outside:
                    raise ValueError(
                        f"{where}.gate.seeds: {outside} are not among the protocol's seeds "
                        f"{self.seeds}"
                    )
        return self

    def _check_arm(self, where: str, arm: str) -> None:
        if arm not in self.arms:
            raise ValueError(
                f"{where}: arm {arm!r} is not one of the arms ({', '.join(self.arms)})"
            )

    @staticmethod
    def run_name(arm: str, seed: int) -> str:
        return f"{arm}_seed{seed}"

    def runs(self) -> list[Run]:
        """Every run, in the order it trains, with its full override list.

        interleaved: seed outer, arms inner, so an interrupted experiment has the same number of
        seeds in every arm; arm_major: one arm's seeds after another. The first run alone gets
        `first_run_only` (e.g. the step-0 evaluation, the same for every run of a shared start).
        """
        if self.order == "interleaved":
            pairs = [(arm, seed) for seed in self.seeds for arm in self.arms]
        else:
            pairs = [(arm, seed) for arm in self.arms for seed in self.seeds]
        return [
            Run(
                self.run_name(arm, seed),
                [
                    *self.base,
                    *self.arms[arm],
                    f"seed={seed}",
                    *(self.first_run_only if index == 0 else self.other_runs),
                ],
            )
            for index, (arm, seed) in enumerate(pairs)
        ]

    def comparisons(self) -> list[Comparison]:
        return [*self.primaries, *self.secondaries]

    def metric_names(self) -> list[str]:
        """Every metric the protocol names (comparisons and gates), first use first: the hook the
        report validates against its metric registry before computing anything."""
        names: list[str] = []
        for comparison in self.comparisons():
            for metric in (
                comparison.metric,
                comparison.gate.metric if comparison.gate else None,
            ):
                if metric is not None and metric not in names:
                    names.append(metric)
        return names


def _check_overrides(where: str, overrides: list[str]) -> None:
    for override in overrides:
        key, equals, _ = override.partition("=")
        if not equals and not override.startswith("~"):
            raise ValueError(f"{where}: {override!r} is not a Hydra override (key=value)")
        if key.lstrip("+~") in RUNNER_KEYS:
            raise ValueError(
                f"{where}: {override!r} sets a key the runner sets on every run "
                f"({', '.join(RUNNER_KEYS)}); seeds go under 'seeds'"
            )


def override_difference(first: list[str], second: list[str], names: tuple[str, str]) -> str | None:
    """None where two runs' overrides are the same set (order aside), else "only <name 1>: ...;
    only <name 2>: ..." in the words of the message that says which run was made differently."""
    if sorted(first) == sorted(second):
        return None
    only_first = " ".join(o for o in first if o not in second) or "nothing"
    only_second = " ".join(o for o in second if o not in first) or "nothing"
    return f"only {names[0]}: {only_first}; only {names[1]}: {only_second}"


def published_dir(protocol_path: Path) -> Path:
    """Where a protocol's finished runs' records are published by default: runs/ beside its file
    (`tepo protocol run --results-dir`), which `tepo report --protocol` reads by default."""
    return protocol_path.parent / "runs"


def load_protocol(path: str | Path) -> Protocol:
    """Read and validate a protocol file; any mistake is one ConfigError naming file and key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(
            f"Cannot read the protocol file {path}: {error.strerror or error}. Nothing was run."
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(
            f"The protocol file {path} is not valid YAML{where}: {problem}. Nothing was run."
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"The protocol file {path} must be a mapping of keys (name, arms, seeds, primaries, "
            f"...), not {type(data).__name__}. Nothing was run."
        )
    try:
        return Protocol.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_explain(path, error)) from None


def _explain(path: Path, error: ValidationError) -> str:
    problems = [_explain_one(err) for err in error.errors()]
    head = (
        f"Invalid protocol file {path}: "
        if len(problems) == 1
        else f"Invalid protocol file {path} ({len(problems)} problems): "
    )
    return head + " ".join(problems) + " Nothing was run."


def _explain_one(err: Any) -> str:
    key = _key(err["loc"])
    message = err["msg"][0].lower() + err["msg"][1:]
    message = message.removeprefix("value error, ")
    if err["type"] == "extra_forbidden":
        parent = _key(err["loc"][:-1])
        scope = f"under '{parent}'" if parent else "at the top level"
        allowed = _allowed(err["loc"][:-1])
        return f"unknown key '{key}' {scope}; the keys allowed there are: {', '.join(allowed)}."
    if err["type"] == "missing":
        return f"'{key}' is required but not set."
    scalar = isinstance(err["input"], (str, int, float))
    if not key or (err["type"] == "value_error" and not scalar):  # a rule over several values
        return f"{key + ': ' if key and not message.startswith(key) else ''}{message}."
    return f"{key}={describe_value(err['input'])} is not allowed: {message}."


def _key(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not str(part).startswith(("function-", "constrained-")):
            text += f".{part}" if text else str(part)
    return text


def _allowed(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Protocol
    for part in loc:
        if part in ("primaries", "secondaries"):
            model = Comparison
        elif part == "gate":
            model = Gate
    return list(model.model_fields)
