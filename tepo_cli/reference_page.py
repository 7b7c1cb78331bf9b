"""The configuration reference (docs/reference/configuration.md), generated, never written by hand.

Every key of every config group, with its type, default and allowed values from the typed schema
(config/: schema.py, benchmark_schema.py, rollout_schema.py, env_schema.py, eval_schema.py;
algos/algo_config.py; each registered benchmark's own options model) and its meaning from the YAML
comment beside it in conf/ (docs/design.md: each group's YAML documents its knobs). The docs build runs
`write` (mkdocs.yml names this module as a hook: `on_pre_build`); tests/test_docs_site.py fails
when a key has no comment or the committed page differs from what this module renders.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from omegaconf import OmegaConf
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.benchmarks import benchmarks
from tepo_cli.config.added_keys import preset_keys
from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.config.eval_schema import EvalConfig, EvalOptions
from tepo_cli.config.schema import (
    AdvantageConfig,
    BenchmarkConfig,
    DeepSpeedConfig,
    KernelConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
)

CONF = Path(str(resources.files("tepo_cli.conf")))  # the repository's conf/ (setup.py)
PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "configuration.md"  # checkout
MISSING = object()
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<rest>.*)$")


@dataclass(frozen=True)
class Group:
    """One section of the page: a key prefix, its schema model and where its YAML lives."""

    prefix: str  # "algo", "trainer", ...: keys are written prefix.key
    model: type[BaseModel] | tuple[type[BaseModel], ...]  # several: their keys, first one wins
    options: str | None  # the group's folder under conf/ (choices: algo=dapo), or None
    files: tuple[str, ...]  # YAML files (under conf/) whose comments document the keys
    title: str


GROUPS = (
    Group("algo", AlgoConfig, "algo", ("algo/_base.yaml", "algo/*.yaml"), "the objective"),
    Group("advantage", AdvantageConfig, "advantage", ("advantage/*.yaml",), "advantage estimator"),
    Group("model", ModelConfig, "model", ("model/*.yaml", "train.yaml"), "the policy"),
    Group("reward", RewardConfig, "reward", ("reward/*.yaml",), "the grader"),
    Group(
        "benchmark",
        (BenchmarkConfig, *(b.options for b in benchmarks().values() if b.options)),
        "benchmark",
        ("benchmark/*.yaml",),
        "prompts and data",
    ),
    Group("rollout", RolloutConfig, "rollout", ("rollout/*.yaml",), "generation"),
    Group("deepspeed", DeepSpeedConfig, "deepspeed", ("deepspeed/*.yaml",), "ZeRO and offload"),
    Group("env", EnvConfig, "env", ("env/*.yaml",), "multi-turn episodes"),
    Group("kernel", KernelConfig, None, ("train.yaml",), "the log-prob path"),
    Group("trainer", TrainerConfig, None, ("train.yaml",), "the training loop"),
    Group("eval", EvalOptions, None, ("eval.yaml",), "`tepo eval`'s sampling"),
)


@dataclass(frozen=True)
class Key:
    name: str  # dotted, with the group's prefix
    type: str
    default: str
    allowed: str
    comment: str


def yaml_comments(path: Path, prefix: str = "") -> dict[str, str]:
    """Dotted key → its comment in one YAML file: the text after `#` on the key's line, joined
    with the comment-only lines indented under it (the files wrap long comments that way)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    last: str | None = None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if last is not None and line.startswith(" "):
                comments[last] = f"{comments[last]} {stripped[1:].strip()}".strip()
            continue
        match = KEY_LINE.match(line)
        if match is None:
            last = None if stripped and not stripped.startswith("-") else last
            continue
        indent = len(match["indent"])
        stack = [(i, k) for i, k in stack if i < indent]
        name = ".".join([prefix, *(k for _, k in stack), match["key"]]).strip(".")
        stack.append((indent, match["key"]))
        comments[name] = _comment(match["rest"])
        last = name
    return comments


