"""Nested config dictionaries as one level of dotted keys (`trainer.lr`), as configs are shown in
reports and recorded by experiment trackers."""

from __future__ import annotations

from typing import Any


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"trainer": {"lr": 1e-5}}` -> `{"trainer.lr": 1e-5}`; lists and empty dicts are leaves."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
