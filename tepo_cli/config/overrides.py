"""Check command-line override keys before Hydra composes, for a message that lists what exists.

Hydra's own error for `trainer.lrr=1` says only that the key is "not in struct"; this one names
the keys allowed at that level and the closest match. A group's choice (`algo=foo`) is checked
here too (config/group_choices.py); values are checked later, by the schema.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from typing import Any

from pydantic import BaseModel

from tepo_cli.config.eval_schema import EvalConfig
from tepo_cli.config.group_choices import check_group_choice
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.errors import ConfigError

SCHEMAS: dict[str, type[BaseModel]] = {"train": TrainConfig, "eval": EvalConfig}
# `algo.block_weights=decay:0.06,0.8`: one value whose comma Hydra would read as a list or sweep.
_DECAY_VALUE = re.compile(r"^(\+{0,2}(?:[\w.]+\.)?block_weights)=(decay:[^,'\"\s]+,[^,'\"\s]+)$")


def quote_weight_specs(arguments: list[str]) -> list[str]:
    """Quote a lone `block_weights=decay:b,l` value for Hydra, so MPO's weights are typed as the
    paper writes them. In a sweep, quote each value yourself: `algo.block_weights="'decay:0.06,0.8'",uniform`."""
    quoted = []
    for argument in arguments:
        match = _DECAY_VALUE.match(argument)
        quoted.append(f"{match.group(1)}='{match.group(2)}'" if match else argument)
    return quoted


def check_override_keys(config_name: str, arguments: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    candidates = [a for a in arguments if "=" in a and not a.startswith("-")]
    parser = OverridesParser.create()
    try:
        overrides = parser.parse_overrides(candidates)
    except HydraException:
        for argument in candidates:  # the one Hydra's grammar refuses, named with how to write it
            try:
                parser.parse_overrides([argument])
            except HydraException as error:
                raise ConfigError(_malformed(argument, error)) from None
        return
    groups = config_groups()
    for override in overrides:
        key = override.key_or_group
        if override.is_hydra_override() or override.is_add() or override.is_force_add():
            continue
        if key in groups and override.package is None and not override.is_delete():
            check_group_choice(key, _choice_names(override.value()), arguments)
            continue
        if override.package is not None or key in groups:
            continue
        _check_path(SCHEMAS[config_name], key.split("."), config_name)


def _malformed(argument: str, error: Exception) -> str:
    """A paragraph for an override Hydra's grammar cannot read (`benchmark.path=~/data`): its
    parser's first line, and the quoting that passes any value through."""
    key, _, value = argument.partition("=")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"{argument!r} is not an override Hydra can read ({reason}). Put the value in quotes, "
        f"inside the shell's: \"{key}='{value}'\" (a '~', a second '=', or an unmatched bracket "
        "or quote needs them). Nothing was run."
    )


def _choice_names(value: object) -> list[str]:
    """The preset names an override selects: one, or each of a sweep's (`algo=grpo,mpo`); none
    for a glob, a range or null, which Hydra checks itself."""
    from hydra.core.override_parser.types import ChoiceSweep

    if isinstance(value, str):
        return [value]
    if isinstance(value, ChoiceSweep):
        return [v for v in value.list if isinstance(v, str)]
    return []


def config_groups() -> set[str]:
    conf = resources.files("tepo_cli.conf")
    return {
        entry.name for entry in conf.iterdir() if entry.is_dir() and not entry.name.startswith("_")
    }


def _own_knobs(group: str) -> set[str]:
    """The keys any preset of `group` sets (its presets' own knobs: word_math's `steps`, ...)."""
    from tepo_cli.config.added_keys import preset_keys

    folder = resources.files("tepo_cli.conf").joinpath(group)
    names = [e.name[: -len(".yaml")] for e in folder.iterdir() if e.name.endswith(".yaml")]
    return {key for name in names for key in preset_keys(group, name)}


def _check_path(model: type[BaseModel], parts: list[str], config_name: str) -> None:
    current: Any = model
    for depth, part in enumerate(parts):
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return  # a free-form mapping (e.g. deepspeed.extra): any key is allowed
        own = _own_knobs(parts[0]) if current.model_config.get("extra") == "allow" else set()
        if part in own:
            return  # a preset's own knob (benchmark.steps): its own options model checks it
        if part not in current.model_fields:
            parent = ".".join(parts[:depth])
            allowed = sorted({*current.model_fields, *own})
            close = difflib.get_close_matches(part, allowed, n=1)
            hint = f" Did you mean '{'.'.join([*parts[:depth], close[0]])}'?" if close else ""
            scope = f"under '{parent}'" if parent else "at the top level"
            raise ConfigError(
                f"unknown key '{'.'.join(parts)}' in `tepo {config_name}`; the keys allowed {scope} "
                f"are: {', '.join(allowed)}.{hint}"
            )
        current = current.model_fields[part].annotation
