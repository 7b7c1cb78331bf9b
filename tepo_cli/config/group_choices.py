"""Check a config group's choice (`algo=foo`, `benchmark=gsm9k`, `env=myenv`) before Hydra composes.

Hydra's own error for an unknown choice is "Could not find 'algo/foo'" followed by a list that
includes the internal `_base`, the config search path and a hint about HYDRA_FULL_ERROR, with exit
status 1. This says it in one paragraph: the group, its public choices, the closest one, and how a
choice of one's own is added (a YAML under a `hydra.searchpath` directory; for an environment,
`env.name`, since a plugin environment is registered by name, not as a YAML preset).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from tepo_cli.core.errors import ConfigError

EXTENDING = "docs/guides/extending.md"
# How a choice of one's own joins each group; the rest: a YAML under one's own config directory.
_OWN = {
    "algo": (
        "an objective of your own is registered with register_policy_loss in a file listed in "
        "plugins=[...] and given a preset my_conf/algo/NAME.yaml, found with "
        f"hydra.searchpath=[file://my_conf] ({EXTENDING})"
    ),
    "benchmark": (
        "a benchmark of your own is registered with register_benchmark in a file listed in "
        "plugins=[...] and given a preset my_conf/benchmark/NAME.yaml, found with "
        f"hydra.searchpath=[file://my_conf] ({EXTENDING})"
    ),
    "env": (
        "an environment of your own (a class registered with register_environment in a file "
        "listed in plugins=[...]) is chosen with env.name={name}, not env={name}: env= picks one "
        "of the presets listed, whose other keys it keeps, e.g. `tepo train plugins=[guess.py] "
        "env.name=higher_or_lower env.max_turns=3` (docs/guides/environments.md)"
    ),
}


def check_group_choice(group: str, names: Iterable[str], arguments: list[str]) -> None:
    """Raise ConfigError naming the first of `names` that no config directory holds for `group`.
    Silent when a search path cannot be read here (a `pkg://` one that does not import): Hydra
    then reports it."""
    roots = _roots(arguments)
    if roots is None:
        return
    for name in names:
        if "/" in name or any(_has(root, group, name) for root in roots):
            continue
        choices = sorted({c for root in roots for c in _choices(root, group)})
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        own = _OWN.get(
            group,
            f"a preset of your own is a file my_conf/{group}/NAME.yaml, found with "
            f"hydra.searchpath=[file://my_conf] ({EXTENDING})",
        ).replace("{name}", name)
        raise ConfigError(
            f"{group}={name}: there is no {group} preset '{name}'; the choices of {group} are: "
            f"{', '.join(choices)}.{hint} To add one: {own}."
        )


def _roots(arguments: list[str]) -> list[Traversable] | None:
    """The config directories Hydra will search: tepo's, then the command line's searchpath and
    --config-dir; None when one of them cannot be listed here."""
    roots: list[Traversable] = [resources.files("tepo_cli.conf")]
    for entry in _search_entries(arguments):
        if entry.startswith("file://"):
            roots.append(Path(entry.removeprefix("file://")).expanduser())
        elif entry.startswith("pkg://"):
            try:
                roots.append(resources.files(entry.removeprefix("pkg://").replace("/", ".")))
            except (ModuleNotFoundError, TypeError, ValueError):
                return None
        else:
            return None
    return roots


def _search_entries(arguments: list[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    entries: list[str] = []
    for index, argument in enumerate(arguments):
        if argument in ("-cd", "--config-dir") and index + 1 < len(arguments):
            entries.append(f"file://{arguments[index + 1]}")
        elif argument.startswith("--config-dir="):
            entries.append(f"file://{argument.split('=', 1)[1]}")
        elif argument.lstrip("+").startswith("hydra.searchpath="):
            try:
                [override] = OverridesParser.create().parse_overrides([argument])
            except HydraException:
                continue
            value = override.value()
            entries.extend(str(v) for v in (value if isinstance(value, list) else [value]))
    return entries


def _has(root: Traversable, group: str, name: str) -> bool:
    return (root / group / f"{name}.yaml").is_file()


def _choices(root: Traversable, group: str) -> list[str]:
    folder = root / group
    if not folder.is_dir():
        return []
    return [
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml") and not entry.name.startswith("_")
    ]