def _comment(rest: str) -> str:
    """The comment of a `key: value  # comment` line's remainder (a `#` inside quotes is data)."""
    quote = None
    for i, char in enumerate(rest):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None and (i == 0 or rest[i - 1] in " \t"):
            return rest[i + 1 :].strip()
    return ""


def group_comments(group: Group) -> dict[str, str]:
    """Every commented key of the group's YAML files (the first file that comments a key wins;
    train.yaml's and eval.yaml's keys are read under their own top-level names)."""
    found: dict[str, str] = {}
    for pattern in group.files:
        for path in sorted(CONF.glob(pattern)):
            top_level = path.parent == CONF
            for name, text in yaml_comments(path, "" if top_level else group.prefix).items():
                if name.startswith(group.prefix + ".") and text and name not in found:
                    found[name] = text
    return found


def schema_keys(model: type[BaseModel], prefix: str) -> list[tuple[str, FieldInfo]]:
    """(dotted name, field) of every leaf key of `model`, nested models expanded."""
    keys = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}.{name}"
        if _is_model(field.annotation):
            keys += schema_keys(field.annotation, dotted)
        else:
            keys.append((dotted, field))
    return keys


def group_keys(group: Group, defaults: dict[str, Any]) -> list[Key]:
    """The group's keys; `defaults` maps a command to its composed config (`default_configs`).
    A key that only some presets define says which: the others do not use it
    (config/added_keys.py refuses it there)."""
    comments = group_comments(group)
    composed = defaults["eval" if group.prefix == "eval" else "train"]
    return [
        Key(
            name,
            _type(field.annotation),
            _default(field, OmegaConf.select(composed, name, default=MISSING)),
            _allowed(field),
            comments.get(name, "") + _only_in(group, name),
        )
        for name, field in group_schema_keys(group)
    ]


def group_schema_keys(group: Group) -> list[tuple[str, FieldInfo]]:
    """The keys of the group's model(s); a key two models share (arith's and word_math's
    `eval_size`) once, as the first one types it."""
    models = group.model if isinstance(group.model, tuple) else (group.model,)
    keys: dict[str, FieldInfo] = {}
    for model in models:
        for name, field in schema_keys(model, group.prefix):
            keys.setdefault(name, field)
    return list(keys.items())


def _only_in(group: Group, name: str) -> str:
    options = group_options(group)
    path = name.split(".")[1:]
    if _has_key(_train_yaml().get(group.prefix), path):
        return ""  # conf/train.yaml sets it beside whichever preset: every preset has it
    users = [o for o in options if _has_key(preset_keys(group.prefix, o), path)]
    if not options or len(users) == len(options):
        return ""
    return f" (only with {', '.join(f'{group.prefix}={u}' for u in users) or 'a plugin'})"


@functools.cache
def _train_yaml() -> dict[str, Any]:
    node = OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"))
    return node if isinstance(node, dict) else {}  # type: ignore[return-value]


