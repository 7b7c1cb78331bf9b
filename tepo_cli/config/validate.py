"""Turn a composed Hydra config into a typed one, or into one paragraph saying what is wrong."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ValidationError

from tepo_cli.config.eval_schema import EvalConfig
from tepo_cli.config.launcher import parallel_job_threads
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.errors import ConfigError, describe_value

Model = TypeVar("Model", bound=BaseModel)

GROUPS = ("algo", "advantage", "model", "reward", "benchmark", "rollout", "deepspeed")


def load_train_config(
    cfg: DictConfig | Mapping[str, Any], choices: Mapping[str, str] | None = None
) -> TrainConfig:
    data = _plain(cfg)
    block_size = data.get("k")
    valid_k = isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1
    if valid_k and isinstance(data.get("algo"), dict):
        # `tepo train algo=NAME k=K`: any objective with K-token blocks as its action unit.
        data["algo"].update(unit="block", k=block_size)
    trainer = data.get("trainer")
    if isinstance(trainer, dict) and trainer.get("num_threads") is None:
        trainer["num_threads"] = parallel_job_threads()  # several sweep jobs share the cores
    return _validate(TrainConfig, data, "train", choices)


def load_eval_config(
    cfg: DictConfig | Mapping[str, Any], choices: Mapping[str, str] | None = None
) -> EvalConfig:
    data = _plain(cfg)
    if data.get("num_threads") is None:
        data["num_threads"] = parallel_job_threads()  # several sweep jobs share the cores
    return _validate(EvalConfig, data, "eval", choices)


def _plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    data.pop("hydra", None)
    return data  # type: ignore[return-value]


def _validate(
    model: type[Model], data: dict[str, Any], config_name: str, choices: Mapping[str, str] | None
) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(model, exc, config_name, choices or {})) from None


def _explain(
    model: type[BaseModel], exc: ValidationError, config_name: str, choices: Mapping[str, str]
) -> str:
    problems = [_explain_one(model, err, config_name, choices) for err in exc.errors()]
    head = (
        "Invalid configuration: "
        if len(problems) == 1
        else f"Invalid configuration ({len(problems)} problems): "
    )
    return head + " ".join(problems) + " Nothing was run."


def _explain_one(
    model: type[BaseModel], err: Mapping[str, Any], config_name: str, choices: Mapping[str, str]
) -> str:
    loc = [str(part) for part in err["loc"] if not str(part).startswith("function-after")]
    key = ".".join(loc)
    where = _doc_file(loc, config_name, choices)
    if err["type"] == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        allowed = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = f" Did you mean '{'.'.join([*loc[:-1], close[0]])}'?" if close else ""
        scope = f"under '{'.'.join(loc[:-1])}'" if len(loc) > 1 else "at the top level"
        return (
            f"unknown key '{key}' (value {describe_value(err['input'])}); the keys allowed {scope} "
            f"are: {', '.join(allowed)}.{hint}"
        )
    if err["type"] == "missing":
        return f"'{key}' is required but not set (see {where})."
    message = err["msg"][0].lower() + err["msg"][1:]
    message = message.removeprefix("value error, ")
    if not loc:  # a rule across groups (e.g. advantage x rollout): its message names the keys
        return f"{message} (see {where})."
    if loc[-1] not in _fields_of(model, loc[:-1]) or isinstance(err["input"], dict):
        return f"{key}: {message} (see {where})."
    return f"{key}={describe_value(err['input'])} is not allowed: {message} (see {where})."


def _fields_of(model: type[BaseModel], loc: list[str]) -> set[str]:
    parent = _model_at(model, loc)
    return set(parent.model_fields) if parent else set()


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        field = current.model_fields.get(part) if isinstance(current, type) else None
        if field is None:
            return None
        current = field.annotation
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _doc_file(loc: list[str], config_name: str, choices: Mapping[str, str]) -> str:
    if loc and loc[0] in GROUPS:
        choice = choices.get(loc[0])
        return f"conf/{loc[0]}/{choice}.yaml" if choice else f"the files in conf/{loc[0]}/"
    return f"conf/{config_name}.yaml"
