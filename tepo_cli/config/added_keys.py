"""Refuse `+group.key=value` where the chosen preset of that group does not use `key`.

Hydra answers a key that the chosen preset's YAML lacks with "use +key", and `+key=value` is
then accepted, also where it means nothing: `benchmark=arith +benchmark.hub_id=x` loads no hub
data, `rollout=hf +rollout.engine.kv_cache_gib=4` sizes no cache. Each group's YAML documents the
knobs its preset uses (docs/design.md), so a key absent from it (and from the files it builds on)
is one the preset ignores; the schema alone cannot tell, as it is the union of all presets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from omegaconf import OmegaConf

from tepo_cli.core.errors import ConfigError


def preset_keys(group: str, option: str) -> dict[str, Any]:
    """The option's YAML merged over the files its `defaults` list names (same group)."""
    folder = resources.files("tepo_cli.conf").joinpath(group)
    node = OmegaConf.load(str(folder.joinpath(f"{option}.yaml")))
    # Only the group's own files count: an entry that writes into another package
    # (`/reward_plus_minus_one@_global_.reward` in algo/dapo.yaml) sets no key of this group.
    defaults = [
        entry
        for entry in node.pop("defaults", None) or ["_self_"]
        if isinstance(entry, str) and not entry.startswith("/") and "@" not in entry
    ]
    if "_self_" not in defaults:
        defaults.append("_self_")
    parts = [node if entry == "_self_" else preset_keys(group, entry) for entry in defaults]
    merged = OmegaConf.to_container(OmegaConf.merge(*parts))
    assert isinstance(merged, dict)
    return merged  # type: ignore[return-value]


def _has(tree: Mapping[str, Any], path: Sequence[str]) -> bool:
    """Whether the preset has the key, or leaves an empty mapping on its way open for any keys
    (`deepspeed.extra: {}`, the raw DeepSpeed entries `+deepspeed.extra.KEY=VALUE` adds)."""
    node: Any = tree
    for part in path:
        if isinstance(node, Mapping) and not node and node is not tree:
            return True  # a free-form mapping: whatever goes below it is read as given
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def check_added_keys(overrides: Sequence[str], choices: Mapping[str, str | None]) -> None:
    """`overrides`: the job's command-line overrides as Hydra recorded them; `choices`: the
    group options chosen (hydra.runtime.choices)."""
    for override in overrides:
        if not override.startswith("+") or override.startswith("++") or "=" not in override:
            continue
        key = override[1:].split("=", 1)[0]
        group, _, rest = key.partition(".")
        option = choices.get(group)
        if not rest or option is None or "/" in group:
            continue
        if _has(preset_keys(group, option), rest.split(".")):
            continue
        users = [
            name
            for name in _options(group)
            if name != option and _has(preset_keys(group, name), rest.split("."))
        ]
        where = (
            f"the presets that use it: {', '.join(f'{group}={u}' for u in users)}"
            if users
            else "no preset of the group uses it"
        )
        raise ConfigError(
            f"{override}: {group}={option} does not use {key} (conf/{group}/{option}.yaml has no "
            f"such key, so nothing would read it); {where}. Choose one of those, or drop the "
            f"override. Nothing was run."
        )


def _options(group: str) -> list[str]:
    folder = resources.files("tepo_cli.conf").joinpath(group)
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml") and not entry.name.startswith("_")
    )