def _has_key(tree: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def top_level_keys(command: str, defaults: dict[str, Any]) -> list[Key]:
    """The keys outside any group (`seed`, `plugins`, ...) of `tepo train` or `tepo eval`."""
    model = {"train": TrainConfig, "eval": EvalConfig}[command]
    comments = yaml_comments(CONF / f"{command}.yaml")
    return [
        Key(
            name,
            _type(field.annotation),
            _default(field, OmegaConf.select(defaults[command], name, default=MISSING)),
            _allowed(field),
            comments.get(name, ""),
        )
        for name, field in model.model_fields.items()
        if not _is_model(field.annotation)
    ]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def default_configs() -> dict[str, Any]:
    """What `tepo train` and `tepo eval` compose with no overrides: the defaults a user gets."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
        return {name: compose(config_name=name) for name in ("train", "eval")}


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    if origin is Literal:
        return "choice"
    if origin in (typing.Union, types.UnionType):
        names = [_type(arg) for arg in typing.get_args(annotation)]
        return " or ".join(dict.fromkeys("null" if n == "NoneType" else n for n in names))
    if origin is not None:
        args = ", ".join(_type(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo, composed: Any) -> str:
    """The composed config's value (what a run gets), else the schema's default."""
    if composed is not MISSING:
        return _yaml(OmegaConf.to_object(composed) if OmegaConf.is_config(composed) else composed)
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "—"
    return _yaml(value)


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def _allowed(field: FieldInfo) -> str:
    """Choices (Literal members) and bounds (ge/gt/le/lt), as the validator enforces them."""
    parts = [_yaml(choice) for choice in _choices(field.annotation)]
    for constraint in [*field.metadata, *_member_constraints(field.annotation)]:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(constraint, attr, None)
            if bound is not None:
                parts.append(f"{sign} {bound}")
        if getattr(constraint, "min_length", None):
            parts.append(f"length ≥ {constraint.min_length}")
    return ", ".join(parts)


def _member_constraints(annotation: Any) -> list[Any]:
    """The constraints of a union's `Annotated[int, Field(ge=...)]` members."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    found = []
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is typing.Annotated:
            for extra in typing.get_args(member)[1:]:
                found += getattr(extra, "metadata", [extra])
    return found


def _choices(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Annotated, typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        members = args[:1] if origin is typing.Annotated else args
        found = [choice for arg in members for choice in _choices(arg)]
        if origin is not typing.Annotated and bool in args and found:
            found += [True, False]
        return found
    return []


def group_options(group: Group) -> list[str]:
    """The group's choices on the command line (`algo=dapo`): its YAML files, `_base` excluded."""
    if group.options is None:
        return []
    return sorted(p.stem for p in (CONF / group.options).glob("*.yaml") if p.stem[0] != "_")


def render() -> str:
    """The whole page."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by tepo_cli/reference_page.py (the docs build runs it): do not edit -->",
        "",
        "Every key `tepo train` and `tepo eval` accept, by group. Set any of them on the command",
        "line (`tepo train trainer.lr=3e-6 rollout.n=16`) or pick a group's preset",
        "(`tepo train algo=dapo rollout=vllm`). Type, default and allowed values come from the",
        "typed schema that checks every run at start-up, the default is what a plain `tepo train`",
        "(`tepo eval` for `eval.*`) composes, and the meaning is the comment beside the key in its",
        "YAML file under `conf/`. A preset may set other values than these defaults: its file says",
        "which.",
        "",
    ]
    defaults = default_configs()
    for command in ("train", "eval"):
        lines += [f"## Top-level keys of `tepo {command}`", ""]
        lines += _table(top_level_keys(command, defaults))
    for group in GROUPS:
        lines += [f"## `{group.prefix}`: {group.title}", ""]
        options = group_options(group)
        if options:
            choices = ", ".join(f"`{o}`" for o in options)
            lines += [f"Presets (`{group.prefix}=NAME`, files `conf/{group.options}/`): {choices}."]
            lines.append("")
        lines += _table(group_keys(group, defaults))
    return "\n".join(lines)


def _table(keys: list[Key]) -> list[str]:
    lines = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for key in keys:
        cells = [f"`{key.name}`", key.type, f"`{key.default}`", key.allowed, key.comment]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def uncommented() -> list[str]:
    """Keys with no comment in any of their group's YAML files."""
    defaults = default_configs()
    keys = [key for group in GROUPS for key in group_keys(group, defaults)]
    keys += [key for command in ("train", "eval") for key in top_level_keys(command, defaults)]
    return [key.name for key in keys if not key.comment]


def write(path: Path = PAGE) -> bool:
    """Write the page if it changed; True when it did."""
    text = render()
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def on_pre_build(config: Any, **_: Any) -> None:
    """The mkdocs hook (mkdocs.yml `hooks:`): the page is rendered anew before every build."""
    write()
