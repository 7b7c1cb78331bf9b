"""Algo configs from a preset name, a mapping or an `AlgoConfig`, plus knob overrides (§0.7)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tepo_cli.algos.algo_config import AlgoConfig

AlgoSpec = str | Mapping[str, Any] | DictConfig | AlgoConfig


def preset_names() -> tuple[str, ...]:
    """The presets shipped in conf/algo/ (the package `tepo_cli.conf`); `_base.yaml`, which holds
    every knob's default, is not one."""
    folder = files("tepo_cli.conf") / "algo"
    names = (p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return tuple(sorted(n for n in names if not n.startswith("_")))


@cache
def _load_preset(name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A preset's knobs; a preset may start from another one, as Hydra composes it:
    `defaults: [other, _self_]` takes every knob of `conf/algo/<other>.yaml`, then its own; an entry
    with a package (`file@_global_.reward`) sets another group and is not read here."""
    path = files("tepo_cli.conf") / "algo" / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(preset_names())
        raise ValueError(f"algo: no preset {name!r} in conf/algo/; presets: {known}")
    if name in seen:
        raise ValueError(f"algo presets include each other in a loop: {' -> '.join(seen)}")
    config = OmegaConf.create(path.read_text(encoding="utf-8"))
    defaults = config.pop("defaults", [])
    merged = OmegaConf.create()
    for entry in defaults:
        if entry == "_self_":
            merged = OmegaConf.merge(merged, config)
        elif isinstance(entry, str) and "@" in entry:
            continue  # values for another group (DAPO's ±1 goes to `reward`), not objective knobs
        elif isinstance(entry, str):
            merged = OmegaConf.merge(merged, _load_preset(entry, (*seen, name)))
        else:
            raise ValueError(f"algo preset {name!r}: defaults may name presets only, got {entry}")
    if "_self_" not in defaults:
        merged = OmegaConf.merge(merged, config)
    data = OmegaConf.to_container(merged, resolve=True)
    if not isinstance(data, dict):
        raise ValueError(f"algo preset {name!r} is not a mapping of knobs")
    return data


def load_preset(name: str) -> dict[str, Any]:
    """The knobs of preset `name` (conf/algo/<name>.yaml) as a plain dict (a fresh copy)."""
    return copy.deepcopy(_load_preset(name))


def resolve_algo(algo: AlgoSpec, overrides: Mapping[str, Any] | None = None) -> AlgoConfig:
    """A validated `AlgoConfig` from `algo` with `overrides` (any AlgoConfig knob) applied.

    Overriding `unit` to token or sequence without giving `k` drops the preset's block size (so
    `policy_loss("mpo_disjoint", ..., unit="token")` means what it says); a `k` override alone does not
    change the unit: pass `unit="block"` with it for an objective whose unit is not a block.
    """
    if isinstance(algo, AlgoConfig):
        data = algo.model_dump()
    elif isinstance(algo, str):
        data = load_preset(algo)
    elif isinstance(algo, DictConfig):
        data = OmegaConf.to_container(algo, resolve=True)  # type: ignore[assignment]
    elif isinstance(algo, Mapping):
        data = dict(algo)
    else:
        raise ValueError(
            "algo must be a preset name, a dict / DictConfig of knobs or an AlgoConfig, "
            f"got {type(algo).__name__}"
        )
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(AlgoConfig.model_fields))
    if unknown:
        raise ValueError(
            f"unknown override {', '.join(unknown)}; the knobs are: "
            f"{', '.join(AlgoConfig.model_fields)}, plus num_tokens, num_seqs, max_len"
        )
    if overrides.get("unit", "block") != "block" and "k" not in overrides:
        data["k"] = None
    data.update(overrides)
    if not data.get("name"):
        raise ValueError("algo needs a 'name': the registered policy loss to use (e.g. 'grpo')")
    return AlgoConfig.model_validate(data)
